"""WISE (PKU-YuanGroup/WISE): the prompt files, the three-score judge, WiScore by category.

Prompt files: the published JSON arrays (`cultural_common_sense.json`, `spatio-temporal_reasoning.json`,
`natural_science.json`), one object per prompt:

    {"prompt_id": 701, "Prompt": "...", "Explanation": "...", "Category": "Biology", "Subcategory": "State"}

An item's id is its `prompt_id`; its category is the one the published `Calculate.py` gives that id
(`rewards.wise.CATEGORY_RANGES`). A file whose `Category` disagrees with those ranges (the later "verified"
prompt set numbers its prompts differently) is refused rather than scored in the wrong category.

Scoring (`rewards.wise`): WiScore = (0.7·C + 0.2·R + 0.1·A) / 2 per prompt, averaged per category, and the
weighted overall over the six categories. As in the published scripts, a prompt without an image is not judged
(the run is then incomplete and has no overall), and an unreadable judge reply is 999 (the run is then invalid).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ranger_jax.clients import chat
from ranger_jax.evals import agent as agent_lib
from ranger_jax.evals import base, store
from ranger_jax.evals import items as items_lib
from ranger_jax.rewards import wise as wise_judge

NAME = "wise"
EXPORT_DIR = "wise"
IMAGES_DIR = "images"
# the published files' `Category` values, by the prefix that names each scoring category
CATEGORY_NAMES = {"cultur": "CULTURE", "time": "TIME", "space": "SPACE", "biolog": "BIOLOGY", "physic": "PHYSICS",
                  "chemi": "CHEMISTRY"}


def _category(path: Path, where: str, row: Mapping[str, Any], prompt_id: int) -> str:
    category = wise_judge.category_of(prompt_id)
    if category is None:
        raise items_lib.ItemFormatError(path, where, "prompt_id", f"{prompt_id} is outside the published WISE "
                                                                  f"ranges {wise_judge.CATEGORY_RANGES}")
    stated = str(row.get("Category") or "").strip().lower()
    named = next((name for prefix, name in CATEGORY_NAMES.items() if stated.startswith(prefix)), None)
    if stated and named != category:
        raise items_lib.ItemFormatError(path, where, "Category", f"{row.get('Category')!r} disagrees with prompt_id "
                                                                 f"{prompt_id}, which the published scorer counts "
                                                                 f"as {category} (is this another WISE prompt set?)")
    return category


def _item(path: Path, where: str, raw: Any) -> items_lib.Item:
    row = items_lib.object_row(path, where, raw)
    prompt_id = row.get("prompt_id")
    if isinstance(prompt_id, bool) or not isinstance(prompt_id, int):
        raise items_lib.ItemFormatError(path, where, "prompt_id", f"must be an integer, got {prompt_id!r:.60}")
    return items_lib.Item(id=str(prompt_id), prompt=items_lib.text_field(path, where, row, "Prompt"),
                          category=_category(path, where, row, prompt_id),
                          subcategory=items_lib.text_field(path, where, row, "Subcategory"),
                          explanation=items_lib.text_field(path, where, row, "Explanation"),
                          meta={"prompt_id": prompt_id, "Category": row.get("Category")})


def load_items(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[items_lib.Item]:
    """The items of one or more WISE prompt files, in file order (prompt ids unique across them).

    Raises:
        FileNotFoundError: no such file.
        ItemFormatError: a malformed file or row (naming the file, the row and the field), or a repeated id.
    """
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    found, seen = [], {}
    for path in map(Path, paths):
        for where, row in items_lib.read_rows(path):
            item = _item(path, where, row)
            if item.id in seen:
                raise items_lib.ItemFormatError(path, where, "prompt_id",
                                                f"{item.id} repeats the one of {seen[item.id]}")
            seen[item.id] = f"{path} {where}"
            found.append((where, item))
    return items_lib.unique(Path(paths[0]) if paths else Path("."), found)


def _row(item: items_lib.Item, record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The item's row of the published `*_scores.jsonl` (None when it was not judged: no image)."""
    scores = record.get("scores") or {}
    if not scores.get("judged"):
        return None
    return {"prompt_id": item.meta["prompt_id"], "Subcategory": item.subcategory,
            **{key: scores[key] for key in wise_judge.SCORE_KEYS}}


def headline(scores: Mapping[str, Any]) -> dict[str, float | None]:
    """WiScore per category (None for one without judged prompts), then overall (None unless complete and valid)."""
    result = scores["wiscore"]
    return {**{c.title(): result[c]["wiscore"] if c in result else None for c in wise_judge.CATEGORIES},
            "Overall": result["overall"]["wiscore"]}


class Wise:
    """The WISE adapter (see the module docstring).

    Args:
        judge_client: the judge model's chat client (published: gpt-4o-2024-05-13); None for scoring and
            reports only.
        prompt_path: a template file (with `{prompt}` and `{explanation}`) replacing the packaged protocol.
        t2i_suffix: appended to prompts drawn without an answer's references.
    """

    name = NAME

    def __init__(self, judge_client: chat.ChatClient | None, *, prompt_path: str | os.PathLike | None = None,
                 t2i_suffix: str = ""):
        self.client, self.t2i_suffix = judge_client, t2i_suffix
        self.judge = wise_judge.WiseJudge(judge_client, prompt_path=prompt_path) \
            if judge_client is not None else None

    async def ajudge(self, item: items_lib.Item, image: bytes | None, agent: agent_lib.AgentResult | None,
                     folder: Path) -> base.Judged:
        """Consistency, realism and aesthetic quality of the generated image (not judged without one)."""
        if image is None:
            return base.Judged(scores={"judged": False}, judge={})
        verdict = await self.judge.ajudge(item.prompt, item.explanation, image)
        scores = {"judged": True, "consistency": verdict.consistency, "realism": verdict.realism,
                  "aesthetic_quality": verdict.aesthetic_quality, "wiscore": verdict.wiscore}
        return base.Judged(scores=scores, judge={"evaluation": verdict.evaluation},
                           reward=verdict.wiscore or 0.0, error=verdict.error)

    def rows(self, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The published score rows of the judged items, by prompt id."""
        rows = [_row(item, records[item.id]) for item in items if item.id in records]
        return sorted((row for row in rows if row is not None), key=lambda row: row["prompt_id"])

    def summarize(self, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """`rewards.wise.aggregate` over the judged items (every item's id expected), plus the mean WiScore per
        subcategory (informational)."""
        rows = self.rows(items, records)
        by_subcategory: dict[str, list[float]] = collections.defaultdict(list)
        for row in rows:
            if wise_judge.FAILED not in (row[k] for k in wise_judge.SCORE_KEYS):
                by_subcategory[row["Subcategory"]].append(
                    wise_judge.wiscore(*(row[k] for k in wise_judge.SCORE_KEYS)))
        return {"wiscore": wise_judge.aggregate(rows, expected_ids=[item.meta["prompt_id"] for item in items]),
                "by_subcategory": {k: {"wiscore": sum(v) / len(v), "count": len(v)}
                                   for k, v in sorted(by_subcategory.items())},
                "num_items": len(items), "num_judged": len(rows)}

    def table(self, summary: Mapping[str, Any], label: str) -> str:
        """WiScore per category and overall (the published leaderboard's columns)."""
        cells = ["–" if value is None else f"{value:.2f}" for value in headline(summary).values()]
        lines = ["| " + " | ".join([label, *(c.title() for c in wise_judge.CATEGORIES), "Overall"]) + " |",
                 "|---" * (len(wise_judge.CATEGORIES) + 2) + "|", "| WiScore | " + " | ".join(cells) + " |", ""]
        result = summary["wiscore"]
        notes = []
        if result["missing_ids"]:
            notes.append(f"incomplete: {len(result['missing_ids'])} prompts not judged (no image): "
                         f"{result['missing_ids'][:10]}")
        if result["failed_ids"]:
            notes.append(f"invalid: {len(result['failed_ids'])} judge replies unreadable (999): "
                         f"{result['failed_ids'][:10]}")
        lines.append("Overall WiScore is given only for a complete, valid run over all six categories"
                     + (f"; {'; '.join(notes)}." if notes else "."))
        return "\n".join(lines)

    def bars(self, summary: Mapping[str, Any]) -> dict[str, dict[str, float]]:
        """WiScore by category, and by subcategory."""
        result = summary["wiscore"]
        charts = {"WiScore by category": {c.title(): result[c]["wiscore"] for c in wise_judge.CATEGORIES
                                          if c in result}}
        if summary["by_subcategory"]:
            charts["WiScore by subcategory"] = {k: v["wiscore"] for k, v in summary["by_subcategory"].items()}
        return charts

    def export(self, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]],
               run_dir: Path) -> list[Path]:
        """The published layout: `wise/images/{prompt_id}.png`, and the scores as `wise/scores.jsonl`."""
        out_dir = run_dir / EXPORT_DIR
        store.copy_images(items, records, run_dir, out_dir / IMAGES_DIR, lambda item: f"{item.meta['prompt_id']}.png")
        path = out_dir / "scores.jsonl"
        store.write_jsonl(path, self.rows(items, records))
        return [path]

    async def aclose(self) -> None:
        """Closes the judge client."""
        if self.client is not None:
            await self.client.aclose()
