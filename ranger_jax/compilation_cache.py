"""JAX's persistent compilation cache for one run: a program compiled once is loaded from disk by every later
process of the run that compiles the same program (the actors, the evaluations) and by a rerun of the run.

On two CPU cores the sim-tiny run spends minutes compiling: the sampler compiles a program per shape bucket
(`sampling.buckets`) and each evaluation or actor process starts with an empty in-memory cache. JAX keys cached
programs by their HLO, compile options, backend and JAX version, so a hit is the same program, never a stale one.

    env = compilation_cache.enable(out / "jax_cache")     # this process, from its first compilation on
    subprocess.Popen(command, env={**os.environ, **env})   # child processes use the same folder
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import jax

log = logging.getLogger(__name__)

# Environment variables JAX reads at import (the same options as `jax.config`): how child processes join the cache.
DIR_VAR = "JAX_COMPILATION_CACHE_DIR"
MIN_TIME_VAR = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


def enable(directory: str | os.PathLike) -> dict[str, str]:
    """Caches every compiled program of this process in `directory` (created if missing), and returns the
    environment variables that make a child process use the same folder.

    JAX decides once per process, at its first compilation, whether the cache is on: a process that compiled
    anything before this call keeps compiling without it (a warning is logged); its children still use it.

    Raises:
        ValueError: `directory` exists and is not a folder.
    """
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ValueError(f"compilation cache {path} exists and is not a folder")
    path.mkdir(parents=True, exist_ok=True)
    from jax._src import compilation_cache as jax_cache  # whether this process already decided (no public API)

    if getattr(jax_cache, "_cache_checked", False) and not getattr(jax_cache, "_cache_used", False):
        log.warning("this process compiled before the compilation cache was enabled: it compiles without the cache "
                    "(%s); its child processes use it", path)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # the tiny programs take ~1 s each
    return {DIR_VAR: str(path), MIN_TIME_VAR: "0"}
