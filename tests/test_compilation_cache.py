"""The persistent compilation cache of a run: child processes write and reuse compiled programs in its folder."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from ranger_jax import compilation_cache

CHILD = """
import json
import jax, jax.numpy as jnp
from jax._src import monitoring
hits = []
monitoring.register_event_listener(lambda name, **kw: hits.append(name) if "cache_hits" in name else None)
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum() * 3.0 + 1.5)
f(jnp.ones((7, 5))).block_until_ready()
print(json.dumps({"hits": len(hits)}))
"""


def _child(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_child_processes_share_compiled_programs(tmp_path):
    with compilation_cache.enabled(tmp_path / "cache") as env:
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cache")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    assert env == {compilation_cache.DIR_VAR: str(tmp_path / "cache"), compilation_cache.MIN_TIME_VAR: "0"}
    assert _child(env)["hits"] == 0  # the first process compiles and writes the program
    assert any((tmp_path / "cache").iterdir())
    assert _child(env)["hits"] >= 1  # the next one loads it


def test_a_file_in_the_way_is_named(tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match="cache.*not a folder"):
        with compilation_cache.enabled(blocker):
            pass


def test_the_scoped_cache_is_closed_on_exit(tmp_path, every_program_cacheable):
    saved = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
    folder = tmp_path / "cache"
    with compilation_cache.enabled(folder) as env:
        assert env[compilation_cache.DIR_VAR] == str(folder)
        jax.jit(lambda x: jnp.cos(x) * 2.75 + 0.125)(jnp.ones((5, 3))).block_until_ready()
        written = sorted(p.name for p in folder.iterdir())
        assert written  # this process compiled into the folder
    assert (jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs) == saved
    jax.jit(lambda x: jnp.cos(x) * 3.75 - 0.625)(jnp.ones((5, 3))).block_until_ready()  # after the block
    assert sorted(p.name for p in folder.iterdir()) == written


def test_the_scoped_cache_is_closed_when_the_block_fails(tmp_path, every_program_cacheable):
    saved = jax.config.jax_compilation_cache_dir
    with pytest.raises(RuntimeError, match="inside"):
        with compilation_cache.enabled(tmp_path / "cache"):
            jax.jit(lambda x: jnp.tan(x) * 0.5)(jnp.ones((2, 9))).block_until_ready()
            raise RuntimeError("inside")
    assert jax.config.jax_compilation_cache_dir == saved
    written = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert written
    jax.jit(lambda x: jnp.tan(x) * 1.5)(jnp.ones((2, 9))).block_until_ready()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == written
