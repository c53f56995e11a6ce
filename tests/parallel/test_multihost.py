"""The learner as one SPMD program over two CPU processes on loopback: per-process Grain shards (whole GRPO groups
per host), a mesh spanning both processes, images gathered across them, one Orbax checkpoint, a resume from it,
published weights. Every loss equals one process stepping the same global batches (each step's batch = process 0's
rows, then process 1's, with the images in that order), built here with numpy from the same per-host pipelines."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from support import multihost

from ranger_jax.models.qwen3_vl import load, save
from ranger_jax.parallel import distributed
from ranger_jax.rl.learner import Learner

TESTS = Path(__file__).resolve().parents[1]


def concatenate(local_batches: list[dict]) -> dict:
    """A global batch: every host's rows stacked in process order, images in that order (numpy only)."""
    length = max(b["input_ids"].shape[1] for b in local_batches)
    out = {}
    for key in local_batches[0]:
        parts = [b[key] for b in local_batches]
        if parts[0].ndim == 2 and key not in ("pixel_values", "image_grid_thw"):
            parts = [np.pad(p, ((0, 0), (0, length - p.shape[1]))) for p in parts]
        out[key] = np.concatenate(parts)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """(two-process reports, their output folder, the one-process losses and learner, the fixture folder), computed
    side by side."""
    folder = multihost.write_fixture(tmp_path_factory.mktemp("fixture"))
    out = tmp_path_factory.mktemp("out")
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), "JAX_PLATFORMS": "cpu"}
    runs = []
    worker = threading.Thread(target=lambda: runs.append(distributed.run_local(
        [sys.executable, str(TESTS / "parallel" / "multihost_worker.py"), str(folder), str(out)], 2,
        log_dir=out / "logs", cpu_devices=2, env=env, timeout_s=300)))
    worker.start()
    try:  # the reference: this process, one device, the concatenated global batches
        hosts = [iter(multihost.batches(folder, shard_index=i, shard_count=2)) for i in range(2)]
        reference = Learner(load(folder / "model"), multihost.GRPO)
        losses = [reference.step(concatenate([next(h) for h in hosts]))["loss"] for _ in range(multihost.STEPS)]
    finally:
        worker.join()
    (run,) = runs
    assert run.ok, f"exit codes {run.returncodes}; process 0:\n{run.tail(0)}\nprocess 1:\n{run.tail(1)}"
    reports = [json.loads((out / f"process-{i}.json").read_text()) for i in range(2)]
    return reports, out, losses, reference, folder


def test_both_processes_see_one_cluster_and_report_the_same_losses(results):
    reports, *_ = results
    assert [(r["process_index"], r["process_count"], r["devices"]) for r in reports] == [(0, 2, 4), (1, 2, 4)]
    for key in ("losses", "resumed_loss", "resumed_step", "params_digest"):
        assert reports[0][key] == reports[1][key], key  # one SPMD program: global metrics, identical parameters


def test_two_processes_step_like_one_process_with_the_global_batch(results):
    reports, _, losses, *_ = results
    assert reports[0]["losses"] == pytest.approx(losses, abs=2e-5)
    assert len(set(np.round(losses, 3))) == multihost.STEPS  # a new batch each step, so order mistakes would show


def test_resume_from_the_shared_checkpoint_continues_with_the_next_batch(results):
    reports, out, *_ = results
    assert reports[0]["resumed_step"] == multihost.STEPS_BEFORE_SAVE
    assert reports[0]["resumed_loss"] == pytest.approx(reports[0]["losses"][-1], abs=1e-6)
    saved = json.loads((out / "checkpoints" / str(multihost.STEPS_BEFORE_SAVE) / "data_state" / "metadata").read_text())
    assert len(saved["per_process"]) == 2  # each host's own iterator position


def test_published_weights_equal_the_single_process_parameters(results, tmp_path):
    _, out, _, reference, _ = results
    save(reference.params_model(), tmp_path)
    ours = load_file(out / "weights" / f"v{multihost.STEPS:06d}" / "model.safetensors")
    theirs = load_file(tmp_path / "model.safetensors")
    assert set(ours) == set(theirs)
    for key, value in ours.items():
        np.testing.assert_allclose(value, theirs[key], atol=2e-5, err_msg=key)


def test_a_checkpoint_of_two_processes_refuses_to_resume_the_data_of_one(results):
    _, out, _, _, folder = results
    learner = Learner(load(folder / "model"), multihost.GRPO, checkpoint_dir=out / "checkpoints")
    with pytest.raises(ValueError, match=r"holds the data state of 2 process\(es\) but this run has 1; resume with 2"):
        learner.restore()
