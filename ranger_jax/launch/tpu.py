"""Cloud TPU slices for the learner: the gcloud commands that create a slice, install this library on every worker,
run one command on all of them, read the logs, stop the run and delete the slice (`python tpu/launch.py ...`).

    python tpu/launch.py create --name ranger-a --accelerator v5p-64 --zone us-east5-a --project my-proj --spot
    python tpu/launch.py setup  --name ranger-a --accelerator v5p-64 --zone us-east5-a --project my-proj \\
                                --bucket my-bucket
    python tpu/launch.py run    --name ranger-a ... -- --preset savanna-8b-tpu --checkpoint /gcs/ckpt/sft \\
                                --tasks /gcs/data/rl_data.json --out /gcs/runs/a
    python tpu/launch.py logs   --name ranger-a ...           # the end of every worker's log
    python tpu/launch.py stop   --name ranger-a ...           # ends the run started by `run`
    python tpu/launch.py delete --name ranger-a ...

`--dry-run` prints the commands instead of running them. A slice is a queued resource (`gcloud compute tpus
queued-resources`), so a request waits for capacity instead of failing; `status` shows where it is. Every worker runs
the same program (one SPMD learner): `ranger_jax.parallel.distributed.initialize()` finds the slice's workers itself.
`setup` copies the repository as a `git archive` of HEAD, installs Python 3.11 and the `tpu` extra with the pinned
constraints in `~/ranger_jax/.venv`, and with `--bucket` mounts it with gcsfuse at `/gcs` (trajectory shards and the
GRPO loop's files need a file system; checkpoints may also go to `gs://` directly).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence

# TensorCores per chip: v4 and v5p slices are named by TensorCores, v5e and v6e by chips
GENERATIONS = {
    "v4": {"cores_per_chip": 2, "chips_per_host": 4, "runtime": "tpu-ubuntu2204-base"},
    "v5p": {"cores_per_chip": 2, "chips_per_host": 4, "runtime": "v2-alpha-tpuv5"},
    "v5litepod": {"cores_per_chip": 1, "chips_per_host": 4, "runtime": "v2-alpha-tpuv5-lite"},
    "v6e": {"cores_per_chip": 1, "chips_per_host": 4, "runtime": "v2-alpha-tpuv6e"},
}
SINGLE_HOST_CHIPS = {"v5litepod": 8, "v6e": 8}  # slices up to this size sit on one host of 8 chips
_ACCELERATOR = re.compile(r"(v4|v5p|v5litepod|v6e)-(\d+)")
HOME_DIR = "~/ranger_jax"
MOUNT = "/gcs"
RUN_LOG = "~/ranger_run.log"
RUN_PID = "~/ranger_run.pid"
PROVISIONING = ("spot", "reserved", "best-effort", "on-demand")


@dataclasses.dataclass(frozen=True)
class Slice:
    """A TPU slice shape, from its accelerator type (`v5p-64`)."""

    accelerator: str
    generation: str
    chips: int
    hosts: int
    runtime: str

    @classmethod
    def parse(cls, accelerator: str) -> Slice:
        """Raises ValueError for a type that is not `<generation>-<size>` of a known generation and valid size."""
        match = _ACCELERATOR.fullmatch(accelerator)
        if match is None:
            raise ValueError(f"accelerator type {accelerator!r} is not one of "
                             f"{[g + '-N' for g in GENERATIONS]} (e.g. v5p-64, v6e-16)")
        generation, size = match.group(1), int(match.group(2))
        spec = GENERATIONS[generation]
        if size % spec["cores_per_chip"]:
            raise ValueError(f"{accelerator}: {generation} slices are named by TensorCores, an even number")
        chips = size // spec["cores_per_chip"]
        per_host = SINGLE_HOST_CHIPS.get(generation, 0) if chips <= SINGLE_HOST_CHIPS.get(generation, 0) else \
            spec["chips_per_host"]
        return cls(accelerator, generation, chips, max(1, math.ceil(chips / per_host)), spec["runtime"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    """Where the slice lives."""

    name: str  # node id; the queued resource is `<name>-qr`
    zone: str
    project: str
    slice: Slice

    def where(self) -> list[str]:
        """The project and zone flags of every gcloud command."""
        return ["--project", self.project, "--zone", self.zone]


def create(target: Target, *, provisioning: str = "on-demand", runtime: str | None = None) -> list[list[str]]:
    """The queued-resource request for the slice (`spot`, `reserved`, `best-effort` or `on-demand`)."""
    if provisioning not in PROVISIONING:
        raise ValueError(f"provisioning {provisioning!r}; known: {list(PROVISIONING)}")
    command = ["gcloud", "compute", "tpus", "queued-resources", "create", f"{target.name}-qr", "--node-id",
               target.name, *target.where(), "--accelerator-type", target.slice.accelerator, "--runtime-version",
               runtime or target.slice.runtime]
    if provisioning != "on-demand":
        command.append(f"--{provisioning}")
    return [command]


def status(target: Target) -> list[list[str]]:
    """Where the request stands (WAITING_FOR_RESOURCES, PROVISIONING, ACTIVE, ...)."""
    return [["gcloud", "compute", "tpus", "queued-resources", "describe", f"{target.name}-qr", *target.where()]]


def ssh(target: Target, command: str, *, worker: str = "all") -> list[str]:
    """One shell command on the slice's workers (`all`, or a worker index)."""
    return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", target.name, *target.where(), f"--worker={worker}",
            "--command", command]


def setup(target: Target, *, archive: str = "/tmp/ranger_jax.tar.gz", bucket: str | None = None) -> list[list[str]]:
    """Copies HEAD of this repository to every worker and installs it (see the module docstring)."""
    install = " && ".join([
        "sudo apt-get update -qq", "sudo apt-get install -y -qq python3.11 python3.11-venv",
        f"rm -rf {HOME_DIR} && mkdir -p {HOME_DIR}", f"tar xzf ~/ranger_jax.tar.gz -C {HOME_DIR}",
        f"cd {HOME_DIR}", "python3.11 -m venv .venv",
        ".venv/bin/pip install -q -c constraints.txt -e '.[tpu]'",
        ".venv/bin/python -c 'import jax; print(jax.local_device_count(), \"local TPU chips\")'"])
    commands = [["git", "archive", "--format=tar.gz", "-o", archive, "HEAD"],
                ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive, f"{target.name}:~/ranger_jax.tar.gz",
                 *target.where(), "--worker=all"],
                ssh(target, install)]
    if bucket:
        mount = " && ".join([
            "export GCSFUSE_REPO=gcsfuse-$(lsb_release -c -s)",
            "echo \"deb https://packages.cloud.google.com/apt $GCSFUSE_REPO main\" | "
            "sudo tee /etc/apt/sources.list.d/gcsfuse.list",
            "curl -s https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo apt-key add -",
            "sudo apt-get update -qq && sudo apt-get install -y -qq gcsfuse",
            f"sudo mkdir -p {MOUNT} && sudo chown $USER {MOUNT}",
            f"gcsfuse --implicit-dirs {shlex.quote(bucket)} {MOUNT}"])
        commands.append(ssh(target, mount))
    return commands


def run(target: Target, recipe_args: Sequence[str], *, script: str = "recipes/grpo_savanna.py",
        env: dict[str, str] | None = None) -> list[list[str]]:
    """Starts `script` with `recipe_args` on every worker in the background (log `~/ranger_run.log`, pid file)."""
    exports = "".join(f"export {k}={shlex.quote(v)} && " for k, v in sorted((env or {}).items()))
    program = " ".join([".venv/bin/python", script, *(shlex.quote(a) for a in recipe_args)])
    return [ssh(target, f"cd {HOME_DIR} && {exports}nohup {program} > {RUN_LOG} 2>&1 < /dev/null & "
                        f"echo $! > {RUN_PID}")]


def logs(target: Target, *, worker: str = "all", lines: int = 100) -> list[list[str]]:
    """The end of the run's log on the workers."""
    return [ssh(target, f"tail -n {int(lines)} {RUN_LOG}", worker=worker)]


def stop(target: Target) -> list[list[str]]:
    """Ends the run `run` started, on every worker (by its pid file)."""
    return [ssh(target, f"test -f {RUN_PID} && kill $(cat {RUN_PID}) && rm {RUN_PID} || echo 'no run here'")]


def delete(target: Target) -> list[list[str]]:
    """Deletes the slice and its queued resource."""
    return [["gcloud", "compute", "tpus", "queued-resources", "delete", f"{target.name}-qr", *target.where(),
             "--force", "--quiet"]]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpu/launch.py", description=__doc__.split("\n", 1)[0])
    parser.add_argument("action", choices=["create", "status", "setup", "run", "logs", "stop", "delete"])
    parser.add_argument("--name", required=True, help="TPU node id")
    parser.add_argument("--accelerator", default="v5p-64", help="slice type, e.g. v5p-64, v6e-16")
    parser.add_argument("--zone", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--provisioning", choices=PROVISIONING, default="on-demand")
    parser.add_argument("--runtime", help="TPU software version (default: the generation's)")
    parser.add_argument("--bucket", help="setup: mount this GCS bucket at /gcs on every worker")
    parser.add_argument("--worker", default="all", help="logs: a worker index or all")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="run: exported first")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.epilog = "run: the recipe's arguments follow a lone --"
    return parser


def commands_for(argv: Sequence[str]) -> tuple[Target, list[list[str]], bool]:
    """(the slice, the commands an invocation of `tpu/launch.py` stands for, whether it is a dry run)."""
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = _parser()
    args = parser.parse_args(argv[:split])
    recipe_args = argv[split + 1:]
    target = Target(name=args.name, zone=args.zone, project=args.project, slice=Slice.parse(args.accelerator))
    if args.action == "run" and not recipe_args:
        parser.error("run needs the recipe's arguments after --")
    env = dict(item.split("=", 1) for item in args.env)
    builders = {"create": lambda: create(target, provisioning=args.provisioning, runtime=args.runtime),
                "status": lambda: status(target), "setup": lambda: setup(target, bucket=args.bucket),
                "run": lambda: run(target, recipe_args, env=env),
                "logs": lambda: logs(target, worker=args.worker), "stop": lambda: stop(target),
                "delete": lambda: delete(target)}
    return target, builders[args.action](), args.dry_run


def main(argv: Sequence[str] | None = None) -> int:
    """Runs (or with --dry-run prints) the commands of one action; returns the first failing exit status."""
    target, commands, dry = commands_for(list(sys.argv[1:] if argv is None else argv))
    print(f"# {target.name}: {target.slice.accelerator} = {target.slice.chips} chips on {target.slice.hosts} "
          f"worker(s), runtime {target.slice.runtime}")
    for command in commands:
        print(shlex.join(command))
        if not dry:
            code = subprocess.run(command, check=False).returncode
            if code:
                return code
    return 0
