"""Mind-Bench and WISE evals end to end through their scripts (`evals/mind_bench.py`, `evals/wise.py`) against
loopback judge and generator servers, with hand-computed scores and failures counted as the published scorers
count them."""
import json
import runpy
import sys
from pathlib import Path

import pytest

from ranger_jax.evals import store
from support.eval_services import FIXTURES

REPO = Path(__file__).resolve().parents[2]
MIND = FIXTURES / "mind_bench" / "metadata.jsonl"
WISE_FILES = [FIXTURES / "wise" / f"{name}.json"
              for name in ("cultural_common_sense", "spatio-temporal_reasoning", "natural_science")]


def run_script(monkeypatch, name, *args):
    monkeypatch.setattr(sys, "argv", [f"evals/{name}.py", *args])
    runpy.run_path(str(REPO / "evals" / f"{name}.py"), run_name="__main__")


def common(services, out):
    return ["--out", str(out), "--generator-url", services.url, "--judge-url", services.judge_url,
            "--judge-api-key-env", "", "--quiet"]


def test_mind_bench_run(services, tmp_path, monkeypatch):
    # 2_3 passes; 2_4's short reply is padded with false; 5_1 (an edit) passes; 5_2's generation fails.
    # accuracy: overall 2/4, 2_Weather 1/2, 5_Edit 1/2
    services.judge.replies["mind_bench"] = {"Brisk": json.dumps({"results": [True, True, True]}),
                                            "Calder": json.dumps({"results": [True]}),
                                            "trophy stands": json.dumps({"results": [True]})}
    out = tmp_path / "run"
    run_script(monkeypatch, "mind_bench", "--bench", str(MIND), *common(services, out))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scores"]["accuracy"] == {"overall": {"accuracy": 0.5, "passed": 2, "count": 4},
                                             "2_Weather": {"accuracy": 0.5, "passed": 1, "count": 2},
                                             "5_Edit": {"accuracy": 0.5, "passed": 1, "count": 2}}
    assert summary["failures"]["by_stage"] == {"generation": 1}
    # the edit item's input image (the first of its list) went to the generator; the others drew the prompt alone
    assert [refs for prompt, refs in services.generator.calls if "[m3]" in prompt] == [1]
    bodies = {b["messages"][1]["content"][0]["text"].split("\n")[1]: b["messages"][1]["content"]
              for b in services.judge.bodies}
    assert [p.get("text") for p in bodies["1. The town name Brisk is legible."]][3] == \
        "--- Reference Image (Ground Truth) ---"
    assert len(bodies["1. A trophy stands on the table."]) == 3  # its reference file does not exist: left out
    rows = [json.loads(line) for line in (out / "mind_bench" / "results.jsonl").read_text().splitlines()]
    assert [(r["Type"], r["ID"], r["Eval"], r["Image_Name"]) for r in rows] == [
        ("2_Weather", 3, True, "2_3.png"), ("2_Weather", 4, False, "2_4.png"), ("5_Edit", 1, True, "5_1.png"),
        ("5_Edit", 2, False, None)]
    assert rows[1]["Checklist_results"] == [True, False]
    assert (out / "mind_bench" / "images" / "2_3.png").is_file()
    assert "| Overall | 0.500 | 2 | 4 |" in (out / "report.md").read_text()


WISE_REPLIES = {"[w1]": (2, 2, 2), "[w2]": (1, 0, 1), "[w3]": (2, 1, 0), "[w4]": (0, 2, 2), "[w5]": (1, 1, 1),
                "[w6]": (2, 0, 0), "[w7]": (0, 0, 0)}


def wise_replies(**overrides):
    table = {k: f"Consistency: {c}\nRealism: {r}\nAesthetic Quality: {a}" for k, (c, r, a) in WISE_REPLIES.items()}
    return {**table, **overrides}


def test_wise_run_hand_computed(services, tmp_path, monkeypatch):
    # CULTURE (1.0 + .4)/2 = .7, TIME .8, SPACE .3, BIOLOGY .5, PHYSICS .7, CHEMISTRY 0;
    # overall .4·.7 + .167·.8 + .133·.3 + .1·.5 + .1·.7 + .1·0 = .5735
    services.judge.replies["wise"] = wise_replies()
    out = tmp_path / "run"
    run_script(monkeypatch, "wise", "--bench", *map(str, WISE_FILES), *common(services, out))
    result = json.loads((out / "summary.json").read_text())["scores"]["wiscore"]
    assert {c: result[c]["wiscore"] for c in ("CULTURE", "TIME", "SPACE", "BIOLOGY", "PHYSICS", "CHEMISTRY")} == \
        pytest.approx({"CULTURE": 0.7, "TIME": 0.8, "SPACE": 0.3, "BIOLOGY": 0.5, "PHYSICS": 0.7, "CHEMISTRY": 0.0})
    assert result["overall"]["wiscore"] == pytest.approx(0.5735) and result["valid"] and result["complete"]
    assert "| WiScore | 0.70 | 0.80 | 0.30 | 0.50 | 0.70 | 0.00 | 0.57 |" in (out / "report.md").read_text()
    body = next(b for b in services.judge.bodies if "[w5]" in b["messages"][1]["content"][0]["text"])
    assert 'EXPLANATION: "Brown, curled, dry fronds"' in body["messages"][1]["content"][0]["text"]
    rows = [json.loads(line) for line in (out / "wise" / "scores.jsonl").read_text().splitlines()]
    assert [r["prompt_id"] for r in rows] == [1, 2, 401, 568, 701, 801, 901]
    assert rows[0] == {"prompt_id": 1, "Subcategory": "Festival", "consistency": 2.0, "realism": 2.0,
                       "aesthetic_quality": 2.0}
    assert sorted(p.name for p in (out / "wise" / "images").iterdir())[:2] == ["1.png", "2.png"]


def test_wise_failures_count_as_published(services, tmp_path, monkeypatch):
    # w2's image cannot be made (not judged: the run is incomplete); w7's reply has no scores (999: invalid)
    services.judge.replies["wise"] = wise_replies(**{"[w7]": "A fine picture."})
    services.generator.fail_on.add("[w2]")
    out = tmp_path / "run"
    run_script(monkeypatch, "wise", "--bench", *map(str, WISE_FILES), *common(services, out))
    result = json.loads((out / "summary.json").read_text())["scores"]["wiscore"]
    assert not result["valid"] and not result["complete"] and result["overall"]["wiscore"] is None
    assert result["missing_ids"] == [2] and result["failed_ids"] == [901]
    assert result["CULTURE"] == {"wiscore": pytest.approx(1.0), "count": 1} and "CHEMISTRY" not in result
    records = store.RunStore(out).records()
    assert records["901"]["failure"] == {"stage": "judge", "reason": "the reply has no consistency, realism, "
                                                                     "aesthetic_quality score"}
    assert records["901"]["scores"]["consistency"] == 999
    report = (out / "report.md").read_text()
    assert "| WiScore | 1.00 | 0.80 | 0.30 | 0.50 | 0.70 | – | – |" in report
    assert "incomplete: 1 prompts not judged (no image): [2]" in report and "invalid: 1 judge replies" in report
