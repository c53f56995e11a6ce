"""K-Score per-sample scoring and the KnowGen aggregation, against hand-computed values."""
import random

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
    # text N/A: recorded as 0.5 whatever the judge wrote, as the published parser does
    assert (score.faithfulness, score.visual_correctness, score.text_accuracy, score.aesthetics) == (1.0, 0.5, 0.5, 0.33)
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
    assert all(set(v) == {"faithfulness", "visual_correctness", "text_accuracy", "aesthetics", "overall"}
               for v in out.values())
    sci, pop, avg = out["science_and_knowledge"], out["pop_culture_and_news"], out["overall_avg"]
    # science: F (1+.5+0)/3, V (1+.5+.5)/3, T over non-N/A rows only (1+0)/2, A (.5+.5+1)/3
    assert sci["faithfulness"] == pytest.approx(0.5) and sci["visual_correctness"] == pytest.approx(2 / 3)
    assert sci["text_accuracy"] == pytest.approx(0.5) and sci["aesthetics"] == pytest.approx(2 / 3)
    assert sci["overall"] == pytest.approx(0.05 + 0.4 * 2 / 3 + 0.4 * 0.5 + 0.1 * 2 / 3)
    # pop culture: F 1, V .5, T only the anime row (1), A .5
    assert (pop["faithfulness"], pop["visual_correctness"], pop["text_accuracy"], pop["aesthetics"]) == (1, 0.5, 1, 0.5)
    assert pop["overall"] == pytest.approx(0.75)
    # overall_avg: unweighted mean of the two groups
    assert avg["faithfulness"] == pytest.approx(0.75) and avg["visual_correctness"] == pytest.approx((2 / 3 + 0.5) / 2)
    assert avg["text_accuracy"] == pytest.approx(0.75) and avg["aesthetics"] == pytest.approx((2 / 3 + 0.5) / 2)
    assert avg["overall"] == pytest.approx((sci["overall"] + 0.75) / 2)
    assert kscore.tally(ROWS) == {"science_and_knowledge": 3, "pop_culture_and_news": 2, "overall_avg": 5,
                                  "generation_failed": 2, "missing_image": 0, "judge_failed": 3,
                                  "unknown_category": 1}


def test_group_without_applicable_text_uses_half():
    out = kscore.aggregate([row("history", 1, 1, 0.5, 1, True), row("game", 0, 0, 1, 0, False),
                            row("Religion", 0, 1, "n/a", 0, "TRUE")])
    assert out["science_and_knowledge"]["text_accuracy"] == 0.5  # both samples N/A (their T is never read)
    assert out["science_and_knowledge"]["overall"] == pytest.approx(0.05 + 0.4 + 0.2 + 0.05)


def test_empty_group_scores_zero_and_still_counts_in_overall_avg():
    out = kscore.aggregate([row("anime", 1, 0.5, 1, 0.5, False)])
    assert out["science_and_knowledge"] == dict.fromkeys(kscore.SUMMARY_KEYS, 0.0)  # as the published code
    assert out["pop_culture_and_news"]["overall"] == pytest.approx(0.1 + 0.2 + 0.4 + 0.05)
    assert out["overall_avg"]["overall"] == pytest.approx(0.75 / 2)
    assert out["overall_avg"]["text_accuracy"] == pytest.approx(0.5)
    nothing = kscore.aggregate([row("anime", 1, 1, 1, 1, False, success=False)])
    assert all(v == 0.0 for group in nothing.values() for v in group.values())


def test_rows_lacking_a_dimension_leave_it_out_of_that_mean():
    partial = {"id": "p", "success": True, "meta": {"category": "Film"},
               "scores": {"faithfulness": 1, "visual_correctness": None, "text_accuracy_na": "false"}}
    out = kscore.aggregate([partial, row("film", 0, 0.5, 1, 1, "0")])
    pop = out["pop_culture_and_news"]
    assert (pop["faithfulness"], pop["visual_correctness"], pop["text_accuracy"], pop["aesthetics"]) == (0.5, 0.5, 1, 1)
    assert kscore.tally([partial])["pop_culture_and_news"] == 1
    # a row without `success` was judged all the same (the published aggregation never reads it)
    assert kscore.aggregate([{k: v for k, v in partial.items() if k != "success"}]) == kscore.aggregate([partial])


def test_missing_image_files_are_skipped_with_base_dir(tmp_path):
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "1.png").write_bytes(b"png")
    (tmp_path / "gt.png").write_bytes(b"png")
    present = row("art", 1, 1, 1, 1, False, output_path="gen/1.png", gt_image=str(tmp_path / "gt.png"))
    absent = row("art", 0, 0, 0, 0, False, id="gone", output_path="gen/2.png", gt_image="gt.png")
    assert kscore.aggregate([present, absent], base_dir=tmp_path)["science_and_knowledge"]["overall"] == 1.0
    assert kscore.tally([present, absent], base_dir=tmp_path)["missing_image"] == 1
    assert kscore.aggregate([present, absent])["science_and_knowledge"]["overall"] == 0.5  # rows trusted as judged


def test_malformed_judged_row_names_the_row():
    bad = {"id": 17, "success": True, "meta": {"category": "art"}, "scores": {"faithfulness": "high"}}
    with pytest.raises(ValueError, match=r"K-Score row 17: score 'faithfulness' must be a number in \[0, 1\], got 'high'"):
        kscore.aggregate([bad])
    with pytest.raises(ValueError, match=r"K-Score row 'x': success must be a boolean .*got 'ok'"):
        kscore.aggregate([{"id": "x", "success": "ok"}])
    with pytest.raises(ValueError, match=r"K-Score row 3: text_accuracy_na must be a boolean .*got 'perhaps'"):
        kscore.aggregate(ROWS[:3] + [{"success": True, "meta": {"category": "art"},
                                      "scores": {"text_accuracy_na": "perhaps"}}])
    with pytest.raises(ValueError, match="K-Score row 0 must be an object, got list"):
        kscore.aggregate([[1]])


def test_summary_rows_and_groups():
    summary = kscore.aggregate(ROWS[:5])
    rows = kscore.summary_rows(summary, kscore.tally(ROWS[:5]))
    assert [r["summary_type"] for r in rows] == ["science_and_knowledge", "pop_culture_and_news", "overall_avg"]
    assert rows[0] == {"summary_type": "science_and_knowledge", "avg_scores": summary["science_and_knowledge"],
                       "count": 3}
    assert [r["count"] for r in rows] == [3, 2, 5] and "count" not in kscore.summary_rows(summary)[0]
    assert kscore.aggregate(ROWS[:5] + rows) == summary  # summary rows are ignored when re-aggregating
    assert kscore.group_of("Multi-Subject-Celebrities") == "pop_culture_and_news" and kscore.group_of(None) is None
    assert sum(len(c) for c in kscore.GROUPS.values()) == 24


def test_aggregate_is_order_free_and_a_mean():
    rng = random.Random(5)
    categories = sorted(kscore.GROUPS["science_and_knowledge"] | kscore.GROUPS["pop_culture_and_news"])
    rows = [row(rng.choice(categories).upper(), *(rng.choice((0, 0.5, 1)) for _ in range(4)), rng.random() < 0.3,
                id=i) for i in range(40)]
    out = kscore.aggregate(rows)
    shuffled = kscore.aggregate(rng.sample(rows, len(rows)))
    assert all(shuffled[g] == pytest.approx(out[g]) for g in out)
    doubled = kscore.aggregate(rows + rows)  # duplicates leave every mean unchanged
    assert all(doubled[g] == pytest.approx(out[g]) for g in out)
    sci = [r["scores"] for r in rows if kscore.group_of(r["meta"]["category"]) == "science_and_knowledge"]
    assert out["science_and_knowledge"]["aesthetics"] == pytest.approx(sum(s["aesthetics"] for s in sci) / len(sci))
    assert all(0 <= v <= 1 for group in out.values() for v in group.values())
