"""JAX's persistent compilation cache for one run: a program compiled once is loaded from disk by every later
process of the run that compiles the same program (the actors, the evaluations) and by a rerun of the run.

On two CPU cores the sim-tiny run spends minutes compiling: the sampler compiles a program per shape bucket
(`sampling.buckets`) and each evaluation or actor process starts with an empty in-memory cache. JAX keys cached
programs by their HLO, compile options, backend and JAX version, so a hit is the same program, never a stale one.

    with compilation_cache.enabled(out / "jax_cache") as env:  # this process, until the block ends
        subprocess.Popen(command, env={**os.environ, **env})    # child processes use the same folder

JAX opens its cache folder once per process and keeps writing into it even after the folder setting changes; the
scoped form closes it again on exit, so a long-lived caller (a notebook, a test session) does not go on reading and
writing a run's folder after the run.
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


def _reopen() -> None:
    """Makes JAX open the folder now configured at its next compilation (it caches the opened folder)."""
    from jax._src import compilation_cache as jax_cache  # no public API closes the opened folder

    jax_cache.reset_cache()


def enable(directory: str | os.PathLike) -> dict[str, str]:
    """Caches every program this process compiles from now on in `directory` (created if missing), for the rest
    of the process, and returns the environment variables that make a child process use the same folder.

    Raises:
        ValueError: `directory` exists and is not a folder.
    """
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ValueError(f"compilation cache {path} exists and is not a folder")
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # the tiny programs take ~1 s each
    _reopen()
    return {DIR_VAR: str(path), MIN_TIME_VAR: "0"}


@contextlib.contextmanager
def enabled(directory: str | os.PathLike) -> Iterator[dict[str, str]]:
    """`enable(directory)` for the block only: on exit this process's cache settings are what they were before
    (and the folder is closed), so compilations after the block neither read nor write `directory`."""
    saved = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
    try:
        yield enable(directory)
    finally:
        jax.config.update("jax_compilation_cache_dir", saved[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])
        _reopen()
