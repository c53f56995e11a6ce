"""An evaluation split between worker processes, each pinned to its own share of the cores
(`evaluate_checkpoint(pin_cpus=True)`, the default) against the same workers free to run on every core: side by side.

    python benchmarks/pinned_workers.py [--world DIR --policy CHECKPOINT] [--tasks N] [--concurrency 32]
                                        [--processes 2] [--sampled] [--json OUT]

XLA's CPU client sizes each process's thread pool to the cores it may run on, so two JAX processes on two cores
start four pool threads that preempt one another; pinned (`cpu_affinity.split_cpus`), each has a pool of its own
core. sim-tiny's two GRPO actors (`actor --cpus`) and its split evaluations run pinned. Three runs each way, into a
persistent compilation cache of each side's own: the first compiles ("cold"), the best of the next two is "warm".
Prints both walls, the speed-up and whether the per-task rewards agree (they should: the same episodes).
`--sampled` scores as sim-tiny's GRPO actor samples. Linux only (`os.sched_setaffinity`).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import eval_setup  # benchmarks/eval_setup.py, beside this script
from ranger_jax import cpu_affinity
from ranger_jax.sampling import Buckets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    eval_setup.add_arguments(parser)
    eval_setup.add_report_arguments(parser, concurrency_help="episodes in flight, over all processes")
    parser.add_argument("--processes", type=int, default=2, help="worker processes of the evaluation")
    args = parser.parse_args()
    if args.processes < 2:
        parser.error(f"--processes must be at least 2 (one process has nothing to share); got {args.processes}")
    if not cpu_affinity.can_pin():
        parser.error("pinning needs os.sched_setaffinity (Linux)")
    with tempfile.TemporaryDirectory(prefix="pinned_workers_") as tmp:
        tmp = Path(tmp)
        world, checkpoint = eval_setup.world_and_policy(args, tmp)
        runs = {}
        for pinned in (False, True):
            runs[pinned] = eval_setup.timed_runs(world, checkpoint, tmp / f"cache-{pinned}", buckets=Buckets(),
                                                 limit=args.tasks, concurrency=args.concurrency,
                                                 sampled=args.sampled, processes=args.processes, pin_cpus=pinned)
    eval_setup.report(args, world, ("unpinned", "every core", runs[False]),
                      ("pinned", "a share of the cores each", runs[True]), processes=args.processes)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
