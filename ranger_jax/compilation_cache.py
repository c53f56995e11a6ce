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


def enable(directory: str | os.PathLike, *, xla_caches: str = "none") -> dict[str, str]:
    """Caches every program this process compiles from now on in `directory` (created if missing), for the rest
    of the process, and returns the environment variables that make a child process use the same folder.

    Args:
        directory: the cache folder.
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
    _apply((str(path), 0.0, xla_caches))  # a minimum compile time of 0: the tiny programs take ~1 s each
    return {DIR_VAR: str(path), MIN_TIME_VAR: "0", XLA_CACHES_VAR: xla_caches}


@contextlib.contextmanager
def enabled(directory: str | os.PathLike, *, xla_caches: str = "none") -> Iterator[dict[str, str]]:
    """`enable(directory, xla_caches=...)` for the block only: on exit this process's cache settings are what they
    were before (and the folder is closed), so compilations after the block neither read nor write `directory`."""
    saved = settings()
    try:
        yield enable(directory, xla_caches=xla_caches)
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
