"""Pinning worker processes to their own CPU cores.

XLA's CPU client sizes its thread pool to the cores a process may run on. Several JAX processes sharing a few cores
(sim-tiny's GRPO actors, an evaluation split into parts) each start a pool as wide as the machine, and their threads
preempt one another. Measured on 2 cores (docs/sim_tiny.md): a sampled evaluation split between two processes took
26-30 s pinned one core each against 31-36 s unpinned, with ~8% less CPU and the same rewards.

Linux only (`os.sched_setaffinity`); elsewhere `pin` is refused with a clear error and `usable_cpus` reports every
core.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence


def can_pin() -> bool:
    """Whether this platform can pin a process to cores (Linux's `os.sched_setaffinity`)."""
    return hasattr(os, "sched_setaffinity")


def usable_cpus() -> list[int]:
    """The CPU ids this process may run on, ascending."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def split_cpus(parts: int, cpus: Sequence[int] | None = None) -> list[list[int]]:
    """`cpus` (default: `usable_cpus()`) shared out among `parts` processes: contiguous, as even as can be, every
    cpu used once when there are at least as many as parts; with fewer, part i gets cpu i mod len(cpus).

    Raises:
        ValueError: `parts` below 1, or no cpus.
    """
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"split_cpus needs a positive int of parts; got {parts!r}")
    cpus = list(usable_cpus() if cpus is None else cpus)
    if not cpus:
        raise ValueError("split_cpus needs at least one cpu; got none")
    if parts >= len(cpus):
        return [[cpus[i % len(cpus)]] for i in range(parts)]
    base, extra = divmod(len(cpus), parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (i < extra)
        out.append(cpus[start:start + size])
        start += size
    return out


def parse_cpus(text: str) -> list[int]:
    """CPU ids from a command line's comma-separated list ("0" or "0,1").

    Raises:
        ValueError: an empty list or a part that is not an int >= 0, naming the whole value.
    """
    try:
        cpus = [int(part) for part in text.split(",")]
    except ValueError:
        cpus = []
    if not cpus or any(cpu < 0 for cpu in cpus):
        raise ValueError(f"--cpus must be comma-separated CPU ids (ints >= 0, e.g. 0 or 0,1); got {text!r}")
    return cpus


def pin(cpus: Iterable[int]) -> list[int]:
    """Restricts this process (every thread it has now, and so every thread they start) to `cpus`; returns them
    sorted. Call it before JAX starts its CPU client, so its thread pool is sized to them.

    Raises:
        ValueError: no cpus, or cpus this process may not run on (naming them and the usable ones).
        OSError: a platform without `os.sched_setaffinity`.
    """
    wanted = sorted(set(cpus))
    if not wanted:
        raise ValueError("pin needs at least one cpu; got none")
    if not can_pin():
        raise OSError("pinning to CPUs needs os.sched_setaffinity (Linux); this platform has none")
    usable = usable_cpus()
    unknown = [cpu for cpu in wanted if cpu not in usable]
    if unknown:
        raise ValueError(f"cannot pin to CPU(s) {unknown}: this process may run on {usable} only")
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, wanted)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            continue
    return wanted
