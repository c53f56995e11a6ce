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
    assert env == {compilation_cache.DIR_VAR: str(tmp_path / "cache"), compilation_cache.MIN_TIME_VAR: "0",
                   compilation_cache.XLA_CACHES_VAR: "none"}
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


def _programs(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("jit_"))


def test_two_folders_key_a_program_alike_so_a_copied_cache_hits(tmp_path):
    """JAX's default puts the GPU autotuning cache's path, inside the folder, into every key; with XLA's caches off
    the key is the program's, so one folder serves every run and a copy of it hits."""
    names = {}
    for name in ("a", "b"):
        with compilation_cache.enabled(tmp_path / name) as env:
            pass
        assert _child(env)["hits"] == 0
        names[name] = _programs(tmp_path / name)
    assert names["a"] == names["b"] and names["a"]
    (tmp_path / "copy").mkdir()
    for path in (tmp_path / "a").iterdir():
        (tmp_path / "copy" / path.name).write_bytes(path.read_bytes())
    with compilation_cache.enabled(tmp_path / "copy") as env:
        pass
    assert _child(env)["hits"] >= 1
    with compilation_cache.enabled(tmp_path / "gpu", xla_caches="xla_gpu_per_fusion_autotune_cache_dir") as env:
        pass
    assert env[compilation_cache.XLA_CACHES_VAR] == "xla_gpu_per_fusion_autotune_cache_dir"
    assert _child(env)["hits"] == 0 and _programs(tmp_path / "gpu") != names["a"]  # JAX's default: keyed by folder


JOINED = """
import json, sys
import jax, jax.numpy as jnp
from ranger_jax import compilation_cache
compilation_cache.join(tuple(json.loads(sys.argv[1])))
jax.jit(lambda x: jnp.tanh(x @ x.T).sum() * 3.0 + 1.5)(jnp.ones((7, 5))).block_until_ready()
print(json.dumps([jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_enable_xla_caches]))
"""


def test_a_worker_that_joins_the_parents_cache_keys_programs_as_the_parent_does(tmp_path, every_program_cacheable):
    folder = tmp_path / "cache"
    with compilation_cache.enabled(folder):
        saved = compilation_cache.settings()
        jax.jit(lambda x: jnp.tanh(x @ x.T).sum() * 3.0 + 1.5)(jnp.ones((7, 5))).block_until_ready()
    assert saved == (str(folder), 0.0, "none")
    written = [name for name in _programs(folder) if name.startswith("jit__lambda")]
    assert len(written) == 1
    out = subprocess.run([sys.executable, "-c", JOINED, json.dumps(saved)], capture_output=True, text=True,
                         timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [str(folder), "none"]
    # the worker loaded the parent's program: it wrote no second one (other programs, e.g. jnp.ones', it may write)
    assert [name for name in _programs(folder) if name.startswith("jit__lambda")] == written
    out = subprocess.run([sys.executable, "-c", JOINED, json.dumps([None, 0.0, None])], capture_output=True,
                         text=True, timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1])[0] is None  # no folder: the worker compiles alone


def test_the_default_folder_is_the_users_cache_unless_the_environment_names_one(tmp_path, monkeypatch):
    monkeypatch.setenv(compilation_cache.DEFAULT_DIR_VAR, str(tmp_path / "mine"))
    assert compilation_cache.default_dir() == tmp_path / "mine"
    monkeypatch.delenv(compilation_cache.DEFAULT_DIR_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compilation_cache.default_dir() == tmp_path / "xdg" / "ranger_jax" / "jax"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compilation_cache.default_dir() == tmp_path / "home" / ".cache" / "ranger_jax" / "jax"


def test_the_scoped_cache_puts_xla_caches_back_on_exit(tmp_path):
    saved = jax.config.jax_persistent_cache_enable_xla_caches
    with compilation_cache.enabled(tmp_path / "cache"):
        assert jax.config.jax_persistent_cache_enable_xla_caches == "none"
    assert jax.config.jax_persistent_cache_enable_xla_caches == saved


def _program(folder, name, size, used_ns):
    path = folder / f"jit_{name}-{name * 8}-cache"
    path.write_bytes(b"x" * size)
    os.utime(path, ns=(used_ns, used_ns))
    return path


def test_prune_deletes_the_programs_used_longest_ago_down_to_the_size(tmp_path):
    second = 1_000_000_000
    old = _program(tmp_path, "a", 300, 10 * second)
    (tmp_path / f"{old.name.removesuffix('-cache')}-atime").write_bytes(b"12345678")  # JAX's, with its own limit
    read_later = _program(tmp_path, "b", 300, 20 * second)
    os.utime(read_later, ns=(50 * second, 20 * second))  # written second, read last
    newer = _program(tmp_path, "c", 300, 30 * second)
    other = tmp_path / "xla_gpu_per_fusion_autotune_cache_dir"
    other.mkdir()
    (other / "entry").write_bytes(b"y" * 5000)  # not a program: neither counted nor touched
    assert compilation_cache.prune(tmp_path, 600) == (1, 300)
    assert not old.exists() and not (tmp_path / f"{old.name.removesuffix('-cache')}-atime").exists()
    assert read_later.exists() and newer.exists() and (other / "entry").exists()
    assert compilation_cache.prune(tmp_path, 300) == (1, 300)
    assert read_later.exists() and not newer.exists()
    assert compilation_cache.prune(tmp_path, 300) == (0, 0)
    assert compilation_cache.prune(tmp_path, 0) == (1, 300) and not read_later.exists()
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="max_bytes"):
            compilation_cache.prune(tmp_path, bad)


def test_opening_a_folder_bounds_it_unless_told_not_to(tmp_path):
    for i, name in enumerate("abcd"):
        _program(tmp_path, name, 1000, (i + 1) * 1_000_000_000)
    with compilation_cache.enabled(tmp_path, max_bytes=None):
        pass
    assert len(_programs(tmp_path)) == 4
    with compilation_cache.enabled(tmp_path, max_bytes=2500):
        pass
    assert _programs(tmp_path) == sorted(f"jit_{n}-{n * 8}-cache" for n in "cd")
    assert compilation_cache.DEFAULT_MAX_BYTES >= 1 << 30  # a default far above one run's ~15 MB
