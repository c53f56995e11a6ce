"""Savanna (the Ranger paper's benchmark): item files, the search and generation judges, Table 1's layout.

Item file: a JSON array or JSON lines, one object per prompt:

    {"id": "ent-film-001", "prompt": "...", "domain": "Entertainment", "subcategory": "Film & TV",
     "target": "what the prompt is about (optional)", "gt_images": ["gt/ent-film-001_0.jpg", ...],
     "context_criteria": ["the costume is shown on set", ...], "today": "2026-05-01"}

`domain` is one of `DOMAINS` (any case); `gt_images` (or a single `gt_image`) are paths relative to the file's
folder or URLs; `context_criteria` and `today` are optional. Errors name the file, the line or row and the field.

Scoring (UNOFFICIAL: the paper defines its judges but publishes neither code nor prompts; see `rewards.savanna`):

- search score: the share of prompts whose selected references pass the binary search judge (a prompt without
  any reference fails without a judge call; with no policy there is no search score);
- generation score: the share of prompts whose generated image passes the generation judge (identity "exact" and
  every context criterion satisfied); the graded score (identity tier × share of criteria met) is reported too.

A failed stage (no image, a judge that gave no verdict) counts as not passed, with its reason in the record.
Scores are ×100 by domain, then the mean over all prompts, as columns of the paper's Table 1.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ranger_jax.clients import chat
from ranger_jax.evals import agent as agent_lib
from ranger_jax.evals import base, store
from ranger_jax.evals import items as items_lib
from ranger_jax.rewards import judge as judge_lib
from ranger_jax.rewards import savanna as savanna_judges

NAME = "savanna"
DOMAINS = ("Entertainment", "Sports", "Fashion", "Products", "Culture")
SHORT = {"Entertainment": "Ent.", "Sports": "Spo.", "Fashion": "Fas.", "Products": "Pro.", "Culture": "Cul.",
         "Overall": "Avg."}
NO_TARGET = "(not described; the ground-truth images show it)"
EXPORT_FILE = "savanna_results.jsonl"


def _domain(path: Path, where: str, row: Mapping[str, Any]) -> str:
    value = items_lib.text_field(path, where, row, "domain")
    match = next((d for d in DOMAINS if d.lower() == value.strip().lower()), None)
    if match is None:
        raise items_lib.ItemFormatError(path, where, "domain", f"{value!r} is not one of {list(DOMAINS)}")
    return match


def _today(path: Path, where: str, row: Mapping[str, Any]) -> str | None:
    value = row.get("today")
    if value is None:
        return None
    try:
        datetime.date.fromisoformat(value)
    except (TypeError, ValueError) as err:
        raise items_lib.ItemFormatError(path, where, "today", f"must be a YYYY-MM-DD date, got {value!r:.40}") from err
    return value


def _item(path: Path, where: str, raw: Any) -> items_lib.Item:
    row = items_lib.object_row(path, where, raw)
    item_id = row.get("id")
    if isinstance(item_id, bool) or not isinstance(item_id, (str, int)) or not str(item_id).strip():
        raise items_lib.ItemFormatError(path, where, "id", f"must be a string or an integer, got {item_id!r:.60}")
    key = "gt_images" if "gt_images" in row else "gt_image"
    truth = items_lib.string_list(path, where, row, key)
    if not truth:
        raise items_lib.ItemFormatError(path, where, "gt_images", "needs at least one ground-truth image")
    return items_lib.Item(
        id=str(item_id), prompt=items_lib.text_field(path, where, row, "prompt"), category=_domain(path, where, row),
        subcategory=items_lib.text_field(path, where, row, "subcategory", required=False),
        target=items_lib.text_field(path, where, row, "target", required=False),
        ground_truth=tuple(items_lib.resolve(t, path.parent) for t in truth),
        criteria=items_lib.string_list(path, where, row, "context_criteria"), today=_today(path, where, row))


def load_items(path: str | os.PathLike) -> list[items_lib.Item]:
    """The items of a Savanna item file (format in the module docstring).

    Raises:
        FileNotFoundError: no such file.
        ItemFormatError: a malformed file or row (naming the file, the line or row and the field).
    """
    path = Path(path)
    return items_lib.unique(path, [(where, _item(path, where, row)) for where, row in items_lib.read_rows(path)])


def _rate(values: list[bool]) -> float | None:
    return 100.0 * sum(values) / len(values) if values else None


def headline(scores: Mapping[str, Any]) -> dict[str, float | None]:
    """Table 1's columns of a run: search, then generation score ×100 by domain and on average."""
    return {f"{kind.title()} {SHORT[column]}": scores[kind][column]
            for kind in ("search", "generation") for column in (*DOMAINS, "Overall")}


class Savanna:
    """The Savanna benchmark adapter (see the module docstring).

    Args:
        judge_client: the judge model's chat client (None: scoring and reports only).
        search_prompt / generation_prompt: rubric files replacing the packaged Savanna rubrics.
        max_attempts: judge calls before an unusable reply counts as a failed judge call.
        t2i_suffix: appended to prompts drawn without an answer's references.
    """

    name = NAME

    def __init__(self, judge_client: chat.ChatClient | None, *, search_prompt: str | os.PathLike | None = None,
                 generation_prompt: str | os.PathLike | None = None,
                 max_attempts: int = judge_lib.DEFAULT_MAX_ATTEMPTS, t2i_suffix: str = ""):
        self.client, self.t2i_suffix = judge_client, t2i_suffix
        self.search = self.generation = None
        if judge_client is not None:
            self.search = savanna_judges.SearchJudge(judge_client, prompt_path=search_prompt,
                                                     max_attempts=max_attempts)
            self.generation = savanna_judges.GenerationJudge(judge_client, prompt_path=generation_prompt,
                                                             max_attempts=max_attempts)

    async def _search(self, item: items_lib.Item, agent: agent_lib.AgentResult, folder: Path
                      ) -> tuple[dict[str, Any], str | None]:
        references = {ref["img_id"]: str(folder / ref["file"]) for ref in agent.references if ref.get("file")}
        if not references:
            return {"passed": False, "rationale": "no reference image was selected"}, None
        try:
            verdict = await self.search.ajudge_search(item.prompt, item.target or NO_TARGET, references,
                                                      answer_text=agent.answer_text, ground_truth=item.ground_truth)
        except judge_lib.JudgeError as err:
            return {"passed": False, "rationale": ""}, f"search judge: {err}"
        value = verdict.value
        return {"passed": value.passed, "matching_reference": value.matching_reference,
                "rationale": value.rationale, "raw": verdict.raw}, None

    async def _generation(self, item: items_lib.Item, image: bytes) -> tuple[dict[str, Any], str | None]:
        try:
            verdict = await self.generation.ajudge_generation(item.prompt, item.target or NO_TARGET, image,
                                                              criteria=item.criteria, ground_truth=item.ground_truth)
        except judge_lib.JudgeError as err:
            return {"passed": False, "score": 0.0, "identity_tier": None}, f"generation judge: {err}"
        value = verdict.value
        return {"passed": value.passed, "score": value.score, "identity_tier": value.identity_tier,
                "context": [{"criterion": c, "satisfied": ok} for c, ok in value.context],
                "rationale": value.rationale, "raw": verdict.raw}, None

    async def ajudge(self, item: items_lib.Item, image: bytes | None, agent: agent_lib.AgentResult | None,
                     folder: Path) -> base.Judged:
        """The search verdict on the chosen references (with a policy) and the generation verdict on the image."""
        errors, verdicts = [], {}
        if agent is not None:
            verdicts["search"], error = await self._search(item, agent, folder)
            errors.append(error)
        if image is not None:
            verdicts["generation"], error = await self._generation(item, image)
            errors.append(error)
        generation = verdicts.get("generation", {"passed": False, "score": 0.0, "identity_tier": None})
        scores = {"search_pass": verdicts["search"]["passed"] if "search" in verdicts else None,
                  "generation_pass": generation["passed"], "generation_score": generation["score"],
                  "identity_tier": generation["identity_tier"]}
        problems = [e for e in errors if e]
        return base.Judged(scores=scores, judge=verdicts, reward=float(generation["score"]),
                           error="; ".join(problems) if problems else None)

    def summarize(self, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """Search and generation pass rates ×100 per domain and over all finished prompts (search None without a
        policy), the graded generation score, and the prompt counts."""
        columns = (*DOMAINS, "Overall")
        found: dict[str, dict[str, list]] = {c: {"search": [], "generation": [], "graded": []} for c in columns}
        for item in items:
            record = records.get(item.id)
            if record is None:
                continue
            scores = record.get("scores") or {}
            for column in (item.category, "Overall"):
                if scores.get("search_pass") is not None:
                    found[column]["search"].append(bool(scores["search_pass"]))
                found[column]["generation"].append(bool(scores.get("generation_pass")))
                found[column]["graded"].append(float(scores.get("generation_score") or 0.0))
        return {"search": {c: _rate(found[c]["search"]) for c in columns},
                "generation": {c: _rate(found[c]["generation"]) for c in columns},
                "generation_graded": {c: (100.0 * sum(found[c]["graded"]) / len(found[c]["graded"])
                                          if found[c]["graded"] else None) for c in columns},
                "counts": {c: len(found[c]["generation"]) for c in columns}, "num_items": len(items)}

    def table(self, summary: Mapping[str, Any], label: str) -> str:
        """One row in Table 1's layout: the search score by domain and on average, then the generation score."""
        columns = (*DOMAINS, "Overall")
        head = ("| Method | " + " | ".join(f"Search {SHORT[c]}" for c in columns) + " | "
                + " | ".join(f"Generation {SHORT[c]}" for c in columns) + " |")

        def cell(value: float | None) -> str:
            return "–" if value is None else f"{value:.1f}"

        row = (f"| {label} | " + " | ".join(cell(summary["search"][c]) for c in columns) + " | "
               + " | ".join(cell(summary["generation"][c]) for c in columns) + " |")
        counts = ", ".join(f"{c} {summary['counts'][c]}" for c in DOMAINS)
        graded = summary["generation_graded"]["Overall"]
        return "\n".join([head, "|---" * (2 * len(columns) + 1) + "|", row, "",
                          f"Prompts per domain: {counts}. Graded generation score (identity tier × criteria met): "
                          f"{cell(graded)}. Unofficial judges: not comparable with the paper's numbers."])

    def bars(self, summary: Mapping[str, Any]) -> dict[str, dict[str, float]]:
        """Search and generation scores by domain (×100)."""
        charts = {}
        for key, title in (("search", "Search score by domain"), ("generation", "Generation score by domain")):
            values = {c: v for c, v in summary[key].items() if v is not None}
            if values:
                charts[title] = values
        return charts

    def export(self, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]],
               run_dir: Path) -> list[Path]:
        """One JSON line per finished prompt: id, domain, subcategory, the two verdicts and any failure."""
        lines = []
        for item in items:
            record = records.get(item.id)
            if record is not None:
                lines.append({"id": item.id, "domain": item.category, "subcategory": item.subcategory,
                              **(record.get("scores") or {}), "failure": record.get("failure")})
        path = run_dir / EXPORT_FILE
        store.write_jsonl(path, lines)
        return [path]

    async def aclose(self) -> None:
        """Closes the judge client."""
        if self.client is not None:
            await self.client.aclose()
