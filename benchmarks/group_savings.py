"""What the GRPO actor's three savings on a group's work buy, added one at a time: one sampled evaluation per setting,
side by side.

    python benchmarks/group_savings.py [--world DIR --policy CHECKPOINT] [--tasks 40] [--samples 8]
                                       [--branch-turn 2] [--concurrency 32] [--json OUT]

Every setting plays the tasks the way sim-tiny's GRPO actor does (`--samples` episodes a task forked from one shared
trunk, turn `--branch-turn` decision-sampled alone: temperature 1, draws where the top token is below 0.9, at most 2;
the other turns greedy):

  1. before: each fork appends the trunk's last observation itself, an append call pads every row to its longest
     (`Buckets(group_appends=False, min_append_rows=8)`), every sample plays its greedy continuation;
  2. + the trunk's row takes the branching turn's prompt before the fork (`RolloutConfig.prefill_trunk`);
  3. + appends split by length into calls on as few rows as they need (`Buckets.append_groups`, `min_append_rows` 1);
  4. + a sample repeating an earlier one's sampled turn takes over its continuation
     (`RolloutConfig.share_continuations`).

Prints episodes/s of each, the speed-up over the first, and whether the per-task rewards agree with the first (they
should: every saving plays the same episodes). Each setting is timed on its second run (the first, on 16 tasks,
compiles into a persistent compilation cache of the benchmark). Without `--policy` it builds a world and a random
`Qwen3VLConfig.tiny()` checkpoint, whose episodes mostly end at their first turns; the sim-tiny run's `sft_policy/`
on its GRPO world (`worlds/grpo-*`) is the realistic case.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import eval_setup  # benchmarks/eval_setup.py, beside this script
from ranger_jax import compilation_cache, fileio
from ranger_jax.sampling import Buckets

UNGROUPED = Buckets(group_appends=False, min_append_rows=8)
SETTINGS = (
    ("before", "before", dict(prefill_trunk=False, buckets=UNGROUPED, share_continuations=False)),
    ("prefill_trunk", "+ trunk prefilled", dict(prefill_trunk=True, buckets=UNGROUPED, share_continuations=False)),
    ("append_groups", "+ appends by length", dict(prefill_trunk=True, buckets=Buckets(), share_continuations=False)),
    ("share_continuations", "+ shared continuations",
     dict(prefill_trunk=True, buckets=Buckets(), share_continuations=True)),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    eval_setup.add_arguments(parser)
    parser.add_argument("--samples", type=int, default=8, help="episodes a task (a GRPO group)")
    parser.add_argument("--branch-turn", type=int, default=2, help="the one sampled turn")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.samples < 2 or args.branch_turn < 1 or args.concurrency < args.samples:
        parser.error(f"shared trunks need --samples >= 2, --branch-turn >= 1 and --concurrency >= --samples; got "
                     f"{args.samples}, {args.branch_turn}, {args.concurrency}")

    workdir = Path(tempfile.mkdtemp(prefix="group_savings_"))
    world, checkpoint = eval_setup.world_and_policy(args, workdir)
    options = dict(limit=args.tasks, samples=args.samples, branch_turn=args.branch_turn,
                   concurrency=args.concurrency)
    results: dict = {"world": str(world), "policy": str(checkpoint), **options, "cpu_count": os.cpu_count()}
    with compilation_cache.enabled(workdir / "jax_cache"):
        runs = [(key, label, eval_setup.timed_sampled_evaluation(world, checkpoint, **options, **setting))
                for key, label, setting in SETTINGS]
    before = runs[0][2]
    print(f"{'setting':24s} {'episodes/s':>11s} {'seconds':>8s} {'speed-up':>9s} {'reward':>7s}  rewards")
    for key, label, run in runs:
        run["speedup"] = round(before["seconds"] / run["seconds"], 3)
        run["same_rewards"] = run["reward_per_task"] == before["reward_per_task"]
        results[key] = run
        print(f"{label:24s} {run['episodes_per_s']:11.3f} {run['seconds']:8.1f} {run['speedup']:8.2f}x "
              f"{run['reward_mean']:7.4f}  {'as before' if run['same_rewards'] else 'DIFFER'}")
    if args.json:
        fileio.write_atomic(args.json, json.dumps(results, indent=2).encode("utf-8"))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
