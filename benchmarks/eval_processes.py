"""An evaluation split between worker processes (`evaluate_checkpoint(processes=N)`) against one process with as many
rows in all: side by side.

    python benchmarks/eval_processes.py [--world DIR --policy CHECKPOINT] [--tasks N] [--concurrency 32]
                                        [--processes 2] [--sampled] [--json OUT]

One process keeps ~1.5 of 2 CPU cores busy: its episodes' Python (tool calls, perception, the event loop) and its
sampler calls take turns on one thread. With `--processes N` each worker plays the tasks whose index is its own
modulo N (`runner.RolloutConfig.part`, seeded as in one process) with `--concurrency / N` rows, which is how
sim-tiny's two GRPO actors and its evaluations run. Runs `rollout.evaluate.evaluate_checkpoint` both ways, three
times each, into a persistent compilation cache of each side's own: the first compiles ("cold"), the best of the
next two is "warm". Prints both walls, the speed-up and whether the per-task rewards agree (they should: the same
episodes). `--sampled` scores the way sim-tiny's GRPO actor samples (4 episodes a task, turn 2 decision-sampled,
shared trunks). Without `--policy` it builds a world and a random `Qwen3VLConfig.tiny()` checkpoint; the sim-tiny
run's `sft_policy/` on its held-out world is the realistic case.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import eval_setup  # benchmarks/eval_setup.py, beside this script
from ranger_jax.sampling import Buckets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    eval_setup.add_arguments(parser)
    eval_setup.add_report_arguments(parser, concurrency_help="episodes in flight, over all processes")
    parser.add_argument("--processes", type=int, default=2, help="worker processes of the split evaluation")
    args = parser.parse_args()
    if args.processes < 2:
        parser.error(f"--processes must be at least 2 (the reference is one process); got {args.processes}")
    with tempfile.TemporaryDirectory(prefix="eval_processes_") as tmp:
        tmp = Path(tmp)
        world, checkpoint = eval_setup.world_and_policy(args, tmp)
        runs = {}
        for processes in (1, args.processes):
            runs[processes] = eval_setup.timed_runs(world, checkpoint, tmp / f"cache-{processes}", buckets=Buckets(),
                                                    limit=args.tasks, concurrency=args.concurrency,
                                                    sampled=args.sampled, processes=processes)
    eval_setup.report(args, world, ("one_process", "one process", runs[1]),
                      ("processes", f"{args.processes} processes", runs[args.processes]), processes=args.processes)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
