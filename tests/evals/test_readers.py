"""The benchmark readers on the fixture files and on broken ones: every error names the file, the row and the field."""
import json
from pathlib import Path

import pytest

from ranger_jax.evals import items, knowgen, mind_bench, savanna, wise
from support.eval_services import FIXTURES


def write(path: Path, rows, *, lines: bool = True) -> Path:
    text = "\n".join(json.dumps(r) for r in rows) if lines else json.dumps(rows)
    path.write_text(text)
    return path


def test_knowgen_items():
    found = knowgen.load_items(FIXTURES / "knowgen" / "KnowGen-Bench.json")
    assert [i.id for i in found] == [str(9101 + k) for k in range(7)]
    first = found[0]
    assert first.category == "Biology" and first.subcategory == "easy" and first.meta == {"category": "Biology",
                                                                                         "difficulty": "easy"}
    assert first.ground_truth == (str(FIXTURES / "knowgen" / "gt" / "k1.png"),)
    assert first.task().prompt == first.prompt and first.task().ground_truth == first.ground_truth[0]


def test_knowgen_broken_file(tmp_path):
    path = write(tmp_path / "bench.jsonl", [{"id": 1, "prompt": "p", "gt_image": "a.png"}, {"id": 2, "gt_image": "b"}])
    with pytest.raises(ValueError, match=r"bench.jsonl line 2 field 'prompt': must be a non-empty string, got missing"):
        knowgen.load_items(path)


def test_savanna_items():
    found = savanna.load_items(FIXTURES / "savanna" / "items.jsonl")
    assert [(i.id, i.category, i.subcategory) for i in found] == [
        ("s1", "Sports", "General Sports"), ("s2", "Entertainment", "Collectibles"), ("s3", "Products", "Electronics"),
        ("s4", "Culture", "Festivals")]
    s1 = found[0]
    assert s1.ground_truth == tuple(str(FIXTURES / "savanna" / "gt" / f"s1_{k}.png") for k in (0, 1))
    assert s1.criteria == ("worn by a player", "during a match") and s1.today == "2031-03-02"
    assert s1.task().metadata["today"] == "2031-03-02" and found[1].target == "" and found[2].criteria == ()


GOOD = {"id": "a", "prompt": "p", "domain": "Sports", "gt_images": ["g.png"]}


@pytest.mark.parametrize("row, match", [
    ({**GOOD, "prompt": ""}, r"line 2 field 'prompt': must be a non-empty string"),
    ({**GOOD, "domain": "Food"}, r"line 2 field 'domain': 'Food' is not one of \['Entertainment'"),
    ({**GOOD, "gt_images": []}, r"line 2 field 'gt_images': needs at least one ground-truth image"),
    ({**GOOD, "gt_images": ["g.png", 3]}, r"line 2 field 'gt_images\[1\]': must be a non-empty string"),
    ({**GOOD, "context_criteria": "x", "gt_images": {"a": 1}}, r"field 'gt_images': must be a list of strings"),
    ({**GOOD, "today": "yesterday"}, r"line 2 field 'today': must be a YYYY-MM-DD date"),
    ({**GOOD, "id": True}, r"line 2 field 'id': must be a string or an integer"),
    ({**GOOD, "id": "b"} | {"id": "a"}, r"line 2 field 'id': id 'a' repeats the one of line 1"),
    (["not", "an", "object"], r"line 2: an item row must be an object, got list"),
])
def test_savanna_broken_rows(tmp_path, row, match):
    with pytest.raises(items.ItemFormatError, match=match):
        savanna.load_items(write(tmp_path / "items.jsonl", [GOOD, row]))


def test_broken_files(tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps(GOOD) + "\n{not json\n")
    with pytest.raises(items.ItemFormatError, match=r"bad.jsonl line 2: not valid JSON"):
        savanna.load_items(tmp_path / "bad.jsonl")
    (tmp_path / "bad.json").write_text('[\n  {"id": "a"},\n  oops\n]')
    with pytest.raises(items.ItemFormatError, match=r"bad.json line 3: not valid JSON"):
        savanna.load_items(tmp_path / "bad.json")
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(items.ItemFormatError, match="empty.json: holds no items"):
        savanna.load_items(tmp_path / "empty.json")
    with pytest.raises(FileNotFoundError, match="benchmark file .*missing.jsonl does not exist"):
        savanna.load_items(tmp_path / "missing.jsonl")


def test_mind_bench_items(tmp_path):
    found = mind_bench.load_items(FIXTURES / "mind_bench" / "metadata.jsonl")
    assert [(i.id, i.category, i.subcategory) for i in found] == [
        ("2_3", "2_Weather", "T2I"), ("2_4", "2_Weather", "T2I"), ("5_1", "5_Edit", "I2I"), ("5_2", "5_Edit", "T2I")]
    first, text_only, edit, _ = found
    assert first.ground_truth == (str(FIXTURES / "mind_bench" / "refs" / "weather_ref.png"),)
    assert text_only.ground_truth == () and first.criteria[0] == "The town name Brisk is legible."
    assert edit.inputs == (str(FIXTURES / "mind_bench" / "inputs" / "edit_input.png"),)
    assert first.meta == {"Type": "2_Weather", "ID": 3}
    moved = mind_bench.load_items(FIXTURES / "mind_bench" / "metadata.jsonl", reference_root=tmp_path,
                                  image_root=tmp_path / "in")
    assert moved[0].ground_truth == (str(tmp_path / "refs" / "weather_ref.png"),)
    assert moved[2].inputs == (str(tmp_path / "in" / "inputs" / "edit_input.png"),)
    assert mind_bench._reference({"image": []}) == "" and mind_bench._reference("a photo.jpg") == "a photo.jpg"


MIND = {"Type": "1_SpecialEvent", "ID": 6, "Prompt": "p", "Checklist": ["c"]}


@pytest.mark.parametrize("row, match", [
    ({**MIND, "Type": None}, r"line 2 field 'Type': must be a non-empty string, got NoneType"),
    ({**MIND, "ID": False}, r"line 2 field 'ID': must be an integer or a string"),
    ({**MIND, "Checklist": []}, r"line 2 field 'Checklist': must be a non-empty list of checks"),
    ({**MIND, "Checklist": ["ok", ""]}, r"line 2 field 'Checklist\[1\]': must be a non-empty string"),
    ({**MIND, "Type": "1_Other"}, r"line 2 field 'id': id '1_6' repeats the one of line 1"),
])
def test_mind_bench_broken_rows(tmp_path, row, match):
    with pytest.raises(items.ItemFormatError, match=match):
        mind_bench.load_items(write(tmp_path / "meta.jsonl", [MIND, row]))


def test_wise_items():
    found = wise.load_items([FIXTURES / "wise" / f"{n}.json" for n in ("cultural_common_sense",
                                                                       "spatio-temporal_reasoning", "natural_science")])
    assert [(i.id, i.category, i.subcategory) for i in found] == [
        ("1", "CULTURE", "Festival"), ("2", "CULTURE", "Art"), ("401", "TIME", "Longitudinal time"),
        ("568", "SPACE", "different view"), ("701", "BIOLOGY", "State"), ("801", "PHYSICS", "Mechanics"),
        ("901", "CHEMISTRY", "Solution Chemical Reaction")]
    assert found[0].explanation == "Round honey cakes stamped with a lantern" and found[0].meta["prompt_id"] == 1
    assert len(wise.load_items(FIXTURES / "wise" / "natural_science.json")) == 3


WISE_ROW = {"Prompt": "p", "Explanation": "e", "Category": "Biology", "Subcategory": "State", "prompt_id": 701}


@pytest.mark.parametrize("row, match", [
    ({**WISE_ROW, "prompt_id": "702"}, r"row 1 field 'prompt_id': must be an integer"),
    ({**WISE_ROW, "prompt_id": 1200}, r"row 1 field 'prompt_id': 1200 is outside the published WISE ranges"),
    ({**WISE_ROW, "prompt_id": 650}, r"row 1 field 'Category': 'Biology' disagrees with prompt_id 650, which the "
                                     r"published scorer counts as SPACE"),
    ({**WISE_ROW, "prompt_id": 702, "Explanation": None}, r"row 1 field 'Explanation': must be a non-empty string"),
    (WISE_ROW, r"row 1 field 'prompt_id': 701 repeats the one of .*row 0"),
])
def test_wise_broken_rows(tmp_path, row, match):
    with pytest.raises(items.ItemFormatError, match=match):
        wise.load_items(write(tmp_path / "science.json", [WISE_ROW, row], lines=False))


def test_wise_ids_repeat_across_files(tmp_path):
    first = write(tmp_path / "a.json", [WISE_ROW], lines=False)
    second = write(tmp_path / "b.json", [WISE_ROW], lines=False)
    with pytest.raises(items.ItemFormatError, match=r"b.json row 0 field 'prompt_id': 701 repeats the one of .*a.json"):
        wise.load_items([first, second])
