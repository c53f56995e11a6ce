"""Mind-Bench (PicoTrex/Mind-Brush): the metadata file, the checklist judge, the all-checks pass rate.

Metadata: JSON lines (or a JSON array) of the published items,

    {"Type": "1_SpecialEvent", "ID": 6, "Generation_Type": "T2I", "Prompt": "...", "Image_Name": null,
     "World_Knowledge": "..." | {"image": "rel/path.png" | [...], ...}, "Checklist": ["...", ...]}

An item's id is `{type prefix}_{ID}` (`1_6`), the name its image carries in the published layout. Its input image
(`Image_Name`, relative to the image root; of several, separated by ", ", the first, as Mind-Brush's batch client
uses it) goes to the generator first. Its ground-truth reference for the judge is `World_Knowledge.image` (the
first of a list) or a `World_Knowledge` string naming a .jpg/.png file, relative to the reference root; a reference
file that does not exist is left out, as the published `eval.py` leaves it out.

Scoring (`rewards.mind_bench`): an item passes only when every checklist entry is true; the score is the share of
items that pass. An item without a generated image, or whose judge call failed, does not pass (the published scorer
writes false for a failed call; we count a missing image the same way, over all items of the benchmark).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ranger_jax.clients import chat
from ranger_jax.evals import agent as agent_lib
from ranger_jax.evals import base, store
from ranger_jax.evals import items as items_lib
from ranger_jax.rewards import mind_bench as mind_bench_judge

NAME = "mind_bench"
EXPORT_DIR = "mind_bench"
IMAGES_DIR = "images"


def _reference(world_knowledge: Any) -> str:
    """The ground-truth reference path `eval.py` reads from `World_Knowledge` ("" when there is none)."""
    if isinstance(world_knowledge, Mapping):
        image = world_knowledge.get("image", "")
        if isinstance(image, list):
            return str(image[0]) if image else ""
        return image if isinstance(image, str) else ""
    if isinstance(world_knowledge, str) and world_knowledge.endswith((".jpg", ".png")):
        return world_knowledge
    return ""


def _item(path: Path, where: str, raw: Any, reference_root: Path, image_root: Path) -> items_lib.Item:
    row = items_lib.object_row(path, where, raw)
    kind = items_lib.text_field(path, where, row, "Type")
    number = row.get("ID")
    if isinstance(number, bool) or not isinstance(number, (int, str)) or not str(number).strip():
        raise items_lib.ItemFormatError(path, where, "ID", f"must be an integer or a string, got {number!r:.60}")
    checklist = items_lib.string_list(path, where, row, "Checklist")
    if not checklist:
        raise items_lib.ItemFormatError(path, where, "Checklist", "must be a non-empty list of checks")
    inputs = ()
    if row.get("Image_Name"):
        first = items_lib.text_field(path, where, row, "Image_Name").split(", ")[0].strip()
        inputs = (items_lib.resolve(first, image_root),)
    reference = _reference(row.get("World_Knowledge"))
    truth = (items_lib.resolve(reference, reference_root),) if reference else ()
    return items_lib.Item(id=f"{kind.split('_')[0]}_{number}", prompt=items_lib.text_field(path, where, row, "Prompt"),
                          category=kind, subcategory=str(row.get("Generation_Type") or ""), ground_truth=truth,
                          inputs=inputs, criteria=checklist, meta={"Type": kind, "ID": number})


def load_items(path: str | os.PathLike, *, reference_root: str | os.PathLike | None = None,
               image_root: str | os.PathLike | None = None) -> list[items_lib.Item]:
    """The items of a Mind-Bench metadata file (format in the module docstring).

    Args:
        path: the metadata file.
        reference_root: folder the `World_Knowledge` images are relative to (default: the file's folder).
        image_root: folder the `Image_Name` input images are relative to (default: the file's folder).

    Raises:
        FileNotFoundError: no such file.
        ItemFormatError: a malformed file or row (naming the file, the line or row and the field).
    """
    path = Path(path)
    references = Path(reference_root) if reference_root is not None else path.parent
    inputs = Path(image_root) if image_root is not None else path.parent
    return items_lib.unique(path, [(where, _item(path, where, row, references, inputs))
                                   for where, row in items_lib.read_rows(path)])


def _row(item: items_lib.Item, record: Mapping[str, Any]) -> dict[str, Any]:
    """The item's row as the published `eval.py` writes it (plus `error` for a failed stage)."""
    scores = record.get("scores") or {}
    results = list(scores.get("Checklist_results") or [False] * len(item.criteria))
    return {"Type": item.meta["Type"], "ID": item.meta["ID"],
            "Image_Name": f"{item.id}.png" if record.get("image") else None, "Eval": bool(scores.get("Eval")),
            "Checklist": list(item.criteria), "Checklist_results": results,
            "error": (record.get("failure") or {}).get("reason")}


def headline(scores: Mapping[str, Any]) -> dict[str, float | None]:
    """The pass rate per type, then overall."""
    accuracy = scores["accuracy"]
    return {**{k: v["accuracy"] for k, v in accuracy.items() if k != "overall"},
            "Overall": accuracy["overall"]["accuracy"]}


class MindBench:
    """The Mind-Bench adapter (see the module docstring).

    Args:
        judge_client: the judge model's chat client (published: gemini-3-pro-preview); None for scoring and reports
            only.
        prompt_path: a rubric file replacing the packaged checklist rubric.
        t2i_suffix: appended to prompts drawn without an answer's references.
    """

    name = NAME

    def __init__(self, judge_client: chat.ChatClient | None, *, prompt_path: str | os.PathLike | None = None,
                 t2i_suffix: str = ""):
        self.client, self.t2i_suffix = judge_client, t2i_suffix
        self.judge = mind_bench_judge.ChecklistJudge(judge_client, prompt_path=prompt_path) \
            if judge_client is not None else None

    async def ajudge(self, item: items_lib.Item, image: bytes | None, agent: agent_lib.AgentResult | None,
                     folder: Path) -> base.Judged:
        """The checklist verdict on the generated image (with the ground-truth reference when its file exists)."""
        if image is None:
            return base.Judged(scores={"Eval": False, "Checklist_results": [False] * len(item.criteria)}, judge={})
        reference = item.ground_truth[0] if item.ground_truth and Path(item.ground_truth[0]).is_file() else None
        verdict = await self.judge.ajudge(item.criteria, image, reference)
        return base.Judged(scores={"Eval": verdict.passed, "Checklist_results": list(verdict.results)},
                           judge={"raw": verdict.raw, "reference_shown": reference is not None,
                                  "checks": [{"check": c, "passed": ok} for c, ok in zip(item.criteria,
                                                                                          verdict.results)]},
                           reward=float(verdict.passed), error=verdict.error)

    def rows(self, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The published result rows of the finished items, in benchmark order."""
        return [_row(item, records[item.id]) for item in items if item.id in records]

    def summarize(self, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """`rewards.mind_bench.aggregate` of the finished items: the pass rate overall and per `Type`."""
        rows = self.rows(items, records)
        return {"accuracy": mind_bench_judge.aggregate(rows), "num_items": len(items), "num_finished": len(rows)}

    def table(self, summary: Mapping[str, Any], label: str) -> str:
        """Pass rate (all checks true) per type and overall."""
        lines = [f"| {label} | accuracy | passed | items |", "|---|---|---|---|"]
        for name, value in summary["accuracy"].items():
            lines.append(f"| {'Overall' if name == 'overall' else name} | {value['accuracy']:.3f} | "
                         f"{value['passed']} | {value['count']} |")
        return "\n".join(lines)

    def bars(self, summary: Mapping[str, Any]) -> dict[str, dict[str, float]]:
        """The pass rate by type and overall."""
        return {"Mind-Bench accuracy by type": {("Overall" if k == "overall" else k): v["accuracy"]
                                                for k, v in summary["accuracy"].items()}}

    def export(self, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]],
               run_dir: Path) -> list[Path]:
        """The published layout: `mind_bench/images/{prefix}_{ID}.png` and the result rows as JSON lines."""
        out_dir = run_dir / EXPORT_DIR
        store.copy_images(items, records, run_dir, out_dir / IMAGES_DIR, lambda item: f"{item.id}.png")
        path = out_dir / "results.jsonl"
        store.write_jsonl(path, self.rows(items, records))
        return [path]

    async def aclose(self) -> None:
        """Closes the judge client."""
        if self.client is not None:
            await self.client.aclose()
