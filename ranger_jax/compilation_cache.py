"""JAX's persistent compilation cache for runs: a program compiled once is loaded from disk by every later process
that compiles the same program, in the run (the actors, the evaluations) and in later runs that use the folder.

On two CPU cores the sim-tiny run spends minutes compiling: the sampler compiles a program per shape bucket
(`sampling.buckets`) and each evaluation or actor process starts with an empty in-memory cache. JAX keys cached
programs by their HLO, compile options, backend and JAX version, so a hit is the same program, never a stale one.

    with compilation_cache.enabled(default_dir()) as env:  # this process, until the block ends
        subprocess.Popen(command, env={**os.environ, **env})    # child processes use the same folder

JAX opens its cache folder once per process and keeps writing into it even after the folder setting changes; the
scoped form closes it again on exit, so a long-lived caller (a notebook, a test session) does not go on reading and
writing a run's folder after the run.

Programs are keyed by what they are, not by where the cache lives. By default JAX also turns on XLA's GPU
autotuning cache in a subfolder of the cache folder, and that subfolder's path is part of every program's key
(`jax_persistent_cache_enable_xla_caches`), so two folders never share a program even on a CPU, where nothing is
autotuned: two sim-tiny runs of different seeds in their own folders compiled 270 programs each and shared none.
`enable` turns XLA's caches off unless asked (`xla_caches`), so one folder (`default_dir()`, the user's cache) serves
every run on a machine, and a folder copied or moved elsewhere still hits.

JAX never removes a program unless it is given a size limit, and its limit needs a lock and a timestamp file per
program that folders written without one lack. `enable` bounds the folder itself instead: before JAX opens it, the
programs used longest ago are deleted until the folder holds at most `max_bytes` (`prune`). A sim-tiny run writes
~15 MB of programs per set of shapes, so the default 2 GiB keeps a hundred or more such runs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import jax

# Environment variables JAX reads at import (the same options as `jax.config`): how child processes join the cache.
DIR_VAR = "JAX_COMPILATION_CACHE_DIR"
MIN_TIME_VAR = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
XLA_CACHES_VAR = "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"
# Where `default_dir` puts the shared cache when set (else under XDG_CACHE_HOME, else ~/.cache).
DEFAULT_DIR_VAR = "RANGER_JAX_CACHE_DIR"
# The most a folder keeps when `enable` opens it (`prune`).
DEFAULT_MAX_BYTES = 2 << 30
# How JAX names a program's file in the folder (`jax._src.lru_cache`), and the access-time file it writes beside it
# when it has a size limit of its own.
_PROGRAM_SUFFIX = "-cache"
_ATIME_SUFFIX = "-atime"


def default_dir() -> Path:
    """The folder every run on this machine shares by default: $RANGER_JAX_CACHE_DIR if set, else
    $XDG_CACHE_HOME/ranger_jax/jax, else ~/.cache/ranger_jax/jax. Deleting it is safe (programs compile again)."""
    if os.environ.get(DEFAULT_DIR_VAR):
        return Path(os.environ[DEFAULT_DIR_VAR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "ranger_jax" / "jax"


def _reopen() -> None:
    """Makes JAX open the folder now configured at its next compilation (it caches the opened folder)."""
    from jax._src import compilation_cache as jax_cache  # no public API closes the opened folder

    jax_cache.reset_cache()


def prune(directory: str | os.PathLike, max_bytes: int) -> tuple[int, int]:
    """Deletes the programs in `directory` used longest ago until the rest take at most `max_bytes`; returns how many
    programs and bytes it deleted. A program's last use is its file's later of access and modification time (a
    program read since it was written has the later access time where the filesystem records it; under `noatime`
    this is the oldest written first). Files that are not JAX programs are neither counted nor touched. A program
    deleted while another process uses the folder is compiled again there, nothing worse.

    Raises:
        ValueError: `max_bytes` is negative or not an int.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ValueError(f"compilation cache max_bytes must be an int >= 0; got {max_bytes!r}")
    programs = []
    for path in Path(directory).glob(f"*{_PROGRAM_SUFFIX}"):
        try:
            stat = path.stat()
        except FileNotFoundError:  # deleted by another process meanwhile
            continue
        programs.append((max(stat.st_atime_ns, stat.st_mtime_ns), path.name, stat.st_size, path))
    total = sum(size for _, _, size, _ in programs)
    removed = removed_bytes = 0
    for _, _, size, path in sorted(programs):
        if total <= max_bytes:
            break
        path.unlink(missing_ok=True)
        path.with_name(path.name.removesuffix(_PROGRAM_SUFFIX) + _ATIME_SUFFIX).unlink(missing_ok=True)
        total -= size
        removed += 1
        removed_bytes += size
    return removed, removed_bytes


def enable(directory: str | os.PathLike, *, xla_caches: str = "none",
           max_bytes: int | None = DEFAULT_MAX_BYTES) -> dict[str, str]:
    """Caches every program this process compiles from now on in `directory` (created if missing), for the rest
    of the process, and returns the environment variables that make a child process use the same folder.

    Args:
        directory: the cache folder.
        max_bytes: first `prune` the folder to this size (None: keep everything). It is bounded when it is
            opened, not while a run writes to it.
        xla_caches: `jax_persistent_cache_enable_xla_caches`: "none" (the default here) keys programs without the
            folder, so folders share them; JAX's own default, "xla_gpu_per_fusion_autotune_cache_dir", keeps GPU
            autotuning results in the folder at the cost of keys that name it.

    Raises:
        ValueError: `directory` exists and is not a folder.
    """
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ValueError(f"compilation cache {path} exists and is not a folder")
    path.mkdir(parents=True, exist_ok=True)
    if max_bytes is not None:
        prune(path, max_bytes)
    _apply((str(path), 0.0, xla_caches))  # a minimum compile time of 0: the tiny programs take ~1 s each
    return {DIR_VAR: str(path), MIN_TIME_VAR: "0", XLA_CACHES_VAR: xla_caches}


@contextlib.contextmanager
def enabled(directory: str | os.PathLike, *, xla_caches: str = "none",
            max_bytes: int | None = DEFAULT_MAX_BYTES) -> Iterator[dict[str, str]]:
    """`enable(directory, xla_caches=..., max_bytes=...)` for the block only: on exit this process's cache settings
    are what they were before (and the folder is closed), so compilations after the block neither read nor write
    `directory`."""
    saved = settings()
    try:
        yield enable(directory, xla_caches=xla_caches, max_bytes=max_bytes)
    finally:
        _apply(saved)


def settings() -> tuple[str | None, float, str | None]:
    """This process's cache settings (folder, minimum compile time, XLA caches), for `join` in a worker process."""
    return (jax.config.jax_compilation_cache_dir, float(jax.config.jax_persistent_cache_min_compile_time_secs),
            jax.config.jax_persistent_cache_enable_xla_caches)


def join(saved: tuple[str | None, float, str | None]) -> None:
    """Makes this (worker) process compile into the cache `settings()` described in its parent, keyed as the parent
    keys its programs (the XLA caches setting is part of every key), so each loads what the other compiled. A
    folder of None leaves the process without a cache."""
    if saved[0] is not None:
        _apply(saved)


def _apply(saved: tuple[str | None, float, str | None]) -> None:
    """Sets this process's cache settings to `saved` (as `settings()` returns them) and reopens the folder."""
    folder, min_time, xla_caches = saved
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)
    jax.config.update("jax_persistent_cache_enable_xla_caches", xla_caches)
    _reopen()
