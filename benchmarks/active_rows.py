"""Sampler calls on the rows that have work (`Buckets.active_rows`) against calls on the whole batch: one held-out
evaluation each, side by side.

    python benchmarks/active_rows.py [--world DIR --policy CHECKPOINT] [--tasks N] [--concurrency 32]
                                     [--min-active-rows 8] [--sampled] [--json OUT]

With continuous batching an episode's turn joins the batch as soon as its tool answers, so most append calls carry
the observations of a few rows and many decode calls run a few rows; on the whole batch each such call costs all
`--concurrency` rows at the longest row's length. With `min_active_rows` below the batch, a call whose rows fit a
smaller power of two gathers those rows, runs on them and writes them back. Runs
`rollout.evaluate.evaluate_checkpoint` with `min_active_rows` = the batch (every call on the whole batch) and with
`--min-active-rows`, each three times in one process: the first compiles (timed as "cold", into a persistent
compilation cache of its own), the best of the next two is "warm" (which shapes a run meets depends on the timing
of its episodes, so a warm run still compiles a few). Prints both walls, the speed-up, the compile seconds, and
whether the per-task rewards agree (they should: the rows compute the same values). `--sampled` scores the way
sim-tiny's GRPO actor samples (4 episodes a task, turn 2 decision-sampled, shared trunks). Without `--policy` it
builds a world and a random `Qwen3VLConfig.tiny()` checkpoint; the sim-tiny run's `sft_policy/` on its held-out
world is the realistic case.
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
    eval_setup.add_report_arguments(parser, concurrency_help="episodes in flight (the batch)")
    parser.add_argument("--min-active-rows", type=int, default=Buckets().min_active_rows,
                        help="the smallest sub-batch a call on a few rows runs on")
    args = parser.parse_args()
    if not 1 <= args.min_active_rows < args.concurrency:
        parser.error(f"--min-active-rows must be in [1, --concurrency); got {args.min_active_rows}")
    with tempfile.TemporaryDirectory(prefix="active_rows_") as tmp:
        tmp = Path(tmp)
        world, checkpoint = eval_setup.world_and_policy(args, tmp)
        whole = eval_setup.timed_runs(world, checkpoint, tmp / "cache-whole",
                                      buckets=Buckets(min_active_rows=args.concurrency), limit=args.tasks,
                                      concurrency=args.concurrency, sampled=args.sampled)
        some = eval_setup.timed_runs(world, checkpoint, tmp / "cache-some",
                                     buckets=Buckets(min_active_rows=args.min_active_rows), limit=args.tasks,
                                     concurrency=args.concurrency, sampled=args.sampled)
    eval_setup.report(args, world, ("whole_batch", "whole batch", whole),
                      ("active_rows", f"active rows (>= {args.min_active_rows})", some),
                      min_active_rows=args.min_active_rows)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
