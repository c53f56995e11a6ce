"""The TPU launcher composes the gcloud commands of a slice: shapes (chips, workers, runtime) for several
accelerator types, every action's command line, --dry-run printing without running, and the errors."""

from __future__ import annotations

import shlex

import pytest

from ranger_jax.launch import tpu

BASE = ["--name", "ranger-a", "--zone", "us-east5-a", "--project", "proj"]


@pytest.mark.parametrize(("accelerator", "chips", "hosts", "runtime"), [
    ("v5p-8", 4, 1, "v2-alpha-tpuv5"),
    ("v5p-64", 32, 8, "v2-alpha-tpuv5"),
    ("v5p-256", 128, 32, "v2-alpha-tpuv5"),
    ("v4-32", 16, 4, "tpu-ubuntu2204-base"),
    ("v5litepod-8", 8, 1, "v2-alpha-tpuv5-lite"),
    ("v5litepod-64", 64, 16, "v2-alpha-tpuv5-lite"),
    ("v6e-16", 16, 4, "v2-alpha-tpuv6e"),
])
def test_slice_shapes(accelerator, chips, hosts, runtime):
    shape = tpu.Slice.parse(accelerator)
    assert (shape.chips, shape.hosts, shape.runtime) == (chips, hosts, runtime)
    _, (create,), _ = tpu.commands_for(["create", *BASE, "--accelerator", accelerator, "--provisioning", "spot"])
    assert create == ["gcloud", "compute", "tpus", "queued-resources", "create", "ranger-a-qr", "--node-id",
                      "ranger-a", "--project", "proj", "--zone", "us-east5-a", "--accelerator-type", accelerator,
                      "--runtime-version", runtime, "--spot"]


def test_setup_copies_head_installs_everywhere_and_mounts_the_bucket():
    _, commands, _ = tpu.commands_for(["setup", *BASE, "--accelerator", "v5p-64", "--bucket", "my-bucket"])
    archive, copy, install, mount = commands
    assert archive == ["git", "archive", "--format=tar.gz", "-o", "/tmp/ranger_jax.tar.gz", "HEAD"]
    assert copy[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", "/tmp/ranger_jax.tar.gz"]
    assert "--worker=all" in copy
    assert install[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "ranger-a"] and "--worker=all" in install
    script = install[-1]
    assert "python3.11 -m venv .venv" in script and "pip install -q -c constraints.txt -e '.[tpu]'" in script
    assert mount[-1].endswith("gcsfuse --implicit-dirs my-bucket /gcs")
    _, without_bucket, _ = tpu.commands_for(["setup", *BASE])
    assert len(without_bucket) == 3


def test_run_starts_the_same_recipe_on_every_worker_logs_and_stop():
    argv = ["run", *BASE, "--accelerator", "v6e-16", "--env", "JAX_LOG=1", "--", "--preset", "savanna-8b-tpu",
            "--tasks", "/gcs/data/rl data.json", "--dry-run"]
    _, (command,), dry = tpu.commands_for(argv)
    assert not dry  # the recipe's own --dry-run, after --, is not the launcher's
    assert command[command.index("--command") - 1] == "--worker=all"
    remote = command[-1]
    assert remote.startswith("cd ~/ranger_jax && export JAX_LOG=1 && nohup .venv/bin/python recipes/grpo_savanna.py")
    assert shlex.split(remote.split("nohup ", 1)[1].split(" >")[0])[2:] == [
        "--preset", "savanna-8b-tpu", "--tasks", "/gcs/data/rl data.json", "--dry-run"]
    assert remote.endswith("echo $! > ~/ranger_run.pid")
    _, (logs,), _ = tpu.commands_for(["logs", *BASE, "--worker", "0"])
    assert "--worker=0" in logs and logs[-1] == "tail -n 100 ~/ranger_run.log"
    _, (stop,), _ = tpu.commands_for(["stop", *BASE])
    assert stop[-1].startswith("test -f ~/ranger_run.pid && kill $(cat ~/ranger_run.pid)")
    _, (delete,), _ = tpu.commands_for(["delete", *BASE])
    assert delete[-2:] == ["--force", "--quiet"] and delete[5] == "ranger-a-qr"


def test_dry_run_prints_and_runs_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcloud here: running anything would fail
    assert tpu.main(["status", *BASE, "--accelerator", "v5p-8", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# ranger-a: v5p-8 = 4 chips on 1 worker(s), runtime v2-alpha-tpuv5"
    assert out[1] == "gcloud compute tpus queued-resources describe ranger-a-qr --project proj --zone us-east5-a"


def test_errors_name_the_value():
    with pytest.raises(ValueError, match="accelerator type 'v5x-8' is not one of"):
        tpu.Slice.parse("v5x-8")
    with pytest.raises(ValueError, match="v5p-7: v5p slices are named by TensorCores"):
        tpu.Slice.parse("v5p-7")
    with pytest.raises(SystemExit):
        tpu.commands_for(["run", *BASE])  # no recipe arguments
