"""Starting JAX across processes: TPU pod slices, GPU clusters (SLURM or an explicit coordinator), and several CPU
processes on one machine.

    from ranger_jax.parallel import distributed, mesh as mesh_lib
    info = distributed.initialize()                      # first thing, before anything asks jax for devices
    mesh = mesh_lib.make_mesh(data=1, fsdp=-1, tensor=4)  # over every process's devices: one SPMD program

`detect(environ)` reads how this process was started, the most explicit source first:

1. **explicit** — `RANGER_COORDINATOR_ADDRESS` (host:port of process 0), `RANGER_NUM_PROCESSES` and
   `RANGER_PROCESS_ID`, optionally `RANGER_LOCAL_DEVICE_IDS` (GPUs this process owns, e.g. "0,1") and
   `RANGER_CPU_DEVICES` (CPU devices per process). Any cluster, and several CPU processes on one machine
   (`local_cluster_env` writes these variables; `python -m ranger_jax.parallel.distributed --processes 2 -- CMD`
   starts CMD that way on loopback).
2. **slurm** — a step with more than one task (`SLURM_NTASKS` > 1): JAX's own SLURM detection picks the coordinator
   (the step's first node, a port derived from the job id) and the process id. With one task per node the task
   owns all the node's GPUs (`CUDA_VISIBLE_DEVICES` or `SLURM_GPUS_ON_NODE`); JAX alone would give it one.
3. **tpu** — a Cloud TPU VM (`TPU_WORKER_ID`, `TPU_WORKER_HOSTNAMES`, `TPU_ACCELERATOR_TYPE`, or `/dev/accel0` /
   `/dev/vfio/0`): `jax.distributed.initialize()` without arguments, which asks the TPU metadata server for the
   slice's workers. A single-host slice is fine too.
4. **single** — none of the above: one process, nothing to start.

After `initialize`, `jax.devices()` lists every process's devices and `jax.process_index()` /
`jax.process_count()` say who this process is; data pipelines split their input by them.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

COORDINATOR_ENV = "RANGER_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "RANGER_NUM_PROCESSES"
PROCESS_ID_ENV = "RANGER_PROCESS_ID"
LOCAL_DEVICE_IDS_ENV = "RANGER_LOCAL_DEVICE_IDS"
CPU_DEVICES_ENV = "RANGER_CPU_DEVICES"
EXPLICIT_ENV = (COORDINATOR_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV)
SLURM_ENV = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
TPU_ENV = ("TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE")
TPU_DEVICE_FILES = ("accel0", "vfio/0")
DEFAULT_TIMEOUT_S = 300  # how long a process waits for the others to connect
KINDS = ("explicit", "slurm", "tpu", "single")


@dataclasses.dataclass(frozen=True)
class ClusterPlan:
    """How this process joins the others (what `detect` found); see the module docstring for the kinds."""

    kind: str  # one of KINDS
    coordinator_address: str | None = None  # host:port of process 0 (explicit only; JAX finds it otherwise)
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None  # accelerators this process owns; None = JAX's default
    cpu_devices: int | None = None  # CPU devices this process exposes (CPU clusters)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"cluster kind {self.kind!r} is not one of {KINDS}")
        if self.kind == "explicit":
            if not self.coordinator_address or ":" not in self.coordinator_address:
                raise ValueError(f"coordinator address {self.coordinator_address!r} must be host:port (process 0's)")
            if self.num_processes is None or self.num_processes < 1:
                raise ValueError(f"num_processes must be >= 1, got {self.num_processes}")
            if self.process_id is None or not 0 <= self.process_id < self.num_processes:
                raise ValueError(f"process id {self.process_id} is not in [0, {self.num_processes})")
        if self.cpu_devices is not None and self.cpu_devices < 1:
            raise ValueError(f"cpu_devices must be >= 1, got {self.cpu_devices}")


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """Who this process is once JAX is up."""

    kind: str
    process_index: int
    process_count: int
    local_device_count: int
    device_count: int
    platform: str

    def __str__(self) -> str:
        return (f"process {self.process_index}/{self.process_count} ({self.kind}): {self.local_device_count} local of "
                f"{self.device_count} {self.platform} devices")


def _int(environ: Mapping[str, str], name: str) -> int:
    value = environ[name]
    try:
        return int(value)
    except ValueError as err:
        raise ValueError(f"${name}={value!r} is not an integer") from err


def _device_ids(text: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as err:
        raise ValueError(f"${name}={text!r} must be comma-separated device ids, e.g. 0,1") from err


def _tasks_per_node(environ: Mapping[str, str]) -> int | None:
    """SLURM_NTASKS_PER_NODE, else the first count of SLURM_TASKS_PER_NODE ("2(x4),1" -> 2)."""
    if environ.get("SLURM_NTASKS_PER_NODE", "").isdigit():
        return int(environ["SLURM_NTASKS_PER_NODE"])
    first = environ.get("SLURM_TASKS_PER_NODE", "").split(",")[0].split("(")[0]
    return int(first) if first.isdigit() else None


def _node_gpus(environ: Mapping[str, str]) -> tuple[int, ...] | None:
    visible = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        return tuple(range(len([v for v in visible.split(",") if v.strip()])))
    if environ.get("SLURM_GPUS_ON_NODE", "").isdigit():
        return tuple(range(int(environ["SLURM_GPUS_ON_NODE"])))
    return None


def detect(environ: Mapping[str, str] | None = None, *, device_root: str | os.PathLike = "/dev") -> ClusterPlan:
    """The cluster this process runs in, from its environment (see the module docstring for the order).

    Args:
        environ: the environment to read (default `os.environ`).
        device_root: where TPU device files are looked for.

    Raises:
        ValueError: only some of the explicit variables are set, or one of them is malformed (naming it).
    """
    environ = os.environ if environ is None else environ
    cpu = _int(environ, CPU_DEVICES_ENV) if environ.get(CPU_DEVICES_ENV) else None
    present = [name for name in EXPLICIT_ENV if environ.get(name)]
    if present:
        missing = [name for name in EXPLICIT_ENV if not environ.get(name)]
        if missing:
            raise ValueError(f"{present} are set but {missing} are not; an explicit cluster needs all of "
                             f"{list(EXPLICIT_ENV)}")
        ids = environ.get(LOCAL_DEVICE_IDS_ENV)
        return ClusterPlan("explicit", coordinator_address=environ[COORDINATOR_ENV],
                           num_processes=_int(environ, NUM_PROCESSES_ENV), process_id=_int(environ, PROCESS_ID_ENV),
                           local_device_ids=_device_ids(ids, LOCAL_DEVICE_IDS_ENV) if ids else None, cpu_devices=cpu)
    if all(environ.get(name) for name in SLURM_ENV) and _int(environ, "SLURM_NTASKS") > 1:
        ids = _node_gpus(environ) if _tasks_per_node(environ) == 1 else None
        return ClusterPlan("slurm", num_processes=_int(environ, "SLURM_NTASKS"),
                           process_id=_int(environ, "SLURM_PROCID"), local_device_ids=ids, cpu_devices=cpu)
    root = Path(device_root)
    if any(environ.get(name) for name in TPU_ENV) or any((root / name).exists() for name in TPU_DEVICE_FILES):
        return ClusterPlan("tpu")
    return ClusterPlan("single", cpu_devices=cpu)


def process_info(kind: str = "single") -> ProcessInfo:
    """This process's place among the others, as JAX sees it now."""
    import jax

    return ProcessInfo(kind=kind, process_index=jax.process_index(), process_count=jax.process_count(),
                       local_device_count=jax.local_device_count(), device_count=jax.device_count(),
                       platform=jax.devices()[0].platform)


def initialize(plan: ClusterPlan | None = None, *, timeout_s: int = DEFAULT_TIMEOUT_S) -> ProcessInfo:
    """Joins this process to the others as `plan` (default: `detect()`) says, once; later calls only report.

    Must run before anything initialises a JAX backend (`jax.devices()`, creating an array).

    Raises:
        RuntimeError: JAX's backend was already started by the time a multi-process plan arrived (the message
            says to call `initialize` first).
    """
    import jax

    plan = detect() if plan is None else plan
    if jax.distributed.is_initialized():
        return process_info(plan.kind)
    if plan.cpu_devices is not None:
        try:
            jax.config.update("jax_num_cpu_devices", plan.cpu_devices)
        except RuntimeError as err:
            raise RuntimeError(f"cannot expose {plan.cpu_devices} CPU devices: the JAX backend is already "
                               "running; call distributed.initialize() before anything touches jax devices") from err
    if plan.kind == "single":
        return process_info(plan.kind)
    kwargs: dict = {"initialization_timeout": int(timeout_s)}
    if plan.kind == "explicit":
        kwargs.update(coordinator_address=plan.coordinator_address, num_processes=plan.num_processes,
                      process_id=plan.process_id, cluster_detection_method="deactivate")
    elif plan.kind == "slurm":
        kwargs.update(cluster_detection_method="slurm")
    if plan.local_device_ids is not None:
        kwargs["local_device_ids"] = list(plan.local_device_ids)
    log.info("starting jax.distributed (%s): %s", plan.kind, kwargs)
    try:
        jax.distributed.initialize(**kwargs)
    except RuntimeError as err:
        if "already" in str(err) and "initialized" in str(err):
            raise RuntimeError("jax.distributed.initialize must run before the JAX backend starts; call "
                               "distributed.initialize() first thing in the program") from err
        raise
    info = process_info(plan.kind)
    log.info("%s", info)
    return info


# ----- several processes on this machine ----------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (for a loopback coordinator)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def local_cluster_env(num_processes: int, process_id: int, *, port: int, cpu_devices: int | None = None,
                      host: str = "127.0.0.1") -> dict[str, str]:
    """The environment variables that make `detect()` return an explicit plan for process `process_id` of
    `num_processes` whose coordinator listens on `host:port`."""
    env = {COORDINATOR_ENV: f"{host}:{port}", NUM_PROCESSES_ENV: str(num_processes), PROCESS_ID_ENV: str(process_id)}
    if cpu_devices is not None:
        env[CPU_DEVICES_ENV] = str(cpu_devices)
    return env


@dataclasses.dataclass(frozen=True)
class LocalRun:
    """How the processes of `run_local` ended."""

    returncodes: tuple[int, ...]
    logs: tuple[Path, ...]  # one combined stdout/stderr file per process
    wall_s: float

    @property
    def ok(self) -> bool:
        """Whether every process exited with 0."""
        return all(code == 0 for code in self.returncodes)

    def tail(self, process: int, chars: int = 3000) -> str:
        """The last `chars` characters of a process's log."""
        return self.logs[process].read_text("utf-8", "replace")[-chars:]


def run_local(argv: Sequence[str], num_processes: int, *, log_dir: str | os.PathLike, cpu_devices: int | None = None,
              env: Mapping[str, str] | None = None, timeout_s: float = 600.0) -> LocalRun:
    """Runs `argv` as `num_processes` processes of one JAX cluster on loopback and waits for all of them.

    Each process gets `local_cluster_env` (and `env`), with XLA's forced host device count removed so that
    `cpu_devices` decides; its output goes to `log_dir/process-<i>.log`. When one process fails or the time runs
    out, the others are terminated (a cluster cannot finish without all its members).
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = {**os.environ, **(env or {})}
    flags = [f for f in base.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    base["XLA_FLAGS"] = " ".join(flags)
    procs, logs = [], []
    started = time.monotonic()
    for i in range(num_processes):
        logs.append(log_dir / f"process-{i}.log")
        with open(logs[-1], "wb") as handle:
            procs.append(subprocess.Popen(list(argv), stdout=handle, stderr=subprocess.STDOUT, env={
                **base, **local_cluster_env(num_processes, i, port=port, cpu_devices=cpu_devices)}))
    deadline = started + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return LocalRun(returncodes=tuple(p.returncode for p in procs), logs=tuple(logs),
                    wall_s=time.monotonic() - started)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m ranger_jax.parallel.distributed --processes N [--cpu-devices K] -- CMD ...`: CMD as N processes
    of one cluster on this machine (each calls `distributed.initialize()`), logs under `--log-dir`."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--cpu-devices", type=int, help="CPU devices per process (CPU-only clusters)")
    parser.add_argument("--log-dir", default="multiprocess_logs")
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    run = run_local(command, args.processes, log_dir=args.log_dir, cpu_devices=args.cpu_devices,
                    timeout_s=args.timeout_s)
    for i, code in enumerate(run.returncodes):
        print(f"process {i}: exit {code} (log {run.logs[i]})")
    return 0 if run.ok else 1


if __name__ == "__main__":
    sys.exit(main())
