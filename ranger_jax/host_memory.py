"""Freed host memory kept for reuse: glibc's malloc told not to hand large blocks back to the kernel.

XLA on CPU allocates the buffers of every program it runs with `malloc`. By default glibc serves a large block with
a fresh `mmap` and unmaps it when it is freed (or trims the top of its heap), so each training or decode step
writes into pages the kernel has just mapped and must zero on first touch. In sim-tiny's SFT that was ~115,000
page faults a second and 15-18% of the CPU spent in the kernel (`perf`: the faults land in the matmul kernels'
first writes to their outputs). With large blocks taken from the heap, no trimming and one arena for all threads,
a step reuses the pages the step before freed. Addresses change, values do not: XLA aligns its buffers itself.

    host_memory.retain_freed_memory()   # first thing in a process, before JAX runs anything

The process keeps the memory it freed (its resident size stays near its peak, as with tcmalloc or jemalloc, which
TPU VMs preload for the same reason). `RANGER_JAX_RETAIN_FREED_MEMORY=0` in the environment turns it off. Other
C libraries (macOS, musl) are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

log = logging.getLogger(__name__)

ENV_VAR = "RANGER_JAX_RETAIN_FREED_MEMORY"  # "0" turns `retain_freed_memory` off

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

MMAP_THRESHOLD_BYTES = 1 << 30  # blocks above 1 GiB still get their own mapping (returned to the kernel when freed)
TRIM_THRESHOLD_BYTES = (1 << 31) - 1  # the largest an int takes: free memory at the heap's top is kept up to 2 GiB


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") else None


def retain_freed_memory() -> bool:
    """Makes this process's glibc malloc keep freed blocks for reuse (see the module docstring); True when set.

    Call it before JAX starts its thread pools: the one-arena setting only reaches threads that have not allocated
    yet. Does nothing (False) on other C libraries, or when `RANGER_JAX_RETAIN_FREED_MEMORY` is "0".
    """
    if os.environ.get(ENV_VAR, "1").strip() == "0":
        return False
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES), (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES), (M_ARENA_MAX, 1))
    refused = [name for (name, value) in settings if libc.mallopt(name, value) != 1]
    if refused:
        log.warning("glibc mallopt refused parameters %s; freed host memory is returned to the kernel as before",
                    refused)
        return False
    return True
