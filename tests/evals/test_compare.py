"""Runs side by side (`evals/compare.py`): the table of headline scores, the chart, the per-item page, and the
errors for runs that cannot be compared."""
import runpy
import sys
from pathlib import Path

import pytest

from ranger_jax.evals import cli, compare
from support.eval_services import FIXTURES, kscore_reply

REPO = Path(__file__).resolve().parents[2]


def knowgen_run(services, out, label, reply):
    services.judge.replies["kscore"] = {f"[k{i}]": reply for i in range(1, 8)}
    cli.main("knowgen", ["--bench", str(FIXTURES / "knowgen" / "KnowGen-Bench.json"), "--out", str(out), "--label",
                         label, "--generator-url", services.url, "--judge-url", services.judge_url,
                         "--judge-api-key-env", "", "--quiet", "--limit", "4"])


def test_two_runs_side_by_side(services, tmp_path, monkeypatch, capsys):
    knowgen_run(services, tmp_path / "a", "weak", kscore_reply(0, 0, 0, 0))  # every sample 0
    knowgen_run(services, tmp_path / "b", "strong", kscore_reply(1, 1, 1, 1))  # every sample 1
    text = compare.compare_runs([tmp_path / "a", tmp_path / "b"], out_dir=tmp_path / "cmp")
    assert text.splitlines()[2:] == ["| run | Science & Knowledge | Pop Culture & News | Overall |",
                                     "|---|---|---|---|",
                                     "| weak | 0.00 | 0.00 | 0.00 |",
                                     "| strong | 100.00 | 100.00 | 100.00 |"]
    assert (tmp_path / "cmp" / "compare.md").read_text() == text
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    page = (tmp_path / "cmp" / "compare.html").read_text()
    assert page.count("<tr><th>") == 1 + 4
    assert "../a/items/9101/image.png" in page and "../b/items/9101/image.png" in page
    monkeypatch.setattr(sys, "argv", ["evals/compare.py", str(tmp_path / "a"), str(tmp_path / "b"), "--labels",
                                      "A", "B"])
    runpy.run_path(str(REPO / "evals" / "compare.py"), run_name="__main__")
    assert "| A | 0.00 | 0.00 | 0.00 |" in capsys.readouterr().out


def test_runs_that_cannot_be_compared(services, tmp_path):
    knowgen_run(services, tmp_path / "a", "same", kscore_reply(1, 0, 1, 0))
    knowgen_run(services, tmp_path / "b", "same", kscore_reply(1, 0, 1, 0))
    text = compare.compare_runs([tmp_path / "a", tmp_path / "b"])
    assert "| same (a) |" in text and "| same (b) |" in text  # equal labels get their folder names
    with pytest.raises(FileNotFoundError, match="has no summary.json: run the eval"):
        compare.compare_runs([tmp_path / "a", tmp_path / "nothing"])
    with pytest.raises(ValueError, match="1 labels for 2 runs"):
        compare.compare_runs([tmp_path / "a", tmp_path / "b"], labels=["x"])
    summary = (tmp_path / "b" / "summary.json")
    summary.write_text(summary.read_text().replace('"benchmark": "knowgen"', '"benchmark": "wise"', 1))
    with pytest.raises(ValueError, match="runs of different benchmarks cannot be compared"):
        compare.compare_runs([tmp_path / "a", tmp_path / "b"])
    with pytest.raises(ValueError, match="at least one run folder"):
        compare.compare_runs([])
