"""Shard IO: round trip, atomic publish (a writer killed mid-shard leaves nothing readable), Grain source."""
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import grain
import numpy as np
import pytest
from array_record.python import array_record_module

from ranger_jax.data import shards

REPO = Path(__file__).resolve().parents[2]
KILLED_WRITER = """
import sys
import numpy as np
from ranger_jax.data import shards, trajectory
writer = shards.ShardWriter(sys.argv[1])
for i in range(int(sys.argv[2])):
    writer.write(trajectory.Trajectory(task_id=f"t{i}", group_id="g", sample_index=i, policy_version=0,
                                       token_ids=np.arange(64), loss_mask=np.zeros(64, np.int8),
                                       sampler_logprobs=np.zeros(64)))
print("written", flush=True)
sys.stdin.read()  # the parent kills us here, before close()
"""


def test_write_read_roundtrip_and_listing(tmp_path, make_trajectory):
    items = [make_trajectory(i) for i in range(5)]
    path = shards.write_shard(tmp_path / "s-00000.array_record", items)
    assert list(shards.read_shard(path)) == items
    assert shards.list_shards(tmp_path) == [path] and shards.list_shards([path]) == [path]
    assert os.listdir(tmp_path) == ["s-00000.array_record"]  # no temporary left behind
    with pytest.raises(FileExistsError, match=r"s-00000.array_record already exists; pass overwrite=True"):
        shards.ShardWriter(path)
    shards.write_shard(path, items[:2], overwrite=True)
    assert len(list(shards.read_shard(path))) == 2


def test_writer_killed_mid_shard_leaves_no_readable_shard(tmp_path, make_trajectory):
    done = shards.write_shard(tmp_path / "a-00000.array_record", [make_trajectory(0)])
    target = tmp_path / "a-00001.array_record"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(target), "20"], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "written", proc.stderr.read()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    assert not target.exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != done.name]
    assert len(leftovers) == 1 and leftovers[0].startswith(".a-00001.array_record.") and leftovers[0].endswith(".tmp")
    assert shards.list_shards(tmp_path) == [done]
    source = shards.TrajectorySource(tmp_path)
    assert len(source) == 1 and source[0].task_id == "task-0"
    with pytest.raises(FileNotFoundError, match="a-00001.array_record does not exist"):
        shards.list_shards([target])
    assert shards.remove_stale_temporaries(tmp_path, older_than_s=3600) == []
    assert [p.name for p in shards.remove_stale_temporaries(tmp_path, older_than_s=0)] == leftovers
    assert os.listdir(tmp_path) == [done.name]


def test_exception_in_with_block_discards_the_shard(tmp_path, make_trajectory):
    with pytest.raises(RuntimeError, match="rollout crashed"):
        with shards.ShardWriter(tmp_path / "x.array_record") as writer:
            writer.write(make_trajectory(0))
            raise RuntimeError("rollout crashed")
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match=r"shard writer for .*x.array_record is aborted"):
        writer.write(make_trajectory(0))


def test_writer_errors(tmp_path, make_trajectory):
    with pytest.raises(ValueError, match="starts with '.', which readers treat as temporary"):
        shards.ShardWriter(tmp_path / ".hidden.array_record")
    writer = shards.ShardWriter(tmp_path / "y.array_record")
    with pytest.raises(TypeError, match="takes a Trajectory, got dict"):
        writer.write({"task_id": "x"})
    writer.write(make_trajectory(0))
    (tmp_path / "y.array_record").write_bytes(b"someone else")
    with pytest.raises(FileExistsError, match="appeared while writing; not replaced"):
        writer.close()
    assert sorted(os.listdir(tmp_path)) == ["y.array_record"]
    with pytest.raises(ValueError, match="is closed"):
        writer.close()
    with pytest.raises(FileNotFoundError, match="shard .*nope.array_record does not exist"):
        next(shards.read_shard(tmp_path / "nope.array_record"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no completed .array_record shards in .*empty"):
        shards.TrajectorySource(tmp_path / "empty")
    with pytest.raises(ValueError, match="records_per_shard must be >= 1"):
        shards.RollingShardWriter(tmp_path, records_per_shard=0)


def test_rolling_writer(tmp_path, make_trajectory):
    with shards.RollingShardWriter(tmp_path, prefix="actor0", records_per_shard=3) as writer:
        for i in range(7):
            writer.write(make_trajectory(i))
        assert len(writer.shards) == 2  # full shards are published as soon as they fill
    assert [p.name for p in shards.list_shards(tmp_path)] == [f"actor0-0000{i}.array_record" for i in range(3)]
    assert [len(list(shards.read_shard(p))) for p in writer.shards] == [3, 3, 1]
    aborted = shards.RollingShardWriter(tmp_path / "b", records_per_shard=5)
    aborted.write(make_trajectory(0))
    aborted.abort()
    assert os.listdir(tmp_path / "b") == []


def test_grain_source_shuffles_maps_and_pickles(tmp_path, make_trajectory):
    shards.write_shard(tmp_path / "g-00000.array_record", [make_trajectory(i) for i in range(4)])
    shards.write_shard(tmp_path / "g-00001.array_record", [make_trajectory(i) for i in range(4, 6)])
    source = shards.TrajectorySource(tmp_path)
    assert len(source) == 6 and isinstance(source, grain.sources.RandomAccessDataSource)
    assert [source[i].task_id for i in range(6)] == [f"task-{i}" for i in range(6)]
    clone = pickle.loads(pickle.dumps(source))
    assert clone[5] == source[5] and "g-00001.array_record" in repr(clone)
    arrays = shards.TrajectorySource(tmp_path, as_arrays=True)
    dataset = grain.MapDataset.source(arrays).shuffle(seed=0).map(lambda a: (a["task_id"], float(a["reward"])))
    seen = [dataset[i] for i in range(len(dataset))]
    assert sorted(t for t, _ in seen) == [f"task-{i}" for i in range(6)]
    assert [t for t, _ in seen] != [f"task-{i}" for i in range(6)]  # seeded shuffle: a fixed, non-identity order
    assert all(r == 0.25 * (int(t.split("-")[1]) % 4) for t, r in seen)
    first = arrays[0]
    np.testing.assert_array_equal(first["token_ids"], make_trajectory(0).token_ids)


def test_empty_and_many_record_shards_through_grain(tmp_path, make_trajectory):
    empty = shards.write_shard(tmp_path / "a-empty.array_record", [])
    assert list(shards.read_shard(empty)) == [] and shards.num_records(empty) == 0
    items = [make_trajectory(i % 5, num_images=i % 3) for i in range(257)]
    shards.write_shard(tmp_path / "b-many.array_record", items)
    source = shards.TrajectorySource(tmp_path)  # the empty shard is listed first and holds no index
    assert len(source) == 257 and source.locate(0) == (tmp_path / "b-many.array_record", 0)
    assert source[256] == items[256] and source[-1] == items[256] and source[130] == items[130]
    with pytest.raises(IndexError, match="record 257 out of range for 257 records in 2 shards"):
        source[257]
    batches = grain.MapDataset.source(source).shuffle(seed=3).batch(16, batch_fn=lambda ts: [t.num_tokens for t in ts])
    assert sum(len(b) for b in batches) == 257 and len(batches) == 17


def test_damaged_shards_name_the_shard_and_record(tmp_path, make_trajectory):
    good = shards.write_shard(tmp_path / "good.array_record", [make_trajectory(i, num_images=3) for i in range(40)])
    data = bytearray(good.read_bytes())
    data[len(data) // 5] ^= 0xFF  # one flipped byte inside a record chunk (riegeli's chunk hash catches it)
    flipped = tmp_path / "flipped.array_record"
    flipped.write_bytes(bytes(data))
    with pytest.raises(shards.CorruptShardError, match=r"shard .*flipped.array_record record \d+ cannot be read: "
                                                       r"Corrupted Riegeli"):
        list(shards.read_shard(flipped))
    source = shards.TrajectorySource([flipped])
    with pytest.raises(shards.CorruptShardError, match=r"flipped.array_record record \d+ cannot be read"):
        [source[i] for i in range(len(source))]
    truncated = tmp_path / "truncated.array_record"
    truncated.write_bytes(good.read_bytes()[: len(data) // 2])
    garbage = tmp_path / "garbage.array_record"
    garbage.write_bytes(b"not an array record")
    for bad in (truncated, garbage):
        with pytest.raises(shards.CorruptShardError, match=rf"shard .*{bad.name} is not a readable ArrayRecord file"):
            next(shards.read_shard(bad))
        with pytest.raises(shards.CorruptShardError, match=bad.name):
            shards.TrajectorySource([good, bad])
    # a record that is intact on disk but not a trajectory
    foreign = array_record_module.ArrayRecordWriter(str(tmp_path / "foreign.array_record"), "group_size:1")
    foreign.write(b"XXXXXXXX not a trajectory")
    foreign.close()
    with pytest.raises(shards.CorruptShardError, match=r"foreign.array_record record 0: not a trajectory record"):
        next(shards.read_shard(tmp_path / "foreign.array_record"))
