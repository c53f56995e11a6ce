"""KnowGen's K-Score: per-sample score from a judge's four dimensions, and the benchmark aggregation.

Per sample (as Gen-Searcher's `KnowGen_Eval/gpt_eval_knowgen.py` computes it):

    overall = round(0.1·F + 0.4·V + 0.4·T + 0.1·A, 2),   T := 0.5 when `text_accuracy_na`

with each dimension clipped to [0, 1] and rounded to 2 dp (a text-N/A sample records `text_accuracy` 0.5,
as the published judge parser does). Benchmark (`build_summary_by_groups`, §2): generation failures are
skipped (not scored 0) and failed judge calls excluded; rows are split by lower-cased `meta.category` into two
groups (other categories skipped with a warning); within a group F̄, V̄, Ā average all judged samples while
T̄ averages only samples whose text is applicable (0.5 when there are none); the group overall is computed
from the group means; `overall_avg` is the unweighted mean of the two groups. As in the published code, an
empty group scores 0.0 on every key (and still counts in `overall_avg`), and a dimension a judged row lacks
is left out of that dimension's mean.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

WEIGHTS = {"faithfulness": 0.1, "visual_correctness": 0.4, "text_accuracy": 0.4, "aesthetics": 0.1}
DIMENSIONS = tuple(WEIGHTS)
TEXT_NA_SCORE = 0.5
SUMMARY_KEYS = (*DIMENSIONS, "overall")  # the keys of every aggregate entry
SKIP_REASONS = ("generation_failed", "missing_image", "judge_failed", "unknown_category")
GROUPS = {
    "science_and_knowledge": frozenset({
        "astronomy", "biology", "chemistry", "physics", "engineering", "medicine", "industry", "architecture",
        "history", "geography", "religion", "politics", "culture", "art", "sports"}),
    "pop_culture_and_news": frozenset({
        "anime", "game", "film", "celebrities", "posters", "multi-subject-anime", "multi-subject-celebrities",
        "multi-subject-game", "news"}),
}
_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no", ""})


def parse_flag(value: Any, key: str = "text_accuracy_na") -> bool:
    """A judge's boolean: `True`/`False`, 1/0, or "true"/"True"/"false"/… strings; None means False.

    Raises:
        ValueError: anything else (the message names `key` and the value).
    """
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"{key} must be a boolean (true/false, 1/0), got {value!r}")


def parse_score(value: Any, key: str) -> float:
    """A judge's score as a float clipped to [0, 1] and rounded to 2 dp.

    Raises:
        ValueError: missing or not a number (the message names `key`).
    """
    if isinstance(value, bool) or value is None:
        raise ValueError(f"score {key!r} must be a number in [0, 1], got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"score {key!r} must be a number in [0, 1], got {value!r}") from err
    if number != number:  # NaN
        raise ValueError(f"score {key!r} is NaN")
    return round(min(1.0, max(0.0, number)), 2)


def overall_score(faithfulness: float, visual_correctness: float, text_accuracy: float, aesthetics: float,
                  text_accuracy_na: bool) -> float:
    """round(0.1·F + 0.4·V + 0.4·T + 0.1·A, 2), with T = 0.5 when the text is not applicable."""
    text = TEXT_NA_SCORE if text_accuracy_na else text_accuracy
    return round(WEIGHTS["faithfulness"] * faithfulness + WEIGHTS["visual_correctness"] * visual_correctness
                 + WEIGHTS["text_accuracy"] * text + WEIGHTS["aesthetics"] * aesthetics, 2)


@dataclasses.dataclass(frozen=True)
class KScore:
    """One judged sample; every dimension in [0, 1]."""

    faithfulness: float
    visual_correctness: float
    text_accuracy: float
    aesthetics: float
    text_accuracy_na: bool
    rationale: str = ""

    @property
    def overall(self) -> float:
        """The per-sample K-Score from the four dimensions (formula in the module docstring)."""
        return overall_score(self.faithfulness, self.visual_correctness, self.text_accuracy, self.aesthetics,
                             self.text_accuracy_na)

    def to_dict(self) -> dict[str, Any]:
        """The `scores` object of a KnowGen results_eval.json row (with `overall`)."""
        return {**dataclasses.asdict(self), "overall": self.overall}


def parse_judge_output(obj: Mapping[str, Any]) -> KScore:
    """A `KScore` from the judge's JSON (`rationale`, the four dimensions, `text_accuracy_na`).

    Raises:
        ValueError: not an object, a missing dimension, or a value that is not a score (the message names it).
    """
    if not isinstance(obj, Mapping):
        raise ValueError(f"K-Score judge output must be a JSON object, got {type(obj).__name__}")
    text_na = parse_flag(obj.get("text_accuracy_na"))
    missing = [k for k in DIMENSIONS if k not in obj and not (k == "text_accuracy" and text_na)]
    if missing:
        raise ValueError(f"K-Score judge output lacks {missing}; got keys {sorted(obj)}")
    scores = {k: parse_score(obj[k], k) for k in DIMENSIONS if k != "text_accuracy" or not text_na}
    if text_na:
        scores["text_accuracy"] = TEXT_NA_SCORE  # recorded as 0.5, as the published parser does
    rationale = obj.get("rationale", "")
    return KScore(**scores, text_accuracy_na=text_na,
                  rationale=rationale if isinstance(rationale, str) else str(rationale))


def group_of(category: Any) -> str | None:
    """The aggregation group of a `meta.category` value (case-insensitive), or None."""
    name = str(category or "").strip().lower()
    for group, categories in GROUPS.items():
        if name in categories:
            return group
    return None


def _row_id(row: Mapping[str, Any], index: int) -> Any:
    return row.get("id", index)


def _image_missing(row: Mapping[str, Any], base_dir: str | os.PathLike) -> bool:
    """Whether the generated image (`output_path`) or the GT (`gt_image`) file is absent (relative paths
    resolve against `base_dir`, the results JSON's folder)."""
    for key in ("output_path", "gt_image"):
        value = row.get(key)
        if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
            return True
        path = Path(value)
        if not path.is_absolute():
            path = Path(base_dir) / path
        if not path.is_file():
            return True
    return False


def _judge_failed(row: Mapping[str, Any]) -> bool:
    scores = row.get("scores")
    if not isinstance(scores, Mapping):
        return True  # never judged (published rows carry `scores: null` then)
    flags = [row.get("eval_success"), scores.get("eval_success")]
    return any(flag is not None and not parse_flag(flag, "eval_success") for flag in flags)


def _classify(row: Mapping[str, Any], base_dir: str | os.PathLike | None) -> str:
    """The group a row's sample counts in, or the reason (one of SKIP_REASONS) it is skipped."""
    if "success" in row and not parse_flag(row["success"], "success"):
        return "generation_failed"
    if base_dir is not None and _image_missing(row, base_dir):
        return "missing_image"
    if _judge_failed(row):
        return "judge_failed"
    group = group_of((row.get("meta") or {}).get("category"))
    return group if group is not None else "unknown_category"


def _row_value(scores: Mapping[str, Any], key: str) -> float | None:
    """A dimension of a judged row clipped to [0, 1] (not rounded), or None when the row lacks it."""
    value = scores.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise ValueError(f"score {key!r} must be a number in [0, 1], got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"score {key!r} must be a number in [0, 1], got {value!r}") from err
    if number != number:
        raise ValueError(f"score {key!r} is NaN")
    return min(1.0, max(0.0, number))


def _mean(values: list[float], empty: float) -> float:
    return sum(values) / len(values) if values else empty


def _sample(scores: Mapping[str, Any]) -> dict[str, Any]:
    """A judged `scores` object as {dimension: float in [0, 1] or None, "text_accuracy_na": bool}."""
    text_na = parse_flag(scores.get("text_accuracy_na"))
    sample: dict[str, Any] = {k: None if k == "text_accuracy" and text_na else _row_value(scores, k)
                              for k in DIMENSIONS}
    sample["text_accuracy_na"] = text_na  # its text_accuracy is not read: T̄ skips N/A samples
    return sample


def _group_summary(samples: list[Mapping[str, Any]]) -> dict[str, float]:
    """Group means of `_sample`s (the published `avg_scores`; all 0.0 for an empty group)."""
    if not samples:
        return {k: 0.0 for k in SUMMARY_KEYS}
    means = {k: _mean([s[k] for s in samples if s[k] is not None], 0.0) for k in DIMENSIONS}
    means["text_accuracy"] = _mean([s["text_accuracy"] for s in samples if s["text_accuracy"] is not None],
                                   TEXT_NA_SCORE)  # N/A samples carry None here
    means["overall"] = sum(WEIGHTS[k] * means[k] for k in DIMENSIONS)
    return means


def _collect(rows: Iterable[Mapping[str, Any]], base_dir: str | os.PathLike | None
             ) -> tuple[dict[str, list[dict[str, Any]]], collections.Counter]:
    samples: dict[str, list[dict[str, Any]]] = {group: [] for group in GROUPS}
    counts: collections.Counter = collections.Counter()
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ValueError(f"K-Score row {index} must be an object, got {type(row).__name__}")
        if "summary_type" in row:
            continue
        try:
            where = _classify(row, base_dir)
            if where in samples:
                samples[where].append(_sample(row["scores"]))
        except ValueError as err:
            raise ValueError(f"K-Score row {_row_id(row, index)!r}: {err}") from err
        if where == "unknown_category":
            log.warning("K-Score row %s has category %r outside both groups; skipped", _row_id(row, index),
                        (row.get("meta") or {}).get("category"))
        counts[where] += 1
    return samples, counts


def aggregate(rows: Iterable[Mapping[str, Any]], *, base_dir: str | os.PathLike | None = None
              ) -> dict[str, dict[str, float]]:
    """KnowGen benchmark scores from results_eval.json-shaped rows (see the module docstring).

    Args:
        rows: dicts with `success`, `meta.category` and `scores` (faithfulness, visual_correctness,
            text_accuracy, aesthetics, text_accuracy_na). A row with `success` false is a generation failure;
            one without a `scores` object, or with `eval_success: false` (top level or inside `scores`), a
            failed judge call; both are skipped. Summary rows (with `summary_type`) are ignored. Flags may be
            booleans, 0/1 or "true"/"false" strings.
        base_dir: also skip rows whose `output_path` or `gt_image` file is missing, resolving relative paths
            against this folder (the results JSON's). None: trust the rows (the published aggregation only
            sees rows that were judged, i.e. whose images existed).

    Returns:
        `{"science_and_knowledge": {...}, "pop_culture_and_news": {...}, "overall_avg": {...}}`, each with
        exactly `faithfulness`, `visual_correctness`, `text_accuracy`, `aesthetics` and `overall`, in [0, 1].
        Counts are `tally(rows)`.

    Raises:
        ValueError: a row that is not an object, an unparsable flag, or a score that is not a number (the
            message names the row id and key).
    """
    samples, _ = _collect(rows, base_dir)
    summary = {group: _group_summary(items) for group, items in samples.items()}
    summary["overall_avg"] = {k: sum(summary[g][k] for g in GROUPS) / len(GROUPS) for k in SUMMARY_KEYS}
    return summary


def tally(rows: Iterable[Mapping[str, Any]], *, base_dir: str | os.PathLike | None = None) -> dict[str, int]:
    """How `aggregate` used the rows: judged samples per group (`overall_avg` = both), and rows skipped per
    reason (`generation_failed`, `missing_image`, `judge_failed`, `unknown_category`)."""
    _, counts = _collect(rows, base_dir)
    out = {group: counts[group] for group in GROUPS}
    out["overall_avg"] = sum(out.values())
    out.update({reason: counts[reason] for reason in SKIP_REASONS})
    return out


def summary_rows(summary: Mapping[str, Mapping[str, Any]], counts: Mapping[str, int] | None = None
                 ) -> list[dict[str, Any]]:
    """The three trailing rows of a results_eval.json, shaped as published: `{"summary_type", "avg_scores",
    "count"}` from `aggregate`'s output (and `tally`'s counts; `count` is omitted without them)."""
    rows = []
    for name in (*GROUPS, "overall_avg"):
        row: dict[str, Any] = {"summary_type": name, "avg_scores": {k: summary[name][k] for k in SUMMARY_KEYS}}
        if counts is not None:
            row["count"] = int(counts[name])
        rows.append(row)
    return rows
