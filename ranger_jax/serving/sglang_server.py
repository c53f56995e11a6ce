"""SGLang servers as managed subprocesses: the policy (Qwen3-VL), the diffusion generator (Qwen-Image /
Qwen-Image-Edit) and SGLang's router in front of replicas, started, health-checked and stopped from Python.

    policy = PolicyServer(model_path="/ckpt/policy/v000000", port=30001, tp_size=1, mem_fraction_static=0.8)
    with ManagedServer(policy, log_path="logs/policy.log") as server:      # starts, waits for /health
        client = sglang.SGLangClient(server.url)

Commands (sglang 0.5.23 and its router):

    sglang serve --model-type llm --model-path P --host H --port N --tp-size T --mem-fraction-static F
                 [--load-format dummy] [--enable-deterministic-inference] [--context-length C] ...
    sglang serve --model-type diffusion --model-path Qwen/Qwen-Image-Edit-2511 --host H --port N --num-gpus G
    python -m sglang_router.launch_router --host H --port N --worker-urls U1 U2 ... --policy cache_aware

SGLang pins its own torch, transformers and tokenizers, which clash with this library's, so it lives in a
virtual environment of its own on the GPU nodes: the `sglang` executable is looked up as `binary=` says, else
`$RANGER_SGLANG_BIN`, else `sglang` on PATH. The router (`sglang-router`, the `serve` extra) has light
dependencies and installs beside this library. Each server's stdout and stderr go to its log file; a server whose
executable is missing, that exits during start-up, or that is not healthy in time raises an error carrying the
end of its log.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

log = logging.getLogger(__name__)

SGLANG_BIN_ENV = "RANGER_SGLANG_BIN"
DEFAULT_STARTUP_TIMEOUT_S = 1200.0  # an 8B model with CUDA graph capture takes minutes
HEALTH_TIMEOUT = httpx.Timeout(10.0, connect=2.0)
LOG_TAIL_CHARS = 4000
INSTALL_HINT = ("install SGLang in its own virtual environment on the GPU node (its pins clash with this "
                "library's): python3 -m venv /opt/sglang && /opt/sglang/bin/pip install 'sglang[all]==0.5.23', then "
                f"pass binary='/opt/sglang/bin/sglang' or set ${SGLANG_BIN_ENV}")
ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")


class ServerError(RuntimeError):
    """A managed server could not be started or did not become healthy (the message ends with its log's tail)."""


class ExecutableNotFound(ServerError, FileNotFoundError):
    """The server's executable is not installed where it was looked for."""


class ServerExited(ServerError):
    """The server process exited during start-up (`returncode` is its exit status)."""

    def __init__(self, message: str, returncode: int):
        super().__init__(message)
        self.returncode = returncode


class ServerNotHealthy(ServerError, TimeoutError):
    """The server kept running but its health endpoint never answered 200 in time."""


def _flag(args: list[str], name: str, value) -> None:
    if value is not None:
        args += [name, str(value)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyServer:
    """An SGLang LLM server for the Qwen3-VL policy (`sglang serve --model-type llm`)."""

    model_path: str  # HF checkpoint folder (a published weights version) or hub id
    host: str = "127.0.0.1"  # 0.0.0.0 to serve other machines
    port: int = 30000
    tp_size: int = 1  # tensor parallel GPUs per replica
    mem_fraction_static: float | None = 0.8  # weights + KV cache share of GPU memory (SGLang's default 0.9)
    load_format: str | None = None  # "dummy": random weights of the checkpoint's shapes (smoke tests)
    deterministic: bool = False  # --enable-deterministic-inference: per-request sampling_seed is honoured
    context_length: int | None = None  # tokens per sequence; None = the checkpoint's max_position_embeddings
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    random_seed: int | None = None
    api_key: str | None = None  # clients then send it as a Bearer token
    extra_args: tuple[str, ...] = ()  # any other `sglang serve` flags, verbatim

    health_path = "health"

    def __post_init__(self):
        if self.tp_size < 1:
            raise ValueError(f"PolicyServer.tp_size must be >= 1, got {self.tp_size}")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise ValueError(f"PolicyServer.mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}")

    def args(self) -> list[str]:
        """The arguments after the executable."""
        args = ["serve", "--model-type", "llm", "--model-path", str(self.model_path), "--host", self.host,
                "--port", str(self.port), "--tp-size", str(self.tp_size)]
        _flag(args, "--mem-fraction-static", self.mem_fraction_static)
        _flag(args, "--load-format", self.load_format)
        if self.deterministic:
            args.append("--enable-deterministic-inference")
        _flag(args, "--context-length", self.context_length)
        _flag(args, "--max-running-requests", self.max_running_requests)
        _flag(args, "--chunked-prefill-size", self.chunked_prefill_size)
        _flag(args, "--random-seed", self.random_seed)
        _flag(args, "--api-key", self.api_key)
        return args + list(self.extra_args)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DiffusionServer:
    """An SGLang diffusion server for Qwen-Image / Qwen-Image-Edit (`sglang serve --model-type diffusion`)."""

    model_path: str  # e.g. Qwen/Qwen-Image-Edit-2511 or a local diffusers folder
    host: str = "127.0.0.1"
    port: int = 30010
    num_gpus: int = 1
    tp_size: int | None = None  # text-encoder tensor parallelism
    sp_degree: int | None = None  # sequence parallelism over the GPUs
    extra_args: tuple[str, ...] = ()

    health_path = "health"

    def __post_init__(self):
        if self.num_gpus < 1:
            raise ValueError(f"DiffusionServer.num_gpus must be >= 1, got {self.num_gpus}")

    def args(self) -> list[str]:
        """The arguments after the executable."""
        args = ["serve", "--model-type", "diffusion", "--model-path", str(self.model_path), "--host", self.host,
                "--port", str(self.port), "--num-gpus", str(self.num_gpus)]
        _flag(args, "--tp-size", self.tp_size)
        _flag(args, "--sp-degree", self.sp_degree)
        return args + list(self.extra_args)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RouterServer:
    """SGLang's router in front of policy replicas (`python -m sglang_router.launch_router`, the `serve` extra)."""

    worker_urls: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 30000
    policy: str = "cache_aware"  # multi-turn episodes land where their prefix is cached
    extra_args: tuple[str, ...] = ()

    health_path = "health"

    def __post_init__(self):
        if not self.worker_urls:
            raise ValueError("RouterServer needs at least one worker URL")
        if self.policy not in ROUTER_POLICIES:
            raise ValueError(f"RouterServer.policy={self.policy!r}; known policies: {list(ROUTER_POLICIES)}")

    def args(self) -> list[str]:
        """The arguments after the Python executable."""
        return ["-m", "sglang_router.launch_router", "--host", self.host, "--port", str(self.port), "--worker-urls",
                *self.worker_urls, "--policy", self.policy, *self.extra_args]


Spec = PolicyServer | DiffusionServer | RouterServer


def find_executable(spec: Spec, binary: str | os.PathLike | None = None,
                    environ: Mapping[str, str] | None = None) -> str:
    """The executable `spec` runs with: `binary`, else $RANGER_SGLANG_BIN, else `sglang` on PATH (the router runs
    with this Python).

    Raises:
        ExecutableNotFound: nothing usable there (the message says where it looked and how to install SGLang).
    """
    environ = os.environ if environ is None else environ
    if isinstance(spec, RouterServer):
        return str(binary or sys.executable)
    chosen = binary or environ.get(SGLANG_BIN_ENV)
    if chosen:
        if not (Path(chosen).is_file() and os.access(chosen, os.X_OK)):
            raise ExecutableNotFound(f"SGLang executable {chosen} does not exist or is not executable; "
                                     f"{INSTALL_HINT}")
        return str(chosen)
    found = shutil.which("sglang", path=environ.get("PATH"))
    if found is None:
        raise ExecutableNotFound(f"no `sglang` executable on PATH and ${SGLANG_BIN_ENV} is not set; {INSTALL_HINT}")
    return found


def command(spec: Spec, binary: str | os.PathLike | None = None,
            environ: Mapping[str, str] | None = None) -> list[str]:
    """The full command line that starts `spec`."""
    return [find_executable(spec, binary, environ), *spec.args()]


class ManagedServer:
    """One server process: `start`, `wait_healthy`, `stop` (or use it as a context manager: start and wait).

    Args:
        spec: what to run (`PolicyServer`, `DiffusionServer` or `RouterServer`).
        log_path: where its stdout and stderr go (appended).
        binary: the executable (see `find_executable`).
        env: extra environment variables (e.g. CUDA_VISIBLE_DEVICES for this replica).
        startup_timeout_s: how long `wait_healthy` waits by default.
        poll_s: seconds between health probes.
    """

    def __init__(self, spec: Spec, *, log_path: str | os.PathLike, binary: str | os.PathLike | None = None,
                 env: Mapping[str, str] | None = None, startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
                 poll_s: float = 1.0):
        self.spec, self.log_path = spec, Path(log_path)
        self.environ = {**os.environ, **(env or {})}
        self.command = command(spec, binary, self.environ)
        self.startup_timeout_s, self.poll_s = startup_timeout_s, poll_s
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The server root clients connect to (`http://host:port`; 0.0.0.0 is reached as 127.0.0.1)."""
        host = "127.0.0.1" if self.spec.host in ("0.0.0.0", "::") else self.spec.host
        return f"http://{host}:{self.spec.port}"

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The end of the server's log."""
        try:
            return self.log_path.read_text("utf-8", "replace")[-chars:]
        except FileNotFoundError:
            return ""

    def start(self) -> ManagedServer:
        """Starts the process in its own process group (so `stop` also ends its workers)."""
        if self.process is not None and self.process.poll() is None:
            raise ServerError(f"{self.url} is already running (pid {self.process.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as handle:
            handle.write(f"$ {' '.join(self.command)}\n".encode("utf-8"))
            handle.flush()
            self.process = subprocess.Popen(self.command, stdout=handle, stderr=subprocess.STDOUT, env=self.environ,
                                            start_new_session=True)
        log.info("started %s (pid %d), log %s", " ".join(self.command), self.process.pid, self.log_path)
        return self

    def healthy(self) -> bool:
        """Whether the health endpoint answers 200 now."""
        try:
            response = httpx.get(f"{self.url}/{self.spec.health_path}", timeout=HEALTH_TIMEOUT)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def wait_healthy(self, timeout_s: float | None = None) -> None:
        """Polls the health endpoint until it answers 200.

        Raises:
            ServerExited: the process ended first (its exit status and log tail in the message).
            ServerNotHealthy: still not healthy after the timeout (the process is stopped; log tail in the message).
        """
        if self.process is None:
            raise ServerError(f"{self.url} was never started; call start() first")
        timeout_s = self.startup_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                raise ServerExited(f"{self.command[0]} ({self.url}) exited with status {code} during start-up; the "
                                   f"end of {self.log_path}:\n{self.log_tail()}", code)
            if self.healthy():
                log.info("%s is healthy", self.url)
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise ServerNotHealthy(f"{self.url}/{self.spec.health_path} did not answer 200 within "
                                       f"{timeout_s:.0f} s (server stopped); the end of {self.log_path}:\n"
                                       f"{self.log_tail()}")
            time.sleep(self.poll_s)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """Ends the server (SIGTERM to its process group, SIGKILL after `timeout_s`); returns its exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            _signal_group(self.process, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.process, signal.SIGKILL)
                self.process.wait()
            log.info("stopped %s (status %s)", self.url, self.process.returncode)
        return self.process.returncode

    def __enter__(self) -> ManagedServer:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def start_replicas(specs: Sequence[Spec], *, log_dir: str | os.PathLike, binary: str | os.PathLike | None = None,
                   envs: Sequence[Mapping[str, str]] | None = None,
                   startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S) -> list[ManagedServer]:
    """Starts every server of `specs` at once (logs `log_dir/<kind>-<port>.log`, `envs[i]` for server i), then
    waits until all are healthy; on any failure stops them all and re-raises."""
    servers = [ManagedServer(spec, log_path=Path(log_dir) / f"{type(spec).__name__.lower()}-{spec.port}.log",
                             binary=binary, env=(envs[i] if envs else None), startup_timeout_s=startup_timeout_s)
               for i, spec in enumerate(specs)]
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_healthy()
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m ranger_jax.serving.sglang_server policy|diffusion|router ...`: starts the servers, waits until
    they are healthy, prints their URLs and keeps them running until interrupted (Ctrl-C or SIGTERM stops them)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("kind", choices=["policy", "diffusion", "router"])
    parser.add_argument("--model-path", help="policy / diffusion: checkpoint folder or hub id")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=30000, help="the first replica's port (one more per replica)")
    parser.add_argument("--replicas", type=int, default=1, help="policy: servers on this node")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per replica (policy: tp size)")
    parser.add_argument("--mem-fraction-static", type=float, default=0.8)
    parser.add_argument("--load-format", help="policy: e.g. dummy (random weights, for smoke tests)")
    parser.add_argument("--deterministic", action="store_true", help="policy: honour per-request seeds")
    parser.add_argument("--worker-urls", nargs="*", default=[], help="router: the policy servers")
    parser.add_argument("--binary", help=f"the sglang executable (default ${SGLANG_BIN_ENV}, else PATH)")
    parser.add_argument("--log-dir", default="sglang_logs")
    args = parser.parse_args(argv)
    if args.kind == "router":
        specs: list[Spec] = [RouterServer(worker_urls=tuple(args.worker_urls), host=args.host, port=args.port)]
        envs = None
    elif args.kind == "diffusion":
        specs = [DiffusionServer(model_path=args.model_path, host=args.host, port=args.port, num_gpus=args.gpus)]
        envs = None
    else:
        specs = [PolicyServer(model_path=args.model_path, host=args.host, port=args.port + i, tp_size=args.gpus,
                              mem_fraction_static=args.mem_fraction_static, load_format=args.load_format,
                              deterministic=args.deterministic) for i in range(args.replicas)]
        # replica i owns GPUs [i·gpus, (i+1)·gpus)
        envs = [{"CUDA_VISIBLE_DEVICES": ",".join(str(i * args.gpus + g) for g in range(args.gpus))}
                for i in range(args.replicas)]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    servers = start_replicas(specs, log_dir=args.log_dir, binary=args.binary, envs=envs)
    print(" ".join(s.url for s in servers), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while all(s.process.poll() is None for s in servers):
            time.sleep(5)
        return 1  # one of them died: stop the rest
    except (KeyboardInterrupt, SystemExit):
        return 0
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
