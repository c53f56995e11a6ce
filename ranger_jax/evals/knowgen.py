"""KnowGen-Bench (Gen-Searcher): items from the published file, the K-Score judge, KnowGen_Eval's aggregation.

Items come from `KnowGen-Bench.json` (a JSON array or JSON lines of `{id, prompt, meta{category, difficulty},
gt_image|gen_image}`; any task file `data.load_tasks` reads works). Each generated image is judged by the K-Score
judge against the item's ground truth on the ORIGINAL prompt (`rewards.judge.KScoreJudge`), and the run is scored
by `rewards.kscore.aggregate`, exactly as `KnowGen_Eval/gpt_eval_knowgen.py` does: a generation failure is skipped
(not scored 0), a failed judge call is excluded, the two category groups are macro-averaged. Scores are reported
×100, as the paper does. A prompt drawn without an answer's references (the generator-alone baseline, and the fallback
of an answer without any) gets Gen-Searcher's text-to-image suffix `T2I_SUFFIX` unless the run sets another.

A run is also written in KnowGen_Eval's own layout (`knowgen_eval/results.json` + images, which the upstream scorer
reads, and our `results_eval.json` in the scorer's output format, which `data.knowgen_eval.read_eval_results`
reads back).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ranger_jax import data as data_lib
from ranger_jax.clients import chat
from ranger_jax.data import knowgen_eval
from ranger_jax.evals import agent as agent_lib
from ranger_jax.evals import base, store
from ranger_jax.evals import items as items_lib
from ranger_jax.rewards import judge as judge_lib
from ranger_jax.rewards import kscore

NAME = "knowgen"
# Gen-Searcher's eval draws a prompt without an answer's references with Qwen-Image and this suffix
T2I_SUFFIX = ", Ultra HD, 4K, cinematic composition."
EXPORT_DIR = "knowgen_eval"
GROUP_LABELS = {"science_and_knowledge": "Science & Knowledge", "pop_culture_and_news": "Pop Culture & News",
                "overall_avg": "Overall"}
DIMENSION_LABELS = {"faithfulness": "F", "visual_correctness": "V", "text_accuracy": "T", "aesthetics": "A",
                    "overall": "K-Score"}


def load_items(path: str | os.PathLike) -> list[items_lib.Item]:
    """The items of a KnowGen-Bench file (or any task file `data.load_tasks` reads).

    Raises:
        FileNotFoundError / ValueError: as `data.load_tasks` (naming the file, the row and the field), or two ids
            that make the same file name (`items.ItemFormatError`).
    """
    out = []
    for index, task in enumerate(data_lib.load_tasks(path)):
        meta = {k: v for k, v in (task.metadata or {}).items() if k != "today"}
        truth = task.ground_truth if isinstance(task.ground_truth, str) else None
        if truth is not None and not items_lib.is_url(truth):
            truth = str(Path(truth).absolute())  # records and reports outlive the working folder
        out.append((f"row {index}", items_lib.Item(
            id=task.id, prompt=task.prompt, category=str(meta.get("category", "")),
            subcategory=str(meta.get("difficulty", "")), ground_truth=(truth,) if truth else (), meta=meta,
            today=(task.metadata or {}).get("today"))))
    return items_lib.unique(Path(path), out)  # ids must also make distinct file names


def _ground_truth(item: items_lib.Item) -> str | None:
    truth = item.ground_truth[0] if item.ground_truth else None
    return truth if truth is not None and not items_lib.is_url(truth) and Path(truth).is_file() else None


def _row(item: items_lib.Item, record: Mapping[str, Any]) -> dict[str, Any]:
    """The item's row as KnowGen_Eval's `results_eval.json` holds it."""
    scores = record.get("scores") or {}
    return {"id": item.id, "success": bool(scores.get("success")), "prompt": item.prompt,
            "gen_prompt": (record.get("generation") or {}).get("prompt", ""), "meta": dict(item.meta),
            "gt_image": item.ground_truth[0] if item.ground_truth else None,
            "output_path": f"./{knowgen_eval.IMAGES_DIR}/{items_lib.file_stem(item.id)}.png",
            "eval_success": bool(scores.get("eval_success")), "scores": scores.get("kscore"),
            "error": (record.get("failure") or {}).get("reason")}


def headline(scores: Mapping[str, Any]) -> dict[str, float | None]:
    """The run's K-Score ×100 per group and overall (a row of a comparison table)."""
    return {GROUP_LABELS[group]: 100 * scores["groups"][group]["overall"] for group in GROUP_LABELS}


class KnowGen:
    """The KnowGen benchmark adapter (see the module docstring).

    Args:
        judge_client: the judge model's chat client (KnowGen: gpt-4.1); None for scoring and reports only.
        prompt_path: a rubric file replacing the packaged K-Score rubric.
        max_attempts: judge calls before an unusable reply counts as a failed judge call.
        t2i_suffix: appended to prompts drawn without an answer's references.
    """

    name = NAME

    def __init__(self, judge_client: chat.ChatClient | None, *, prompt_path: str | os.PathLike | None = None,
                 max_attempts: int = judge_lib.DEFAULT_MAX_ATTEMPTS, t2i_suffix: str = T2I_SUFFIX):
        self.client, self.t2i_suffix = judge_client, t2i_suffix
        self.judge = judge_lib.KScoreJudge(judge_client, prompt_path=prompt_path, max_attempts=max_attempts) \
            if judge_client is not None else None

    async def ajudge(self, item: items_lib.Item, image: bytes | None, agent: agent_lib.AgentResult | None,
                     folder: Path) -> base.Judged:
        """K-Score of the generated image against the item's ground truth (not judged without both images)."""
        if image is None:
            return base.Judged(scores={"success": False, "eval_success": False}, judge={})
        truth = _ground_truth(item)
        if truth is None:
            return base.Judged(scores={"success": True, "eval_success": False}, judge={},
                               error=f"no local ground-truth image ({item.ground_truth or 'none given'})")
        try:
            verdict = await self.judge.ascore(item.prompt, image, truth, sample_id=item.id)
        except judge_lib.JudgeError as err:
            return base.Judged(scores={"success": True, "eval_success": False}, judge={}, error=str(err))
        value = verdict.value
        return base.Judged(scores={"success": True, "eval_success": True, "kscore": value.to_dict()},
                           judge={"rationale": value.rationale, "raw": verdict.raw, "attempts": verdict.attempts},
                           reward=value.overall)

    def rows(self, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
        """KnowGen_Eval rows of the finished items, in benchmark order."""
        return [_row(item, records[item.id]) for item in items if item.id in records]

    def summarize(self, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """`kscore.aggregate` and `kscore.tally` of the finished items, plus the mean per-sample K-Score by category
        (informational: the published score is by group)."""
        rows = self.rows(items, records)
        by_category: dict[str, list[float]] = collections.defaultdict(list)
        for row in rows:
            if row["eval_success"] and row["scores"]:
                by_category[str(row["meta"].get("category", ""))].append(row["scores"]["overall"])
        return {"groups": kscore.aggregate(rows), "counts": kscore.tally(rows),
                "by_category": {name: {"overall": sum(v) / len(v), "count": len(v)}
                                for name, v in sorted(by_category.items())},
                "num_items": len(items), "num_finished": len(rows)}

    def table(self, summary: Mapping[str, Any], label: str) -> str:
        """K-Score ×100 per group (F, V, T, A and K-Score), one row per group, then how many samples counted."""
        head = "| " + label + " | " + " | ".join(DIMENSION_LABELS.values()) + " | judged |"
        lines = [head, "|---" * (len(DIMENSION_LABELS) + 2) + "|"]
        counts = summary["counts"]
        for group, name in GROUP_LABELS.items():
            values = " | ".join(f"{100 * summary['groups'][group][k]:.2f}" for k in DIMENSION_LABELS)
            lines.append(f"| {name} | {values} | {counts[group]} |")
        skipped = ", ".join(f"{reason} {counts[reason]}" for reason in kscore.SKIP_REASONS if counts[reason])
        lines.append("")
        lines.append(f"Skipped as KnowGen_Eval skips them: {skipped or 'none'}.")
        return "\n".join(lines)

    def bars(self, summary: Mapping[str, Any]) -> dict[str, dict[str, float]]:
        """K-Score ×100 by group, and the mean per-sample K-Score ×100 by category."""
        return {"K-Score by group (x100)": {GROUP_LABELS[g]: 100 * summary["groups"][g]["overall"]
                                            for g in GROUP_LABELS},
                "Mean per-sample K-Score by category (x100)": {name: 100 * v["overall"]
                                                               for name, v in summary["by_category"].items()}}

    def export(self, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]],
               run_dir: Path) -> list[Path]:
        """KnowGen_Eval's `results.json` + images, and `results_eval.json` with the published summary rows."""
        results, rows = [], self.rows(items, records)
        for item in items:
            record = records.get(item.id)
            if record is None:
                continue
            image = store.item_image(run_dir, item.id, record)
            failure = record.get("failure") or {}
            results.append(knowgen_eval.KnowGenResult(
                id=item.id, prompt=item.prompt, meta=item.meta, gt_image=item.ground_truth[0] if item.ground_truth
                else None, image=str(image) if image is not None else None,
                gen_prompt=(record.get("generation") or {}).get("prompt", ""),
                error=failure.get("reason") if image is None else None))
        out_dir = run_dir / EXPORT_DIR
        results_path = knowgen_eval.export_results(results, out_dir)
        eval_rows = rows + kscore.summary_rows(kscore.aggregate(rows), kscore.tally(rows))
        eval_path = out_dir / knowgen_eval.EVAL_FILE
        store.write_json(eval_path, eval_rows)
        return [results_path, eval_path]

    async def aclose(self) -> None:
        """Closes the judge client."""
        if self.client is not None:
            await self.client.aclose()
