"""Published weights: round trip, the latest pointer, keep-N, atomic visibility and the errors that name the thing."""

import os
import threading

import jax
import numpy as np
import pytest
from flax import nnx
from support.tiny_tokenizer import write_tiny_tokenizer

from ranger_jax.models import qwen3_vl
from ranger_jax.rl import weights

CONFIG = qwen3_vl.Qwen3VLConfig.tiny()
COMPLETE = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}


@pytest.fixture(scope="module")
def model():
    return qwen3_vl.init(CONFIG, seed=1)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer")
    write_tiny_tokenizer(path, vocab_size=512)  # its own vocabulary: publish only copies the files
    return path


def params(model):
    flat = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in flat}


def test_publish_latest_load_round_trip(tmp_path, model, tokenizer_dir):
    folder = tmp_path / "weights"
    assert weights.latest_version(folder) is None and weights.list_versions(folder) == []
    path = weights.publish(model, folder, 1, tokenizer_dir=tokenizer_dir)
    assert path == folder / "v000001" and set(os.listdir(path)) == COMPLETE
    assert (folder / "latest").read_text() == "1\n" and weights.latest_version(folder) == 1
    assert (path / "tokenizer.json").read_bytes() == (tokenizer_dir / "tokenizer.json").read_bytes()
    loaded = weights.load_version(folder, 1)
    assert loaded.config == qwen3_vl.Qwen3VLConfig.tiny(sharding_rules="sample")
    want, got = params(model), params(loaded)
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert weights.load_version(folder, 1, sharding_rules="train").config == CONFIG
    # a folder that also holds the policy's settings (`ranger_env.json`) publishes them with every version
    with_settings = tmp_path / "policy_files"
    with_settings.mkdir()
    (with_settings / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    (with_settings / "ranger_env.json").write_text('{"env": {"max_turns": 5}}')
    path = weights.publish(model, folder, 2, tokenizer_dir=with_settings)
    assert (path / "ranger_env.json").read_text() == '{"env": {"max_turns": 5}}'


def test_keeps_the_newest_versions(tmp_path, model):
    folder = tmp_path / "weights"
    for version in (3, 4, 7, 9):
        weights.publish(model, folder, version, keep=2)
    assert weights.list_versions(folder) == [7, 9] and weights.latest_version(folder) == 9
    assert sorted(os.listdir(folder)) == ["latest", "v000007", "v000009"]  # nothing hidden is left behind


def test_withdraw_removes_the_later_versions_and_points_latest_at_the_newest_left(tmp_path, model):
    folder = tmp_path / "weights"
    for version in (2, 3, 5):
        weights.publish(model, folder, version)
    assert weights.withdraw(folder, from_version=3) == [3, 5]
    assert weights.list_versions(folder) == [2] and weights.latest_version(folder) == 2
    assert sorted(os.listdir(folder)) == ["latest", "v000002"]
    weights.publish(model, folder, 3)  # published again, as a resumed learner does
    assert weights.withdraw(folder, from_version=7) == [] and weights.latest_version(folder) == 3
    assert weights.withdraw(folder, from_version=0) == [2, 3]
    assert weights.latest_version(folder) is None and os.listdir(folder) == []
    assert weights.withdraw(tmp_path / "none", from_version=0) == []
    with pytest.raises(ValueError, match="a weights version must be an int >= 0; got -1"):
        weights.withdraw(folder, from_version=-1)


def test_no_partial_version_is_ever_visible(tmp_path, model, tokenizer_dir):
    """A reader polling the folder while versions are published only ever sees complete ones."""
    folder = tmp_path / "weights"
    seen, partial, mid_write, done = [], [], [], threading.Event()

    def poll():
        while not done.is_set():
            latest = weights.latest_version(folder)
            listed = weights.list_versions(folder)
            if latest is not None and latest not in listed:
                partial.append(("latest", latest, listed))
            for version in listed:
                files = set(os.listdir(weights.version_dir(folder, version)))
                if files != COMPLETE:
                    partial.append((version, sorted(files)))
            seen.append(listed)
            if folder.is_dir() and any(name.endswith(".tmp") for name in os.listdir(folder)):
                mid_write.append(listed)  # the reader looked while a version was being written

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        for version in range(1, 6):
            weights.publish(model, folder, version, tokenizer_dir=tokenizer_dir, keep=10)
    finally:
        done.set()
        reader.join()
    assert not partial and mid_write and weights.list_versions(folder) == [1, 2, 3, 4, 5]


def test_a_failed_publish_leaves_nothing(tmp_path, model, tokenizer_dir):
    """Copying the tokenizer fails after the weights are written: no version, no temporary, latest unchanged."""
    folder = tmp_path / "weights"
    weights.publish(model, folder, 1)
    broken = tmp_path / "broken_tokenizer"
    broken.mkdir()
    (broken / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    (broken / "tokenizer_config.json").symlink_to("/proc/self/mem")  # a regular file whose first read fails (EIO)
    with pytest.raises(OSError):
        weights.publish(model, folder, 2, tokenizer_dir=broken)
    assert sorted(os.listdir(folder)) == ["latest", "v000001"] and weights.latest_version(folder) == 1


def test_errors_name_the_folder_and_version(tmp_path, model):
    folder = tmp_path / "weights"
    weights.publish(model, folder, 4)
    with pytest.raises(ValueError, match=r"cannot publish version 4 to .*weights: not newer than the published "
                                         r"latest 4"):
        weights.publish(model, folder, 4)
    with pytest.raises(ValueError, match="a weights version must be an int >= 0; got -1"):
        weights.publish(model, folder, -1)
    with pytest.raises(ValueError, match="keep must be an int >= 1; got 0"):
        weights.publish(model, folder, 5, keep=0)
    with pytest.raises(FileNotFoundError, match=r"tokenizer_dir .*nowhere has no tokenizer.json"):
        weights.publish(model, folder, 5, tokenizer_dir=tmp_path / "nowhere")
    (folder / "v000006").mkdir()
    with pytest.raises(FileExistsError, match=r"weights version 6 already exists at .*v000006"):
        weights.publish(model, folder, 6)
    with pytest.raises(FileNotFoundError, match=r"weights folder .*weights has no version 7 \(v000007\); published "
                                                r"versions: \[4, 6\]"):
        weights.load_version(folder, 7)
    (folder / "latest").write_text("v4\n")
    with pytest.raises(ValueError, match=r"weights pointer .*latest should hold one version number, holds 'v4'"):
        weights.latest_version(folder)
    (folder / "latest").write_text("9\n")
    with pytest.raises(FileNotFoundError, match=r"names version 9, but .*v000009 does not exist; published versions: "
                                                r"\[4, 6\]"):
        weights.latest_version(folder)
