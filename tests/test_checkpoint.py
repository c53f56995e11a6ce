"""Orbax checkpoints of the learner: a run killed after an async save resumes on the mesh to the same step-3 loss and
weights with its data iterator state, keep-N, HF export read back by `load`, and errors that name the path or key."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import tiny_hf
from support.learner_batches import CONFIG, text_batch
from support.tiny_tokenizer import write_tiny_tokenizer

from ranger_jax.checkpoint import CheckpointManager, abstract_like
from ranger_jax.models.qwen3_vl import load
from ranger_jax.parallel import mesh as mesh_lib
from ranger_jax.parallel import placement
from ranger_jax.processing import load_tokenizer
from ranger_jax.rl.learner import Learner, LearnerConfig, place_model

SFT = LearnerConfig(learning_rate=3e-3, weight_decay=0.1)
BATCHES = [text_batch(11), text_batch(12), text_batch(13)]
DATA_STATE = {"shard": 3, "record": 17, "epoch": 0, "seed": 42}


def params_by_path(learner: Learner) -> dict[str, np.ndarray]:
    flat = jax.tree_util.tree_flatten_with_path(learner.state.params, is_leaf=placement.is_variable)[0]
    return {placement.path_key(path): np.asarray(variable.get_value()) for path, variable in flat}


@pytest.fixture(scope="module")
def mesh():
    return mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_hf")
    tiny_hf.save_checkpoint(CONFIG, path, seed=0)
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory, hf_dir, mesh):
    """An uninterrupted 3-step run on the mesh with an async save after step 2; the learner is then dropped."""
    directory = tmp_path_factory.mktemp("run") / "checkpoints"
    learner = Learner(load(hf_dir, mesh=mesh), SFT, mesh=mesh, checkpoint_dir=directory)
    for batch in BATCHES[:2]:
        learner.step(batch)
    assert learner.save(data_state=DATA_STATE)
    step_two = place_model(learner.state.model(), learner.model_config, None)  # a single-device copy
    third = learner.step(BATCHES[2])  # runs while the checkpoint is written, and donates the saved buffers
    params = params_by_path(learner)
    learner.close()  # a killed process leaves a finished step or only Orbax's temporary directory
    del learner
    return {"directory": directory, "third": third, "params": params, "step_two": step_two}


def test_resume_after_kill_equals_uninterrupted_run(run, hf_dir, mesh):
    learner = Learner(load(hf_dir, mesh=mesh), SFT, mesh=mesh, checkpoint_dir=run["directory"])
    assert learner.checkpoints.latest_step() == 2
    assert learner.restore() == DATA_STATE
    assert learner.step_count == 2
    q_proj = learner.state.params["model"]["language_model"]["layers"][0]["self_attn"]["q_proj"]["weight"]
    assert q_proj.get_value().sharding.spec[:2] == ("fsdp", "tensor")
    third = learner.step(BATCHES[2])
    assert third["loss"] == pytest.approx(run["third"]["loss"], abs=1e-6)
    assert third["grad_norm"] == pytest.approx(run["third"]["grad_norm"], abs=1e-6)
    for key, value in params_by_path(learner).items():
        np.testing.assert_allclose(value, run["params"][key], atol=1e-6, err_msg=key)
    learner.close()


def test_export_hf_reloads_to_identical_logits(run, tmp_path):
    tokenizer_dir = tmp_path / "tokenizer"
    write_tiny_tokenizer(tokenizer_dir)
    out = CheckpointManager(run["directory"]).export_hf(2, tmp_path / "hf", tokenizer_dir)
    exported = load(out)
    batch = text_batch(14)
    ours = exported(batch["input_ids"], attention_mask=batch["attention_mask"])
    reference = run["step_two"](batch["input_ids"], attention_mask=batch["attention_mask"])
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(reference))
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    assert load_tokenizer(out).image_pad_id == CONFIG.image_token_id
    with pytest.raises(FileNotFoundError, match="holds neither tokenizer.json nor tokenizer_config.json"):
        CheckpointManager(run["directory"]).export_hf(2, tmp_path / "hf2", tmp_path)


def test_restore_into_another_optimizer_layout_names_the_key(run, hf_dir, mesh):
    frozen = Learner(load(hf_dir, mesh=mesh), dataclasses.replace(SFT, freeze_vision=True), mesh=mesh,
                     checkpoint_dir=run["directory"])
    with pytest.raises(ValueError, match=r"step 2 item 'optimizer' does not match the target tree: 0 keys missing "
                                         r"from the checkpoint .* keys the target lacks \(e\.g\. \['opt_state\.1\.0"
                                         r"\.mu\.model\.visual\."):
        frozen.restore()


def _tree(scale: float) -> dict:
    return {"w": jnp.full((2, 3), scale), "b": {"x": jnp.arange(4, dtype=jnp.int32)}}


def test_keep_n_latest_and_json_state(tmp_path):
    with CheckpointManager(tmp_path / "ckpt", items=("state",), max_to_keep=2) as manager:
        assert manager.latest_step() is None
        for step in (1, 2, 3):
            manager.save(step, {"state": _tree(step)}, data_state={"position": step * 10})
        manager.wait()
        assert manager.all_steps() == [2, 3] and manager.latest_step() == 3
        restored, data_state = manager.restore({"state": abstract_like(_tree(0))}, step=2)
    np.testing.assert_array_equal(np.asarray(restored["state"]["w"]), np.full((2, 3), 2.0))
    assert data_state == {"position": 20}


def test_missing_checkpoints_raise_file_not_found_naming_the_path(tmp_path):
    target = {"state": abstract_like(_tree(0))}
    missing = CheckpointManager(tmp_path / "nowhere", items=("state",))
    with pytest.raises(FileNotFoundError, match=r"checkpoint directory .*nowhere does not exist"):
        missing.restore(target)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no checkpoint in .*empty"):
        CheckpointManager(tmp_path / "empty", items=("state",)).restore(target)
    with CheckpointManager(tmp_path / "one", items=("state",), async_save=False) as manager:
        manager.save(1, {"state": _tree(1.0)})
        with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 5 in .*one; steps there: \[1\]"):
            manager.restore(target, step=5)
        with pytest.raises(FileNotFoundError, match="was saved without a model_config"):
            manager.export_hf(1, tmp_path / "hf")


def test_mismatched_trees_name_the_key(tmp_path):
    with CheckpointManager(tmp_path / "ckpt", items=("state",), async_save=False) as manager:
        manager.save(1, {"state": _tree(1.0)})
        extra = {"w": _tree(0)["w"], "b": {"x": _tree(0)["b"]["x"], "y": jnp.zeros(2)}}
        with pytest.raises(ValueError, match=r"1 keys missing from the checkpoint \(e\.g\. \['b\.y'\]\)"):
            manager.restore({"state": abstract_like(extra)})
        wrong = {"w": jnp.zeros((3, 2)), "b": {"x": jnp.zeros(4, jnp.int32)}}
        with pytest.raises(ValueError, match=r"key w is saved as \(2, 3\) float32, the target wants \(3, 2\) float32"):
            manager.restore({"state": abstract_like(wrong)})
        with pytest.raises(ValueError, match=r"state items \['other'\] != the manager's items \['state'\]"):
            manager.save(2, {"other": _tree(1.0)})
