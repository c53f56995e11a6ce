"""KnowGen eval end to end from the command line (generator alone) against loopback judge and generator servers:
the K-Score of a hand-computed fixture, failures counted as KnowGen_Eval counts them, the upstream files, the
reports, and an interrupted run that resumes to the same scores without redoing finished items."""
import json

import pytest

from ranger_jax.data import knowgen_eval
from ranger_jax.evals import cli, knowgen, store
from support.eval_services import FIXTURES, kscore_reply

BENCH = FIXTURES / "knowgen" / "KnowGen-Bench.json"
# k5's prompt makes the generator fail (skipped); k6's judge never answers usably (excluded); k7's category is in no
# group (skipped). Hand computation of the rest:
#   science (k1, k2): F (1 + .5)/2 = .75, V (1 + .5)/2 = .75, T (0 + 1)/2 = .5, A (.5 + 1)/2 = .75
#                     overall .1·.75 + .4·.75 + .4·.5 + .1·.75 = .65
#   pop (k3, k4):     F (1 + 0)/2 = .5, V (.5 + 0)/2 = .25, T = 1 (k3's text is N/A), A (.5 + 0)/2 = .25
#                     overall .1·.5 + .4·.25 + .4·1 + .1·.25 = .575
#   overall_avg:      F .625, V .5, T .75, A .5, K-Score (.65 + .575)/2 = .6125
REPLIES = {"[k1]": kscore_reply(1, 1, 0, 0.5), "[k2]": kscore_reply(0.5, 0.5, 1, 1),
           "[k3]": kscore_reply(1, 0.5, 0.5, 0.5, na=True), "[k4]": kscore_reply(0, 0, 1, 0),
           "[k6]": "I would rather not say.", "[k7]": kscore_reply(1, 1, 1, 1)}
EXPECTED = {"science_and_knowledge": {"faithfulness": 0.75, "visual_correctness": 0.75, "text_accuracy": 0.5,
                                     "aesthetics": 0.75, "overall": 0.65},
            "pop_culture_and_news": {"faithfulness": 0.5, "visual_correctness": 0.25, "text_accuracy": 1.0,
                                     "aesthetics": 0.25, "overall": 0.575},
            "overall_avg": {"faithfulness": 0.625, "visual_correctness": 0.5, "text_accuracy": 0.75,
                            "aesthetics": 0.5, "overall": 0.6125}}


def argv(services, out, *extra):
    return ["--bench", str(BENCH), "--out", str(out), "--generator-url", services.url, "--judge-url",
            services.judge_url, "--judge-api-key-env", "", "--quiet", "--concurrency", "3", *extra]


def check_scores(groups):
    for group, expected in EXPECTED.items():
        assert groups[group] == pytest.approx(expected, abs=1e-9), group


def test_generator_alone_run_scores_reports_and_upstream_files(services, tmp_path, capsys):
    services.judge.replies["kscore"] = REPLIES
    summary = cli.main("knowgen", argv(services, tmp_path / "run"))
    check_scores(summary["scores"]["groups"])
    assert summary["scores"]["counts"] == {"science_and_knowledge": 2, "pop_culture_and_news": 2, "overall_avg": 4,
                                           "generation_failed": 1, "missing_image": 0, "judge_failed": 1,
                                           "unknown_category": 1}
    assert summary["failures"]["by_stage"] == {"generation": 1, "judge": 1}
    # the prompt alone goes to text-to-image, with Gen-Searcher's suffix, seed pinned to 0
    prompts = {prompt for prompt, refs in services.generator.calls}
    assert f"{json.loads(BENCH.read_text())[0]['prompt']}{knowgen.T2I_SUFFIX}" in prompts
    assert {refs for _, refs in services.generator.calls} == {0}
    # the judge saw the original prompt, the generated image first and the GT second
    body = next(b for b in services.judge.bodies if "[k1]" in b["messages"][1]["content"][0]["text"])
    assert [p["type"] for p in body["messages"][1]["content"]] == ["text", "image_url", "image_url"]
    run = tmp_path / "run"
    table = (run / "report.md").read_text()
    assert "| Overall | 62.50 | 50.00 | 75.00 | 50.00 | 61.25 | 4 |" in table
    assert "generation_failed 1, judge_failed 1, unknown_category 1" in table
    assert "| 9105 | generation | HTTP 400" in table and capsys.readouterr().out.startswith("# knowgen")
    assert (run / "charts" / "k_score_by_group_x100.png").read_bytes()[:4] == b"\x89PNG"
    gallery = (run / "gallery.html").read_text()
    assert gallery.count('<section class="item') == 7 and "Failed at generation" in gallery
    # the upstream layout: results.json for KnowGen_Eval, and our results_eval.json read back by its reader
    results = json.loads((run / "knowgen_eval" / "results.json").read_text())
    assert [r["success"] for r in results] == [True, True, True, True, False, True, True]
    assert (run / "knowgen_eval" / "images" / "9101.png").is_file()
    upstream = knowgen_eval.read_eval_results(run / "knowgen_eval")
    assert upstream.counts == {"science_and_knowledge": 2, "pop_culture_and_news": 2, "overall_avg": 4}
    for group, expected in EXPECTED.items():
        assert upstream.summary[group] == pytest.approx(expected)


class Interrupt(Exception):
    pass


def test_interrupted_run_resumes_to_the_same_scores(services, tmp_path):
    services.judge.replies["kscore"] = REPLIES
    out = tmp_path / "run"
    finished = []

    def stop_after_two(record):
        finished.append(record["id"])
        if len(finished) == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        cli.main("knowgen", argv(services, out, "--concurrency", "1"), on_record=stop_after_two)
    assert sorted(store.RunStore(out).records()) == sorted(finished)
    assert not (out / "summary.json").exists()
    killed = out / "items" / ".9107.partial"  # what a killed process leaves of an item in progress
    killed.mkdir(exist_ok=True)
    (killed / "image.png").write_bytes(b"half")
    calls_before = len(services.generator.calls)
    summary = cli.main("knowgen", argv(services, out))
    assert not list((out / "items").glob(".*"))
    assert len(services.generator.calls) - calls_before == 5  # only the unfinished items are generated again
    check_scores(summary["scores"]["groups"])
    # a rerun of a finished run does nothing; --retry-failed redoes only the failed items (k5 and k6)
    calls_before = len(services.generator.calls)
    assert cli.main("knowgen", argv(services, out))["scores"] == summary["scores"]
    assert len(services.generator.calls) == calls_before
    services.judge.replies["kscore"] = {**REPLIES, "[k6]": kscore_reply(1, 1, 1, 1)}
    retried = cli.main("knowgen", argv(services, out, "--retry-failed"))
    assert len(services.generator.calls) - calls_before == 2
    assert retried["scores"]["counts"]["science_and_knowledge"] == 3 and retried["failures"]["by_stage"] == {
        "generation": 1}


def test_resuming_with_other_settings_and_missing_options_are_refused(services, tmp_path):
    services.judge.replies["kscore"] = REPLIES
    out = tmp_path / "run"
    cli.main("knowgen", argv(services, out, "--limit", "1"))
    with pytest.raises(ValueError, match=r"other settings for \['judge'\]"):
        cli.main("knowgen", argv(services, out, "--judge-model", "another-judge"))
    with pytest.raises(SystemExit):
        cli.main("knowgen", ["--bench", str(BENCH), "--out", str(tmp_path / "x"), "--quiet"])
    with pytest.raises(SystemExit, match=r"judge: \$RANGER_TEST_UNSET_KEY is not set"):
        cli.main("knowgen", [*argv(services, tmp_path / "y"), "--judge-api-key-env", "RANGER_TEST_UNSET_KEY"])


def test_preflight_stops_a_run_whose_generator_does_not_answer(services, tmp_path):
    with pytest.raises(SystemExit, match=r"generator \(http://127.0.0.1:1\): unreachable"):
        cli.main("knowgen", ["--bench", str(BENCH), "--out", str(tmp_path / "run"), "--generator-url",
                             "http://127.0.0.1:1", "--judge-url", services.judge_url, "--judge-api-key-env", ""])
    assert services.generator.calls == []


def test_report_only_rebuilds_the_reports(services, tmp_path):
    services.judge.replies["kscore"] = REPLIES
    out = tmp_path / "run"
    first = cli.main("knowgen", argv(services, out))
    (out / "report.md").unlink()
    calls = len(services.judge.bodies)
    again = cli.main("knowgen", ["--bench", str(BENCH), "--out", str(out), "--report-only"])
    assert again["scores"] == first["scores"] and (out / "report.md").is_file()
    assert len(services.judge.bodies) == calls
