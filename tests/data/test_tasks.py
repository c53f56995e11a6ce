"""`ranger_jax.data.load_tasks` on each published task format (hand-written files under tests/fixtures/task_files),
and on broken copies of each: the error names the file, the line or row and the field."""
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ranger_jax import data
from ranger_jax.data import sft_file, tasks
from ranger_jax.env.sim import build

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "task_files"


@pytest.fixture
def files(tmp_path):
    """A copy of the fixture folder (relative GT paths then resolve inside tmp_path)."""
    shutil.copytree(FIXTURES, tmp_path / "files")
    return tmp_path / "files"


def test_gen_searcher_rl_data(files):
    first, second = data.load_tasks(files / "rl_data.json")
    assert (first.id, second.id) == ("1001", "1002")
    assert first.prompt.startswith("A poster for the 2031 Lakeside Lantern Festival")
    assert first.ground_truth == str(files / "gt_images/1001.png")  # relative: against the file's folder
    assert second.ground_truth == "/data/gen_searcher/gt_images/1002.png"  # absolute: as written
    assert first.metadata == {} and second.metadata == {}


def test_knowgen_bench_as_array_and_as_json_lines(files):
    biology, anime = data.load_tasks(files / "KnowGen-Bench.json")
    assert (biology.id, biology.metadata) == ("3260", {"category": "Biology", "difficulty": "easy"})
    assert biology.ground_truth == str(files / "gt_image/answer_3260.png")
    assert anime.metadata["difficulty"] == "multiple subject"
    facade, news = data.load_tasks(files / "KnowGen-Bench.jsonl")  # the blank line between rows is skipped
    assert facade.ground_truth == str(files / "gt_image/answer_3262.png")
    assert news.ground_truth == "https://images.example.org/3263.png"  # legacy `gen_image`, a URL kept as is
    assert (news.id, news.metadata["category"]) == ("3263", "News")


REGISTERED = [  # what register_gen_rl_dataset.py's process_data hands to rllm's registry
    {"id": "0", "question": "The crest of the invented Northfold Rowing Club, embroidered on a blazer.",
     "gt_image": "/data/gt/11.png"},
    {"id": "1", "question": "A stamp issued for the fictional Corran Lighthouse centenary.",
     "gt_image": "gt/12.png"},
]


def test_registered_parquet_and_its_verl_copy(tmp_path):
    pq.write_table(pa.Table.from_pylist(REGISTERED), tmp_path / "train.parquet")
    verl = [{"prompt": [{"role": "user", "content": "placeholder"}],
             "reward_model": {"style": "rule", "ground_truth": None}, "extra_info": row} for row in REGISTERED]
    pq.write_table(pa.Table.from_pylist(verl), tmp_path / "train_verl.parquet")
    for name in ("train.parquet", "train_verl.parquet"):
        crest, stamp = data.load_tasks(tmp_path / name)
        assert (crest.id, crest.prompt, crest.ground_truth) == ("0", REGISTERED[0]["question"], "/data/gt/11.png")
        assert (stamp.id, stamp.ground_truth) == ("1", str(tmp_path / "gt/12.png"))
    (tmp_path / "registered.jsonl").write_text("\n".join(json.dumps(r) for r in REGISTERED))
    assert [t.prompt for t in data.load_tasks(tmp_path / "registered.jsonl")] == [r["question"] for r in REGISTERED]


def test_sft_file_and_its_dataset_info_entry(files):
    mascot, novel = data.load_tasks(files / "sft_data.json")
    assert mascot.prompt == "Draw the mascot of the invented Saltmarsh Marathon 2030 holding the finisher medal."
    assert (mascot.id, novel.id, mascot.ground_truth, novel.metadata) == ("0", "1", None, {"sft_row": 1})
    # the only sharegpt entry with a local file is picked; naming it gives the same tasks
    for path in (files / "dataset_info.json", f"{files / 'dataset_info.json'}#gen_sft", files):
        assert [t.prompt for t in data.load_tasks(path)] == [mascot.prompt, novel.prompt]


def test_task_jsonl_with_today_and_an_offline_world(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a", "prompt": "Draw it", "today": "2031-05-04", "meta": {"category": "Sports"}}\n')
    (task,) = data.load_tasks(path)
    assert task.metadata == {"category": "Sports", "today": "2031-05-04"} and task.ground_truth is None
    world = build.build_world(tmp_path / "world", 2, 5)
    from_folder, from_file = data.load_tasks(world), data.load_tasks(world / "tasks.jsonl")
    assert [t.id for t in from_folder] == [t.id for t in from_file] and len(from_folder) == 2
    assert from_folder[0].ground_truth["image_file"]  # the world's exact ground truth, not a bare prompt row


BROKEN = [  # (file name, content, the message the error must carry)
    ("rl_data.json", '[{"id": 1, "prompt": "ok", "gt_image": "a.png"},\n {"id": 2, "gt_image": "b.png"}]',
     r"rl_data.json row 1 field 'prompt': must be a non-empty string, got missing"),
    ("rl_data.json", '[{"id": 1, "prompt": "ok"},\n {"id": 2, "prompt": "x",}]',
     r"rl_data.json line 2: not valid JSON"),
    ("rl_data.json", '[{"id": true, "prompt": "ok"}]', r"row 0 field 'id': must be a string or an integer, got bool"),
    ("rl_data.json", '[{"id": 1, "prompt": "ok", "gt_image": 7}]', r"row 0 field 'gt_image': must be an image path"),
    ("rl_data.json", '[{"id": 1, "prompt": "a"}, {"id": "1", "prompt": "b"}]',
     r"row 1 field 'id': id '1' repeats the one of row 0"),
    ("rl_data.json", "[]", r"rl_data.json: holds no task rows"),
    ("KnowGen-Bench.jsonl", '{"id": 1, "prompt": "a", "meta": {"category": "Film"}}\n\n{"id": 2, "prompt": ',
     r"KnowGen-Bench.jsonl line 3: not valid JSON"),
    ("KnowGen-Bench.jsonl", '{"id": 1, "prompt": "a", "meta": ["Film"]}',
     r"line 1 field 'meta': must be an object, got list"),
    ("KnowGen-Bench.jsonl", '{"id": 1, "prompt": "a", "meta": {"category": 4}}',
     r"line 1 field 'meta.category': must be a string"),
    ("KnowGen-Bench.jsonl", '"just a string"', r"line 1: a task row must be an object, got str"),
    ("tasks.jsonl", '{"id": 1, "prompt": "a", "today": "May 4"}', r"line 1 field 'today': must be a YYYY-MM-DD"),
]


@pytest.mark.parametrize("name,content,message", BROKEN)
def test_broken_row_files_name_file_row_and_field(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(tasks.TaskFormatError, match=message):
        data.load_tasks(path)


def test_broken_parquet_and_sft_files(tmp_path, files):
    pq.write_table(pa.Table.from_pylist([{"id": "0", "question": "q", "gt_image": None},
                                         {"id": "1", "question": "", "gt_image": "x.png"}]), tmp_path / "t.parquet")
    with pytest.raises(tasks.TaskFormatError, match=r"t.parquet row 1 field 'question': must be a non-empty"):
        data.load_tasks(tmp_path / "t.parquet")
    pq.write_table(pa.Table.from_pylist([{"name": "x"}]), tmp_path / "other.parquet")
    with pytest.raises(tasks.TaskFormatError, match=r"other.parquet: columns \['name'\] hold no task"):
        data.load_tasks(tmp_path / "other.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(tasks.TaskFormatError, match="bad.parquet: not a readable parquet file"):
        data.load_tasks(tmp_path / "bad.parquet")
    rows = json.loads((files / "sft_data.json").read_text())
    rows[1]["messages"][2]["role"] = "gpt"  # a role tag the entry does not declare
    (files / "sft_data.json").write_text(json.dumps(rows))
    with pytest.raises(sft_file.SftFormatError, match=r"sft_data.json row 1 field 'messages\[2\].role'"):
        data.load_tasks(files / "sft_data.json")
    rows[1]["messages"][2]["role"] = "assistant"
    rows[0]["messages"][1]["content"] = "<image> draw this"
    rows[0]["images"] = ["a.png", "b.png"]
    (files / "sft_data.json").write_text(json.dumps(rows))
    with pytest.raises(tasks.TaskFormatError, match=r"row 0 field 'messages\[user\]': the first user turn holds"):
        data.load_tasks(files / "sft_data.json")
    with pytest.raises(sft_file.SftFormatError, match=r"field 'nope': no such dataset entry"):
        data.load_tasks(f"{files / 'dataset_info.json'}#nope")
    info = json.loads((files / "dataset_info.json").read_text())
    info["copy"] = dict(info["gen_sft"])
    (files / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(tasks.TaskFormatError, match=r"2 sharegpt entries with a local file \(\['copy', 'gen_sft'\]\)"):
        data.load_tasks(files / "dataset_info.json")
    with pytest.raises(FileNotFoundError, match="task file .*missing.json does not exist"):
        data.load_tasks(tmp_path / "missing.json")
