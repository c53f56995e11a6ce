"""The GRPO learner side: complete actor rounds are found oldest first, each once; actors are started and stopped."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ranger_jax.rl import grpo_loop


def _touch(folder, name):
    (folder / name).write_bytes(b"")


def test_rounds_complete_by_metrics_line(tmp_path):
    metrics = tmp_path / "actor0.jsonl"
    reader = grpo_loop.RoundReader(tmp_path, {"actor0": metrics})
    _touch(tmp_path, "actor0-r00000-00000.array_record")
    _touch(tmp_path, "actor0-r00000-00001.array_record")
    assert reader.next_round() is None  # written, but the actor has not finished the round
    metrics.write_text(json.dumps({"round": 0, "shards": 2}) + "\n{partial")
    first = reader.next_round()
    assert [p.name for p in first] == ["actor0-r00000-00000.array_record", "actor0-r00000-00001.array_record"]
    assert reader.next_round() is None  # each round once
    _touch(tmp_path, ".actor0-r00001-00000.array_record.tmp")  # temporaries are never read
    assert reader.next_round() is None


def test_rounds_complete_by_a_later_round_without_metrics(tmp_path):
    reader = grpo_loop.RoundReader(tmp_path)
    _touch(tmp_path, "a-r00003-00000.array_record")
    assert reader.next_round() is None
    _touch(tmp_path, "a-r00004-00000.array_record")
    _touch(tmp_path, "b-r00001-00000.array_record")
    _touch(tmp_path, "b-r00002-00000.array_record")
    assert [p.name for p in reader.next_round()] == ["b-r00001-00000.array_record"]  # oldest round first
    assert [p.name for p in reader.next_round()] == ["a-r00003-00000.array_record"]
    assert reader.next_round() is None


def test_split_rounds_are_read_whole_once_every_actor_finished_its_part(tmp_path):
    """Actors playing parts of each round (`actor --part I/N`): round r is one step, all actors' shards of it,
    ready only when every actor has finished it (a part with no groups wrote no shard but still counts)."""
    metrics = {f"actor{i}": tmp_path / f"actor{i}.jsonl" for i in range(3)}
    reader = grpo_loop.RoundReader(tmp_path, metrics, split_rounds=True)
    for i in range(3):
        _touch(tmp_path, f"actor{i}-r00000-00000.array_record")
    _touch(tmp_path, "actor0-r00001-00000.array_record")
    metrics["actor0"].write_text(json.dumps({"round": 0}) + "\n" + json.dumps({"round": 1}) + "\n")
    metrics["actor1"].write_text(json.dumps({"round": 0}) + "\n")
    assert reader.next_round() is None  # actor2 has not finished round 0
    metrics["actor2"].write_text(json.dumps({"round": 0}) + "\n" + json.dumps({"round": 1}) + "\n{partial")
    assert [p.name for p in reader.next_round()] == [f"actor{i}-r00000-00000.array_record" for i in range(3)]
    assert reader.next_round() is None  # round 1: actor1 is still on it
    metrics["actor1"].write_text(json.dumps({"round": 0}) + "\n" + json.dumps({"round": 1}) + "\n")
    assert [p.name for p in reader.next_round()] == ["actor0-r00001-00000.array_record"]  # the others had no groups
    assert reader.next_round() is None
    for i in range(3):  # round 2 stopped before any group: passed over; round 3 is read
        metrics[f"actor{i}"].write_text("".join(json.dumps({"round": r}) + "\n" for r in range(4)))
    _touch(tmp_path, "actor1-r00003-00000.array_record")
    assert [p.name for p in reader.next_round()] == ["actor1-r00003-00000.array_record"]
    assert reader.next_round() is None
    with pytest.raises(ValueError, match="split_rounds=True. needs the metrics file of every actor"):
        grpo_loop.RoundReader(tmp_path, split_rounds=True)


def test_actors_are_started_and_stopped_with_logs(tmp_path):
    script = "import pathlib, time\nwhile not pathlib.Path(%r).exists(): time.sleep(0.05)\nprint('bye')"
    stop = tmp_path / "w" / "STOP"
    procs = grpo_loop.start_actors([[sys.executable, "-c", script % str(stop)]], tmp_path / "logs")
    assert procs[0].poll() is None
    assert grpo_loop.stop_actors(procs, stop, timeout_s=30) == [0]
    assert "bye" in (tmp_path / "logs" / "actor-0.log").read_text()


def test_every_learner_process_takes_as_many_steps_as_the_busiest(monkeypatch):
    import numpy as np
    import pytest

    from ranger_jax.parallel import host_data

    batch = {"input_ids": np.ones((2, 4), np.int32), "loss_mask": np.ones((2, 4), np.float32),
             "row_valid": np.ones(2, np.float32), "advantages": np.array([0.5, -0.5], np.float32)}
    assert grpo_loop._same_count([batch], []) == [batch]  # one process: nothing to agree on
    monkeypatch.setattr(host_data, "gather_json", lambda value: [value, 3])  # another process holds 3 batches
    padded = grpo_loop._same_count([batch], [])
    assert len(padded) == 3 and padded[0] is batch
    for blank in padded[1:]:
        assert not blank["row_valid"].any() and not blank["loss_mask"].any() and not blank["advantages"].any()
        np.testing.assert_array_equal(blank["input_ids"], batch["input_ids"])
    with pytest.raises(RuntimeError, match=r"got none of the rows of the round \['a-r00003-0.array_record'\] while "
                                           "others got 3 batches"):
        grpo_loop._same_count([], [Path("a-r00003-0.array_record")])


def test_a_round_with_nothing_trainable_gives_no_batches():
    # e.g. the blind control's rounds, where every group's rewards are equal and the filters keep no row
    assert grpo_loop._same_count([], []) == []


def test_loop_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"GrpoLoopConfig.advantages must be one of \['group', 'prefix-tree'\]; "
                                         r"got 'tree'"):
        grpo_loop.GrpoLoopConfig(num_steps=1, advantages="tree")
    with pytest.raises(ValueError, match=r"GrpoLoopConfig.num_steps must be >= 1; got 0"):
        grpo_loop.GrpoLoopConfig(num_steps=0)


def test_an_earlier_attempt_is_cleared_and_named(tmp_path, capsys):
    weights, shards_dir, actor_metrics = tmp_path / "weights", tmp_path / "grpo_shards", tmp_path / "actor0.jsonl"
    (weights / "v000003").mkdir(parents=True)
    shards_dir.mkdir()
    (shards_dir / "actor0-r00000-00000.array_record").write_bytes(b"x")
    actor_metrics.write_text('{"round": 0}\n')
    grpo_loop.clear_earlier_attempt([weights, shards_dir, actor_metrics, tmp_path / "actor1.jsonl"])
    assert not weights.exists() and not shards_dir.exists() and not actor_metrics.exists()
    err = capsys.readouterr().err
    assert "removing the earlier attempt's" in err and str(shards_dir) in err and "actor1" not in err
    grpo_loop.clear_earlier_attempt([weights, shards_dir])  # nothing left: silent
    assert capsys.readouterr().err == ""
