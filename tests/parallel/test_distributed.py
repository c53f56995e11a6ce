"""How a process finds its cluster (explicit variables, SLURM, TPU VM, alone), the errors for half-set variables,
the launcher's environment, and the host-side pieces of the global batch that one process can check."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from ranger_jax.parallel import distributed, host_data
from ranger_jax.parallel import mesh as mesh_lib

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "gpu[003-004]", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
         "SLURM_LOCALID": "0"}


def test_explicit_variables_make_an_explicit_plan(tmp_path):
    env = distributed.local_cluster_env(4, 3, port=1234, cpu_devices=2)
    assert env == {"RANGER_COORDINATOR_ADDRESS": "127.0.0.1:1234", "RANGER_NUM_PROCESSES": "4",
                   "RANGER_PROCESS_ID": "3", "RANGER_CPU_DEVICES": "2"}
    plan = distributed.detect({**env, **SLURM, "RANGER_LOCAL_DEVICE_IDS": "2,3"}, device_root=tmp_path)
    assert plan == distributed.ClusterPlan("explicit", coordinator_address="127.0.0.1:1234", num_processes=4,
                                           process_id=3, local_device_ids=(2, 3), cpu_devices=2)


def test_slurm_steps_with_several_tasks(tmp_path):
    plan = distributed.detect({**SLURM, "SLURM_TASKS_PER_NODE": "1(x2)", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
                              device_root=tmp_path)
    assert (plan.kind, plan.num_processes, plan.process_id, plan.local_device_ids) == ("slurm", 2, 1, (0, 1, 2, 3))
    per_gpu = distributed.detect({**SLURM, "SLURM_NTASKS_PER_NODE": "8", "SLURM_GPUS_ON_NODE": "8"},
                                 device_root=tmp_path)
    assert per_gpu.local_device_ids is None  # one task per GPU: JAX gives each its own
    assert distributed.detect({**SLURM, "SLURM_NTASKS": "1"}, device_root=tmp_path).kind == "single"


def test_tpu_vms_by_variable_or_device_file(tmp_path):
    assert distributed.detect({"TPU_WORKER_ID": "3"}, device_root=tmp_path).kind == "tpu"
    assert distributed.detect({}, device_root=tmp_path).kind == "single"
    (tmp_path / "accel0").touch()
    assert distributed.detect({}, device_root=tmp_path) == distributed.ClusterPlan("tpu")


def test_half_set_or_malformed_variables_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"\['RANGER_COORDINATOR_ADDRESS'\] are set but \['RANGER_NUM_PROCESSES', "
                                         r"'RANGER_PROCESS_ID'\] are not"):
        distributed.detect({"RANGER_COORDINATOR_ADDRESS": "10.0.0.2:8476"}, device_root=tmp_path)
    env = distributed.local_cluster_env(2, 0, port=1)
    with pytest.raises(ValueError, match=r"\$RANGER_NUM_PROCESSES='two' is not an integer"):
        distributed.detect({**env, "RANGER_NUM_PROCESSES": "two"}, device_root=tmp_path)
    with pytest.raises(ValueError, match=r"process id 2 is not in \[0, 2\)"):
        distributed.detect({**env, "RANGER_PROCESS_ID": "2"}, device_root=tmp_path)
    with pytest.raises(ValueError, match="must be host:port"):
        distributed.detect({**env, "RANGER_COORDINATOR_ADDRESS": "node0"}, device_root=tmp_path)
    with pytest.raises(ValueError, match=r"\$RANGER_LOCAL_DEVICE_IDS='0;1' must be comma-separated"):
        distributed.detect({**env, "RANGER_LOCAL_DEVICE_IDS": "0;1"}, device_root=tmp_path)


def test_initialize_alone_reports_this_process_and_refuses_late_cpu_devices():
    info = distributed.initialize(distributed.ClusterPlan("single"))
    assert (info.process_index, info.process_count, info.device_count) == (0, 1, 8)
    with pytest.raises(RuntimeError, match="cannot expose 2 CPU devices: the JAX backend is already running"):
        distributed.initialize(distributed.ClusterPlan("single", cpu_devices=2))


def test_run_local_stops_the_others_when_one_fails(tmp_path):
    import sys

    code = "import os, sys, time; sys.exit(3) if os.environ['RANGER_PROCESS_ID'] == '1' else time.sleep(60)"
    run = distributed.run_local([sys.executable, "-c", code], 2, log_dir=tmp_path, timeout_s=30)
    assert run.returncodes[1] == 3 and run.returncodes[0] != 0 and run.wall_s < 20 and not run.ok


def test_shorter_rows_are_padded_as_one_collate_would():
    rows = {"input_ids": np.array([[7, 8, 9], [7, 0, 0]], np.int32), "attention_mask": np.array([[1, 1, 1], [1, 0, 0]]),
            "loss_mask": np.ones((2, 3), np.float32), "row_valid": np.ones(2, np.float32)}
    padded = host_data._pad_columns(rows, 5)
    np.testing.assert_array_equal(padded["input_ids"], [[7, 8, 9, 0, 0], [7, 0, 0, 0, 0]])
    np.testing.assert_array_equal(padded["attention_mask"], [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(padded["loss_mask"][:, 3:], 0)
    np.testing.assert_array_equal(padded["row_valid"], rows["row_valid"])


def test_global_batch_on_one_process_places_rows_and_replicates_images():
    mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
    assert host_data.row_block_order(mesh, ("data", "fsdp"), 8) == [0]
    rows = {"input_ids": np.arange(32, dtype=np.int32).reshape(8, 4), "attention_mask": np.ones((8, 4), np.int32)}
    images = {"pixel_values": np.ones((4, 6), np.float32), "image_grid_thw": np.array([[1, 2, 2]], np.int32)}
    placed = host_data.global_batch(rows, images, mesh)
    assert placed["input_ids"].sharding.spec[0] == ("data", "fsdp")
    assert placed["pixel_values"].sharding.is_fully_replicated
    np.testing.assert_array_equal(host_data.local_rows(placed["input_ids"], mesh), rows["input_ids"])
    assert host_data.gather_json({"a": 1}) == [{"a": 1}] and jax.process_count() == 1
