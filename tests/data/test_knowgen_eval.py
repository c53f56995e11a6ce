"""KnowGen_Eval's files: our results exported as its results.json + images, and its results_eval.json read back
(a hand-written file whose summary rows were computed by hand, checked against `rewards.kscore.aggregate` too)."""
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ranger_jax.data import knowgen_eval
from ranger_jax.env import core
from ranger_jax.rewards import kscore

EVAL_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "knowgen" / "results_eval.json"


def picture(colour, size=(12, 8), fmt="PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, fmt)
    return buffer.getvalue()


def test_export_writes_the_scorers_layout(tmp_path):
    gt = tmp_path / "bench" / "gt" / "3260.png"
    gt.parent.mkdir(parents=True)
    gt.write_bytes(picture("blue"))
    results = [
        knowgen_eval.KnowGenResult(id=3260, prompt="A glass frog on a fern.", meta={"category": "Biology"},
                                   gt_image=str(gt), image=Image.new("RGB", (10, 6), "red"), gen_prompt="frog"),
        knowgen_eval.KnowGenResult(id="3261", prompt="A title card.", meta={"category": "Anime"},
                                   gt_image="https://images.example.org/3261.png",
                                   image=picture("yellow", fmt="JPEG"), gen_prompt="card"),
        knowgen_eval.KnowGenResult(id=3263, prompt="A bridge opening.", meta={"category": "News"},
                                   gt_image=str(gt), error="HTTP 503 from http://gen:8001/generate: All GPUs are busy"),
    ]
    out = tmp_path / "run"
    path = knowgen_eval.export_results(results, out)
    assert path == out / "results.json"
    rows = json.loads(path.read_text())
    assert rows == [
        {"id": 3260, "success": True, "prompt": "A glass frog on a fern.", "gen_prompt": "frog",
         "meta": {"category": "Biology"}, "gt_image": str(gt), "output_path": "./images/3260.png"},
        {"id": "3261", "success": True, "prompt": "A title card.", "gen_prompt": "card", "meta": {"category": "Anime"},
         "gt_image": "https://images.example.org/3261.png", "output_path": "./images/3261.png"},
        {"id": 3263, "success": False, "prompt": "A bridge opening.", "gen_prompt": "", "meta": {"category": "News"},
         "gt_image": str(gt), "output_path": "./images/3263.png",
         "error": "HTTP 503 from http://gen:8001/generate: All GPUs are busy"},
    ]
    # the scorer resolves relative paths against the results file's folder
    with Image.open(out / rows[0]["output_path"]) as image:
        assert image.format == "PNG" and image.size == (10, 6) and image.getpixel((3, 3)) == (255, 0, 0)
    with Image.open(out / rows[1]["output_path"]) as image:
        assert image.format == "PNG" and image.mode == "RGB" and image.size == (12, 8)
    assert not (out / "images" / "3263.png").exists()

    copied = knowgen_eval.export_results(results[:1], tmp_path / "alone", copy_ground_truth=True)
    row = json.loads(copied.read_text())[0]
    assert row["gt_image"] == "./gt_image/answer_3260.png"
    assert (tmp_path / "alone" / row["gt_image"]).read_bytes() == gt.read_bytes()


def test_export_errors_name_the_item(tmp_path):
    clash = [knowgen_eval.KnowGenResult(id="a/b", prompt="x", image=picture("red")),
             knowgen_eval.KnowGenResult(id="a_b", prompt="y", image=picture("red"))]
    with pytest.raises(ValueError, match="KnowGen items 'a/b' and 'a_b' both map to the file name 'a_b'"):
        knowgen_eval.export_results(clash, tmp_path / "o")
    broken = [knowgen_eval.KnowGenResult(id=7, prompt="x", image=b"not an image")]
    with pytest.raises(ValueError, match="KnowGen item 7: the generated image cannot be read"):
        knowgen_eval.export_results(broken, tmp_path / "o")
    missing = [knowgen_eval.KnowGenResult(id=8, prompt="x", gt_image=str(tmp_path / "no.png"), image=picture("red"))]
    with pytest.raises(FileNotFoundError, match="KnowGen item 8: ground-truth image .*no.png does not exist"):
        knowgen_eval.export_results(missing, tmp_path / "o", copy_ground_truth=True)


def test_result_from_trajectory(make_trajectory):
    task = core.Task("3260", "A glass frog.", ground_truth="/gt/3260.png",
                     metadata={"category": "Biology", "difficulty": "easy", "today": "2031-01-02"})
    result = knowgen_eval.result_from_trajectory(task, make_trajectory(0))
    assert (result.id, result.prompt, result.gt_image) == ("3260", "A glass frog.", "/gt/3260.png")
    assert result.meta == {"category": "Biology", "difficulty": "easy"} and result.error is None
    assert result.gen_prompt == "A red <lighthouse> & sea" and result.image[:8] == b"\x89PNG\r\n\x1a\n"
    failed = knowgen_eval.result_from_trajectory(
        task, make_trajectory(1, answer=None, generated_image=None, termination=core.MAX_TURNS))
    assert failed.image is None and failed.gen_prompt == ""
    assert failed.error == f"no generated image (episode ended with {core.MAX_TURNS})"


def test_read_eval_results_matches_the_published_aggregation():
    results = knowgen_eval.read_eval_results(EVAL_FILE)
    assert [row["id"] for row in results.rows] == [3260, 3262, 3261, 3263, 3264]
    assert results.counts == {"science_and_knowledge": 2, "pop_culture_and_news": 1, "overall_avg": 3}
    hand = {"science_and_knowledge": [0.75, 0.75, 1.0, 0.25, 0.8], "pop_culture_and_news": [1.0, 0.0, 0.0, 0.5, 0.15],
            "overall_avg": [0.875, 0.375, 0.5, 0.375, 0.475]}
    ours = kscore.aggregate(results.rows)
    for group, values in hand.items():
        np.testing.assert_allclose([results.summary[group][k] for k in knowgen_eval.SCORE_KEYS], values)
        np.testing.assert_allclose([ours[group][k] for k in knowgen_eval.SCORE_KEYS], values)
    scores = results.scores()
    assert scores["3263"] is None and scores["3264"] is None and scores["3262"]["overall"] == 0.85
    assert knowgen_eval.read_eval_results(EVAL_FILE.parent).counts == results.counts  # a folder: its results_eval


def _edited(tmp_path, edit):
    rows = json.loads(EVAL_FILE.read_text())
    edit(rows)
    path = tmp_path / "results_eval.json"
    path.write_text(json.dumps(rows))
    return path


BROKEN = [
    (lambda rows: rows[1]["scores"].pop("overall"), r"row 1 field 'scores.overall': missing"),
    (lambda rows: rows[0]["scores"].update(faithfulness=1.5), r"row 0 field 'scores.faithfulness': must be a number"),
    (lambda rows: rows[2].update(eval_success="yes"), r"row 2 field 'eval_success': must be true or false"),
    (lambda rows: rows[3].update(scores={"overall": 0}), r"row 3 field 'scores': must be null when eval_success"),
    (lambda rows: rows[0].pop("id"), r"row 0 field 'id': missing"),
    (lambda rows: rows[5].update(count=-1), r"row 5 field 'count': must be an integer >= 0"),
    (lambda rows: rows[6]["avg_scores"].pop("aesthetics"), r"row 6 field 'avg_scores.aesthetics': missing"),
    (lambda rows: rows[7].update(summary_type="total"), r"row 7 field 'summary_type': 'total' is not one of"),
    (lambda rows: rows.pop(), r"field 'summary_type': no summary row for \['overall_avg'\]"),
    (lambda rows: rows.append(dict(rows[5])), r"row 8 field 'summary_type': 'science_and_knowledge' appears twice"),
    (lambda rows: rows.append(dict(rows[0])), r"row 8: an item row after the summary rows"),
    (lambda rows: rows.insert(0, [1, 2]), r"row 0: must be an object, got list"),
]


@pytest.mark.parametrize("edit,message", BROKEN)
def test_broken_eval_files_name_file_row_and_field(tmp_path, edit, message):
    with pytest.raises(knowgen_eval.KnowGenFormatError, match=message):
        knowgen_eval.read_eval_results(_edited(tmp_path, edit))


def test_unreadable_eval_files(tmp_path):
    (tmp_path / "a.json").write_text('{"rows": []}')
    with pytest.raises(knowgen_eval.KnowGenFormatError, match=r"a.json: must hold a JSON array, got dict"):
        knowgen_eval.read_eval_results(tmp_path / "a.json")
    (tmp_path / "b.json").write_text("[{")
    with pytest.raises(knowgen_eval.KnowGenFormatError, match=r"b.json: not valid JSON"):
        knowgen_eval.read_eval_results(tmp_path / "b.json")
    with pytest.raises(FileNotFoundError, match="KnowGen eval file .*results_eval.json does not exist"):
        knowgen_eval.read_eval_results(tmp_path)
