"""KnowGen's K-Score: per-sample score from a judge's four dimensions, and the benchmark aggregation.

Per sample (Gen-Searcher `KnowGen_Eval/gpt_eval_knowgen.py`, reference/rewards_and_evals.md §1):

    overall = round(0.1·F + 0.4·V + 0.4·T + 0.1·A, 2),   T := 0.5 when `text_accuracy_na`

with each dimension clipped to [0, 1] and rounded to 2 dp. Benchmark (`build_summary_by_groups`, §2):
generation failures are skipped (not scored 0) and failed judge calls excluded; rows are split by
lower-cased `meta.category` into two groups; within a group F̄, V̄, Ā average all judged samples while T̄
averages only samples whose text is applicable (0.5 when there are none); the group overall is computed from
the group means; `overall_avg` is the unweighted mean of the two groups.

Departure (the published code does not define it): an EMPTY group reports `None` for every score and
`num_samples == 0`, and `overall_avg` then averages the non-empty groups only (`num_groups` says how many);
with no judged sample at all, every `overall_avg` score is `None`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any

log = logging.getLogger(__name__)

WEIGHTS = {"faithfulness": 0.1, "visual_correctness": 0.4, "text_accuracy": 0.4, "aesthetics": 0.1}
DIMENSIONS = tuple(WEIGHTS)
TEXT_NA_SCORE = 0.5
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
    scores = {k: parse_score(obj[k], k) if k in obj else TEXT_NA_SCORE for k in DIMENSIONS}
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


def _judge_failed(row: Mapping[str, Any]) -> bool:
    scores = row.get("scores")
    if not isinstance(scores, Mapping):
        return True  # never judged
    flags = [row.get("eval_success"), scores.get("eval_success")]
    return any(flag is not None and not parse_flag(flag, "eval_success") for flag in flags)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _group_summary(samples: list[KScore]) -> dict[str, Any]:
    text_scored = [s.text_accuracy for s in samples if not s.text_accuracy_na]
    out: dict[str, Any] = {"num_samples": len(samples), "num_text_scored": len(text_scored)}
    if not samples:
        return {**{k: None for k in (*DIMENSIONS, "overall")}, **out}
    means = {
        "faithfulness": _mean([s.faithfulness for s in samples]),
        "visual_correctness": _mean([s.visual_correctness for s in samples]),
        "text_accuracy": _mean(text_scored) if text_scored else TEXT_NA_SCORE,
        "aesthetics": _mean([s.aesthetics for s in samples]),
    }
    means["overall"] = sum(WEIGHTS[k] * means[k] for k in DIMENSIONS)
    return {**means, **out}


def aggregate(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """KnowGen benchmark scores from results_eval.json-shaped rows (see the module docstring).

    Args:
        rows: dicts with `success`, `meta.category` and `scores` (faithfulness, visual_correctness,
            text_accuracy, aesthetics, text_accuracy_na); `eval_success: false` (top level or inside
            `scores`) marks a failed judge call. Summary rows (with `summary_type`) are ignored.

    Returns:
        `{"science_and_knowledge": {...}, "pop_culture_and_news": {...}, "overall_avg": {...}}`, each with
        faithfulness, visual_correctness, text_accuracy, aesthetics and overall in [0, 1] (None for an empty
        group) and `num_samples`; groups also give `num_text_scored`; `overall_avg` gives `num_groups`,
        `num_generation_failed`, `num_judge_failed` and `num_unknown_category`.

    Raises:
        ValueError: a judged row whose scores are malformed (the message names the row id and key).
    """
    samples: dict[str, list[KScore]] = {group: [] for group in GROUPS}
    skipped = {"num_generation_failed": 0, "num_judge_failed": 0, "num_unknown_category": 0}
    for index, row in enumerate(rows):
        if "summary_type" in row:
            continue
        try:
            if not parse_flag(row.get("success"), "success"):
                skipped["num_generation_failed"] += 1
                continue
            if _judge_failed(row):
                skipped["num_judge_failed"] += 1
                continue
            category = (row.get("meta") or {}).get("category")
            group = group_of(category)
            if group is None:
                log.warning("K-Score row %s has category %r outside both groups; skipped", row.get("id", index), category)
                skipped["num_unknown_category"] += 1
                continue
            samples[group].append(parse_judge_output(row["scores"]))
        except ValueError as err:
            raise ValueError(f"K-Score row {row.get('id', index)!r}: {err}") from err
    summary = {group: _group_summary(items) for group, items in samples.items()}
    present = [summary[g] for g in GROUPS if summary[g]["num_samples"]]
    overall: dict[str, Any] = {k: _mean([g[k] for g in present]) for k in (*DIMENSIONS, "overall")}
    overall.update(num_samples=sum(len(v) for v in samples.values()), num_groups=len(present), **skipped)
    summary["overall_avg"] = overall
    return summary


def summary_rows(summary: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The three trailing rows of a results_eval.json (`summary_type` + scores) from `aggregate`'s output."""
    return [{"summary_type": name, **dict(values)} for name, values in summary.items()]
