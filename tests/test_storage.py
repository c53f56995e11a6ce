"""Locations as local paths and URLs: tensorstore files on memory:// and file://, published weights through them
(round trip, keep-N, a half-uploaded version never listed, the local copy reused), Orbax checkpoints and Grain
shards at file:// URLs, and the errors that say which consumer cannot take which URL."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from support import recorded
from support.tiny_tokenizer import write_tiny_tokenizer

from ranger_jax import storage
from ranger_jax.checkpoint import CheckpointManager, abstract_like
from ranger_jax.data import shards
from ranger_jax.models import qwen3_vl
from ranger_jax.rl import weights

CONFIG = qwen3_vl.Qwen3VLConfig.tiny()


@pytest.fixture(scope="module")
def model():
    return qwen3_vl.init(CONFIG, seed=2)


def params(model) -> dict[str, np.ndarray]:
    flat = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in flat}


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_files_under_a_url(scheme, tmp_path):
    location = "memory://files/a" if scheme == "memory" else f"file://{tmp_path}/a"
    assert storage.read_bytes(location, "x/one") is None and storage.list_names(location) == []
    storage.write_bytes(location, "x/one", b"1")
    storage.write_bytes(location, "x/two", b"22")
    storage.write_bytes(location, "y", b"3")
    assert storage.read_bytes(location, "x/two") == b"22"
    assert storage.list_names(location) == ["x/one", "x/two", "y"] and storage.list_names(location, "x/") == ["x/one",
                                                                                                             "x/two"]
    storage.delete_prefix(location, "x/")
    assert storage.list_names(location) == ["y"]
    if scheme == "file":
        assert (tmp_path / "a" / "y").read_bytes() == b"3"  # the same files a local path sees
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "config.json").write_text("{}")
    (tmp_path / "src" / "sub" / "w.bin").write_bytes(b"w")
    assert storage.upload_dir(tmp_path / "src", location, "v1/", last=("config.json",)) == ["v1/sub/w.bin",
                                                                                           "v1/config.json"]
    copy = storage.download_dir(location, "v1/", tmp_path / "copy")
    assert (copy / "sub" / "w.bin").read_bytes() == b"w" and (copy / "config.json").read_text() == "{}"
    with pytest.raises(FileNotFoundError, match="nothing stored under .* / v9/"):
        storage.download_dir(location, "v9/", tmp_path / "none")


def test_which_consumer_takes_which_location(tmp_path):
    assert storage.local_path(f"file://{tmp_path}") == tmp_path and storage.local_path("gs://b/run") is None
    assert storage.join("gs://b/run/", "weights", "latest") == "gs://b/run/weights/latest"
    assert storage.join(tmp_path, "weights") == tmp_path / "weights"
    assert str(storage.epath("gs://b/run")) == "gs://b/run"
    assert str(storage.epath(f"file://{tmp_path}")) == str(tmp_path)
    with pytest.raises(ValueError, match=r"memory://x: Orbax checkpoints and Grain shards need a file-system path"):
        storage.epath("memory://x")
    with pytest.raises(ValueError, match="refusing to empty memory://x"):
        storage.delete_prefix("memory://x", "")


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_published_weights_at_a_url(scheme, tmp_path, model):
    """memory:// goes through tensorstore (upload, download to a cache); file:// is a file system (atomic renames)."""
    folder = "memory://run/weights" if scheme == "memory" else f"file://{tmp_path}/weights"
    tokenizer = tmp_path / "tok"
    write_tiny_tokenizer(tokenizer, vocab_size=512)
    assert weights.latest_version(folder) is None
    for version in (1, 2, 3):
        path = weights.publish(model, folder, version, tokenizer_dir=tokenizer, keep=2)
        assert str(path).endswith(f"weights/v{version:06d}")  # a URL in the bucket, or the file:// URL's folder
    assert weights.list_versions(folder) == [2, 3] and weights.latest_version(folder) == 3
    assert set(storage.list_names(folder, "v000003/")) == {f"v000003/{n}" for n in (
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")}
    loaded = weights.load_version(folder, 3, cache_dir=tmp_path / "cache", sharding_rules="train")
    want, got = params(model), params(loaded)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    copy = weights.local_version(folder, 3, cache_dir=tmp_path / "cache")
    assert (copy / "tokenizer.json").is_file()
    assert copy.parent.parent == tmp_path / "cache" if scheme == "memory" else copy == tmp_path / "weights" / "v000003"
    with pytest.raises(ValueError, match="not newer than the published latest 3"):
        weights.publish(model, folder, 3)
    if scheme == "memory":  # a bucket has no rename: config.json is uploaded last and marks a version complete
        storage.write_bytes(folder, "v000004/model.safetensors", b"half an upload")
        assert weights.list_versions(folder) == [2, 3]
    with pytest.raises(FileNotFoundError, match=r"has no version 4 \(v000004\); published versions: \[2, 3\]"):
        weights.local_version(folder, 4)
    storage.write_bytes(folder, "latest", b"7\n")
    with pytest.raises(FileNotFoundError, match=r"latest names version 7, but .*v000007 does not exist"):
        weights.latest_version(folder)


def test_orbax_checkpoints_at_a_file_url(tmp_path):
    state = {"params": {"w": jax.numpy.arange(6.0).reshape(2, 3)}, "optimizer": {"step": jax.numpy.array(4)}}
    with CheckpointManager(f"file://{tmp_path}/ckpt", async_save=False) as manager:
        manager.save(4, state, data_state={"next_index": 9})
    with CheckpointManager(f"file://{tmp_path}/ckpt") as manager:
        restored, data_state = manager.restore({k: abstract_like(v) for k, v in state.items()})
    np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])
    assert data_state == {"next_index": 9} and (tmp_path / "ckpt" / "4").is_dir()
    with pytest.raises(ValueError, match="memory://ckpt: Orbax checkpoints"):
        CheckpointManager("memory://ckpt")


def test_grain_shards_at_a_file_url(tmp_path):
    renderer = recorded.tiny_renderer(tmp_path / "tok")
    trajectories = [recorded.record(renderer, seed=i, turns=1)[0] for i in range(3)]
    shards.write_shard(tmp_path / "shards" / "a-00000.array_record", trajectories)
    source = shards.TrajectorySource(f"file://{tmp_path}/shards")
    assert len(source) == 3 and [source[i].task_id for i in range(3)] == [t.task_id for t in trajectories]
    assert shards.list_shards(f"file://{tmp_path}/shards") == [tmp_path / "shards" / "a-00000.array_record"]
