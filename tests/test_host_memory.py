"""`host_memory.retain_freed_memory`: a freed large block is reused without new page faults, in a fresh process."""

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ranger_jax import host_memory

BLOCK_MB = 64  # above glibc's largest dynamic mmap threshold (32 MiB): by default always a fresh mapping
BLOCK_PAGES = (BLOCK_MB << 20) // resource.getpagesize()

PROBE = textwrap.dedent(f"""
    import ctypes, json, resource, sys
    from ranger_jax import host_memory
    retained = host_memory.retain_freed_memory() if sys.argv[1] == "retain" else False
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size = {BLOCK_MB} << 20

    def touch():
        block = libc.malloc(size)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        ctypes.memset(block, 1, size)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        libc.free(ctypes.c_void_p(block))
        return faults

    first = touch()
    print(json.dumps({{"retained": retained, "first": first, "again": [touch() for _ in range(3)]}}))
""")

glibc_only = pytest.mark.skipif(host_memory._glibc() is None, reason="glibc's malloc only")


def _probe(mode: str, env_extra: dict[str, str] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != host_memory.ENV_VAR} | (env_extra or {})
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@glibc_only
def test_a_freed_block_is_reused_without_page_faults():
    default = _probe("default")
    retained = _probe("retain")
    assert retained["retained"] is True
    # a new block is faulted in either way
    assert default["first"] > BLOCK_PAGES // 2 and retained["first"] > BLOCK_PAGES // 2
    assert max(retained["again"]) < BLOCK_PAGES // 20  # reused: its pages are still mapped
    # glibc's default maps each new block afresh (huge pages would shrink the count, hence the margin)
    assert min(default["again"]) > BLOCK_PAGES // 20 or _transparent_huge_pages_always()


@glibc_only
def test_the_environment_variable_turns_it_off():
    off = _probe("retain", {host_memory.ENV_VAR: "0"})
    assert off["retained"] is False
    assert min(off["again"]) > BLOCK_PAGES // 20 or _transparent_huge_pages_always()


def test_other_c_libraries_are_left_alone(monkeypatch):
    monkeypatch.setattr(host_memory, "_glibc", lambda: None)
    monkeypatch.delenv(host_memory.ENV_VAR, raising=False)
    assert host_memory.retain_freed_memory() is False


def _transparent_huge_pages_always() -> bool:
    try:
        return "[always]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
