"""KnowGen_Eval's files: our eval results written as its `results.json` (with the image files), and its
`results_eval.json` read back, so the published K-Score scorer can judge our outputs.

`export_results(results, out_dir)` writes the layout Gen-Searcher's `gen_image_from_results.py` produces and
`KnowGen_Eval/gpt_eval_knowgen.py --results out_dir/results.json` reads:

    out_dir/results.json                 a JSON array, one row per item, in the given order
    out_dir/images/<id>.png              each generated image
    out_dir/gt_image/answer_<id>.<ext>   the ground-truth images (only with `copy_ground_truth=True`)

A row is `{"id", "success", "prompt", "gen_prompt", "meta", "gt_image", "output_path"}` plus `"error"` when the item
failed. Paths are relative to `out_dir` (`./images/<id>.png`), as the upstream README shows and as the scorer
resolves them (against the results file's folder); a ground truth that is not copied is written as an absolute path.
The scorer judges only rows with `success: true` whose two image files exist, so a failed item is recorded with
`success: false` and its reason, and the published aggregation skips it (it is not scored 0).

`read_eval_results(path)` reads the scorer's `results_eval.json`: the item rows (every field of `results.json` plus
`eval_success`, `scores` — faithfulness, visual_correctness, text_accuracy, aesthetics, overall and, for text-N/A
samples, `text_accuracy_na` — and `error`), then three summary rows (`summary_type` science_and_knowledge,
pop_culture_and_news, overall_avg, each with `avg_scores` and `count`). Errors name the file, the row and the field.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ranger_jax import fileio
from ranger_jax.clients import media
from ranger_jax.data import trajectory as trajectory_lib
from ranger_jax.env import core

RESULTS_FILE = "results.json"
EVAL_FILE = "results_eval.json"  # the scorer's default output, beside results.json
IMAGES_DIR = "images"
GT_DIR = "gt_image"
SCORE_KEYS = ("faithfulness", "visual_correctness", "text_accuracy", "aesthetics", "overall")
SUMMARY_TYPES = ("science_and_knowledge", "pop_culture_and_news", "overall_avg")
_UNSAFE = re.compile(r"[^\w\-.]")


class KnowGenFormatError(ValueError):
    """A KnowGen_Eval file, or one of its rows, that cannot be read; names the file, the row and the field."""

    def __init__(self, path: str | os.PathLike, row: int | None, field: str | None, problem: str):
        self.path, self.row, self.field = Path(path), row, field
        place = str(self.path) + (f" row {row}" if row is not None else "") + (f" field {field!r}" if field else "")
        super().__init__(f"{place}: {problem}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class KnowGenResult:
    """One benchmark item as our eval finished it.

    Attributes:
        id: the KnowGen item id.
        prompt: the benchmark prompt (the judge scores against it, not against `gen_prompt`).
        meta: the item's `meta` (`category` decides its aggregation group).
        gt_image: the ground-truth image file (None when the item has none).
        image: the generated image (encoded bytes, a PIL image or a file path); None when generation failed.
        gen_prompt: the prompt the generator was given (the agent's grounded prompt, or the benchmark prompt).
        error: why there is no image.
    """

    id: str | int
    prompt: str
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    gt_image: str | None = None
    image: media.ImageLike | None = None
    gen_prompt: str = ""
    error: str | None = None


def result_from_trajectory(task: core.Task, trajectory: trajectory_lib.Trajectory) -> KnowGenResult:
    """The KnowGen result of one evaluated episode: its answer's prompt and the generator's image (or why not)."""
    truth = task.ground_truth
    if isinstance(truth, Mapping):
        truth = truth.get("gt_image", truth.get("gen_image"))
    gen_prompt = trajectory.answer.gen_prompt if trajectory.answer is not None else ""
    error = None
    if trajectory.generated_image is None:
        error = trajectory.generation_error or f"no generated image (episode ended with {trajectory.termination})"
    meta = {k: v for k, v in (task.metadata or {}).items() if k != "today"}
    return KnowGenResult(id=task.id, prompt=task.prompt, meta=meta, gt_image=truth if isinstance(truth, str) else None,
                         image=trajectory.generated_image, gen_prompt=gen_prompt, error=error)


def _file_stem(item_id: str | int) -> str:
    return _UNSAFE.sub("_", str(item_id)) or "_"


def _ground_truth(result: KnowGenResult, out_dir: Path, stem: str, copy: bool) -> str | None:
    gt = result.gt_image
    if gt is None or "://" in gt or gt.startswith("data:"):
        return gt  # a URL is kept as written (the scorer judges local files only)
    if not copy:
        return str(Path(gt).resolve())
    if not Path(gt).is_file():
        raise FileNotFoundError(f"KnowGen item {result.id!r}: ground-truth image {gt} does not exist")
    target = out_dir / GT_DIR / f"answer_{stem}{Path(gt).suffix.lower() or '.png'}"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(gt, target)
    return f"./{GT_DIR}/{target.name}"


def export_results(results: Iterable[KnowGenResult], out_dir: str | os.PathLike, *,
                   copy_ground_truth: bool = False) -> Path:
    """Writes `results.json` and the image files for the upstream scorer (layout in the module docstring).

    Args:
        results: the items, in benchmark order.
        out_dir: the folder to write (created if missing; files already there are replaced).
        copy_ground_truth: also copy each local GT image under `gt_image/`, so the folder stands alone.

    Returns:
        The path of `results.json`.

    Raises:
        ValueError: two items whose ids map to the same file name, or an image that cannot be decoded (naming
            the item).
        FileNotFoundError: `copy_ground_truth` with a GT file that does not exist.
    """
    out_dir = Path(out_dir)
    rows, stems = [], {}
    for result in results:
        stem = _file_stem(result.id)
        if stem in stems:
            raise ValueError(f"KnowGen items {stems[stem]!r} and {result.id!r} both map to the file name {stem!r}")
        stems[stem] = result.id
        output = f"./{IMAGES_DIR}/{stem}.png"
        row: dict[str, Any] = {"id": result.id, "success": result.image is not None, "prompt": result.prompt,
                               "gen_prompt": result.gen_prompt, "meta": dict(result.meta),
                               "gt_image": _ground_truth(result, out_dir, stem, copy_ground_truth),
                               "output_path": output}
        if result.image is not None:
            try:
                png = media.png_bytes(result.image)
            except (ValueError, FileNotFoundError) as err:
                raise ValueError(f"KnowGen item {result.id!r}: the generated image cannot be read: {err}") from err
            fileio.write_atomic(out_dir / output, png)
        else:
            row["error"] = result.error or "generation failed"
        rows.append(row)
    path = out_dir / RESULTS_FILE
    fileio.write_atomic(path, json.dumps(rows, ensure_ascii=False, indent=2).encode("utf-8"))
    return path


@dataclasses.dataclass(frozen=True)
class KnowGenEval:
    """A `results_eval.json`, read.

    Attributes:
        rows: the item rows as written (summary rows removed), in file order.
        summary: {summary_type: {faithfulness, visual_correctness, text_accuracy, aesthetics, overall}}.
        counts: {summary_type: judged samples it averages}.
    """

    rows: tuple[Mapping[str, Any], ...]
    summary: Mapping[str, Mapping[str, float]]
    counts: Mapping[str, int]

    def scores(self) -> dict[str, Mapping[str, Any] | None]:
        """{str(id): the row's `scores`, or None when it was not judged (generation or judge failure)}."""
        return {str(row["id"]): row.get("scores") if row.get("eval_success") else None for row in self.rows}


def _number(path: Path, index: int, field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise KnowGenFormatError(path, index, field, f"must be a number in [0, 1], got {value!r:.60}")
    return float(value)


def _check_item(path: Path, index: int, row: Mapping[str, Any]) -> None:
    if "id" not in row:
        raise KnowGenFormatError(path, index, "id", "missing")
    judged = row.get("eval_success")
    if not isinstance(judged, bool):
        raise KnowGenFormatError(path, index, "eval_success", f"must be true or false, got {judged!r:.60}")
    scores = row.get("scores")
    if not judged:
        if scores is not None:
            raise KnowGenFormatError(path, index, "scores", "must be null when eval_success is false")
        return
    if not isinstance(scores, Mapping):
        raise KnowGenFormatError(path, index, "scores", f"must be an object when judged, got {scores!r:.60}")
    for key in SCORE_KEYS:
        if key not in scores:
            raise KnowGenFormatError(path, index, f"scores.{key}", "missing")
        _number(path, index, f"scores.{key}", scores[key])
    if not isinstance(scores.get("text_accuracy_na", False), bool):
        raise KnowGenFormatError(path, index, "scores.text_accuracy_na", "must be true or false")


def _summary(path: Path, index: int, row: Mapping[str, Any]) -> tuple[str, dict[str, float], int]:
    kind = row["summary_type"]
    if kind not in SUMMARY_TYPES:
        raise KnowGenFormatError(path, index, "summary_type", f"{kind!r} is not one of {SUMMARY_TYPES}")
    averages = row.get("avg_scores")
    if not isinstance(averages, Mapping):
        raise KnowGenFormatError(path, index, "avg_scores", f"must be an object, got {averages!r:.60}")
    means = {}
    for key in SCORE_KEYS:
        if key not in averages:
            raise KnowGenFormatError(path, index, f"avg_scores.{key}", "missing")
        means[key] = _number(path, index, f"avg_scores.{key}", averages[key])
    count = row.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise KnowGenFormatError(path, index, "count", f"must be an integer >= 0, got {count!r:.60}")
    return kind, means, count


def read_eval_results(path: str | os.PathLike) -> KnowGenEval:
    """Reads KnowGen_Eval's `results_eval.json` (a folder means the file of that name in it).

    Raises:
        FileNotFoundError: no such file.
        KnowGenFormatError: not a JSON array, a row that is not an object, a judged row without its five scores in
            [0, 1], a malformed summary row, or a summary type missing, repeated or followed by item rows.
    """
    path = Path(path)
    if path.is_dir():
        path = path / EVAL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"KnowGen eval file {path} does not exist")
    try:
        data = json.loads(path.read_text("utf-8"))
    except ValueError as err:
        raise KnowGenFormatError(path, None, None, f"not valid JSON: {err}") from err
    if not isinstance(data, list):
        raise KnowGenFormatError(path, None, None, f"must hold a JSON array, got {type(data).__name__}")
    rows, summary, counts = [], {}, {}
    for index, row in enumerate(data):
        if not isinstance(row, Mapping):
            raise KnowGenFormatError(path, index, None, f"must be an object, got {type(row).__name__}")
        if "summary_type" in row:
            kind, means, count = _summary(path, index, row)
            if kind in summary:
                raise KnowGenFormatError(path, index, "summary_type", f"{kind!r} appears twice")
            summary[kind], counts[kind] = means, count
            continue
        if summary:
            raise KnowGenFormatError(path, index, None, "an item row after the summary rows")
        _check_item(path, index, row)
        rows.append(row)
    missing = [kind for kind in SUMMARY_TYPES if kind not in summary]
    if missing:
        raise KnowGenFormatError(path, None, "summary_type", f"no summary row for {missing}")
    return KnowGenEval(rows=tuple(rows), summary=summary, counts=counts)
