"""K-Score per-sample scoring and the KnowGen aggregation, against hand-computed values."""
import pytest

from ranger_jax.rewards import kscore


def row(category, f, v, t, a, na, **extra):
    return {"id": extra.pop("id", category), "success": extra.pop("success", True), "meta": {"category": category},
            "scores": {"faithfulness": f, "visual_correctness": v, "text_accuracy": t, "aesthetics": a,
                       "text_accuracy_na": na}, **extra}


ROWS = [
    row("biology", 1, 1, 1, 0.5, False),
    row("Physics", 0.5, 0.5, 0.5, 0.5, True),
    row(" ART ", 0, 0.5, 0, 1, "False"),
    row("anime", 1, 0, 1, 1, "false"),
    row("News", 1, 1, 0.5, 0, 1),
    row("multi-subject-game", 0, 0, 0, 0, False, success=False),  # generation failure: skipped
    row("game", 0, 0, 0, 0, False, success="false"),
    row("film", 0, 0, 0, 0, False, eval_success=False),  # failed judge: excluded
    {"id": "j2", "success": True, "meta": {"category": "film"}, "scores": {"eval_success": "False"}},
    {"id": "j3", "success": True, "meta": {"category": "film"}},  # never judged
    row("cooking", 1, 1, 1, 1, False),  # outside both groups
    {"summary_type": "overall_avg", "overall": 0.99},
]


def test_per_sample_overall_and_na_rule():
    assert kscore.overall_score(1, 1, 1, 0.5, False) == 0.95
    assert kscore.overall_score(1, 1, 0, 1, True) == 0.8  # T counts 0.5 when text is N/A
    assert kscore.overall_score(0.5, 0.5, 0.5, 0.5, False) == 0.5
    score = kscore.parse_judge_output({"rationale": "Constraints: x", "faithfulness": 1.7, "visual_correctness": "0.5",
                                       "text_accuracy": -2, "aesthetics": 0.333, "text_accuracy_na": "True"})
    assert (score.faithfulness, score.visual_correctness, score.text_accuracy, score.aesthetics) == (1.0, 0.5, 0.0, 0.33)
    assert score.text_accuracy_na and score.overall == round(0.1 + 0.2 + 0.2 + 0.033, 2)
    assert score.to_dict()["overall"] == score.overall and score.to_dict()["rationale"] == "Constraints: x"


@pytest.mark.parametrize("value, expected", [(True, True), ("true", True), ("True", True), (1, True), ("1", True),
                                             (False, False), ("false", False), (0, False), (None, False)])
def test_parse_flag(value, expected):
    assert kscore.parse_flag(value) is expected


def test_parse_errors_name_the_key():
    with pytest.raises(ValueError, match=r"text_accuracy_na must be a boolean .*got 'maybe'"):
        kscore.parse_flag("maybe")
    with pytest.raises(ValueError, match=r"score 'aesthetics' must be a number in \[0, 1\], got 'high'"):
        kscore.parse_score("high", "aesthetics")
    with pytest.raises(ValueError, match="score 'faithfulness' must be a number"):
        kscore.parse_score(True, "faithfulness")
    with pytest.raises(ValueError, match="is NaN"):
        kscore.parse_score(float("nan"), "aesthetics")
    with pytest.raises(ValueError, match=r"lacks \['visual_correctness'\]"):
        kscore.parse_judge_output({"faithfulness": 1, "text_accuracy": 1, "aesthetics": 1})
    with pytest.raises(ValueError, match="must be a JSON object"):
        kscore.parse_judge_output([1, 2])
    na_only = kscore.parse_judge_output({"faithfulness": 1, "visual_correctness": 1, "aesthetics": 1,
                                         "text_accuracy_na": True})
    assert na_only.text_accuracy == kscore.TEXT_NA_SCORE


def test_aggregate_matches_hand_computed_values():
    out = kscore.aggregate(ROWS)
    assert set(out) == {"science_and_knowledge", "pop_culture_and_news", "overall_avg"}
    sci, pop, avg = out["science_and_knowledge"], out["pop_culture_and_news"], out["overall_avg"]
    # science: F (1+.5+0)/3, V (1+.5+.5)/3, T over non-N/A rows only (1+0)/2, A (.5+.5+1)/3
    assert sci["faithfulness"] == pytest.approx(0.5) and sci["visual_correctness"] == pytest.approx(2 / 3)
    assert sci["text_accuracy"] == pytest.approx(0.5) and sci["aesthetics"] == pytest.approx(2 / 3)
    assert sci["overall"] == pytest.approx(0.05 + 0.4 * 2 / 3 + 0.4 * 0.5 + 0.1 * 2 / 3)
    assert (sci["num_samples"], sci["num_text_scored"]) == (3, 2)
    # pop culture: F 1, V .5, T only the anime row (1), A .5
    assert (pop["faithfulness"], pop["visual_correctness"], pop["text_accuracy"], pop["aesthetics"]) == (1, 0.5, 1, 0.5)
    assert pop["overall"] == pytest.approx(0.75) and (pop["num_samples"], pop["num_text_scored"]) == (2, 1)
    # overall_avg: unweighted mean of the two groups
    assert avg["faithfulness"] == pytest.approx(0.75) and avg["visual_correctness"] == pytest.approx((2 / 3 + 0.5) / 2)
    assert avg["text_accuracy"] == pytest.approx(0.75) and avg["aesthetics"] == pytest.approx((2 / 3 + 0.5) / 2)
    assert avg["overall"] == pytest.approx((sci["overall"] + 0.75) / 2)
    assert (avg["num_samples"], avg["num_groups"], avg["num_generation_failed"], avg["num_judge_failed"],
            avg["num_unknown_category"]) == (5, 2, 2, 3, 1)


def test_group_without_applicable_text_uses_half():
    out = kscore.aggregate([row("history", 1, 1, 0.5, 1, True), row("game", 0, 0, 1, 0, False)])
    assert out["science_and_knowledge"]["text_accuracy"] == 0.5
    assert out["science_and_knowledge"]["overall"] == pytest.approx(0.1 + 0.4 + 0.2 + 0.1)


def test_empty_group_is_none_and_overall_avg_uses_the_other_group():
    out = kscore.aggregate([row("anime", 1, 0.5, 1, 0.5, False)])
    assert out["science_and_knowledge"] == {"faithfulness": None, "visual_correctness": None, "text_accuracy": None,
                                            "aesthetics": None, "overall": None, "num_samples": 0, "num_text_scored": 0}
    assert out["overall_avg"]["overall"] == pytest.approx(out["pop_culture_and_news"]["overall"])
    assert out["overall_avg"]["num_groups"] == 1
    nothing = kscore.aggregate([row("anime", 1, 1, 1, 1, False, success=False)])
    assert nothing["overall_avg"]["overall"] is None and nothing["overall_avg"]["num_groups"] == 0


def test_malformed_judged_row_names_the_row():
    bad = {"id": 17, "success": True, "meta": {"category": "art"}, "scores": {"faithfulness": 1}}
    with pytest.raises(ValueError, match=r"K-Score row 17: K-Score judge output lacks"):
        kscore.aggregate([bad])
    with pytest.raises(ValueError, match=r"K-Score row 'x': success must be a boolean .*got 'ok'"):
        kscore.aggregate([{"id": "x", "success": "ok"}])


def test_summary_rows_and_groups():
    summary = kscore.aggregate(ROWS[:5])
    rows = kscore.summary_rows(summary)
    assert [r["summary_type"] for r in rows] == ["science_and_knowledge", "pop_culture_and_news", "overall_avg"]
    assert kscore.aggregate(ROWS[:5] + rows) == summary  # summary rows are ignored when re-aggregating
    assert kscore.group_of("Multi-Subject-Celebrities") == "pop_culture_and_news" and kscore.group_of(None) is None
    assert sum(len(c) for c in kscore.GROUPS.values()) == 24
