"""Groups that play their greedy turns once and fork (`RolloutConfig.share_trunk`) against samples that each play
every turn: one sampled evaluation each, side by side.

    python benchmarks/shared_trunk.py [--world DIR --policy CHECKPOINT] [--tasks 40] [--samples 4]
                                      [--branch-turn 2] [--concurrency 32] [--json OUT]

Runs `rollout.evaluate.evaluate_checkpoint` the way sim-tiny's GRPO actor samples (`--samples` episodes a task,
turn `--branch-turn` decision-sampled alone: temperature 1, draws where the top token is below 0.9, at most 2; the
other turns greedy) twice: with every sample playing the greedy turns before the branching turn itself, and with a
task's samples playing them once and forking the KV-cache row (`Sampler.fork_rows`). Prints episodes/s of both,
the speed-up, and whether the per-task rewards agree (they should: a forked row continues exactly). Without
`--policy` it builds a world and a random `Qwen3VLConfig.tiny()` checkpoint; the sim-tiny run's `sft_policy/` on
its GRPO world is the realistic case. Each evaluation is timed on its second run (the first, on 16 tasks, compiles
into a persistent compilation cache).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import eval_setup  # benchmarks/eval_setup.py, beside this script
from ranger_jax import compilation_cache, fileio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    eval_setup.add_arguments(parser)
    parser.add_argument("--samples", type=int, default=4, help="episodes a task (a GRPO group)")
    parser.add_argument("--branch-turn", type=int, default=2, help="the one sampled turn")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.samples < 2 or args.branch_turn < 1:
        parser.error(f"sharing needs --samples >= 2 and --branch-turn >= 1; got {args.samples}, {args.branch_turn}")

    workdir = Path(tempfile.mkdtemp(prefix="shared_trunk_"))
    world, checkpoint = eval_setup.world_and_policy(args, workdir)
    options = dict(limit=args.tasks, samples=args.samples, branch_turn=args.branch_turn,
                   concurrency=args.concurrency)
    with compilation_cache.enabled(workdir / "jax_cache"):
        alone = eval_setup.timed_sampled_evaluation(world, checkpoint, share_trunk=False, **options)
        shared = eval_setup.timed_sampled_evaluation(world, checkpoint, share_trunk=True, **options)
    same = alone["reward_per_task"] == shared["reward_per_task"]
    results = {"world": str(world), "policy": str(checkpoint), **options, "cpu_count": os.cpu_count(),
               "every_sample": alone, "shared_trunk": shared, "speedup": round(alone["seconds"] / shared["seconds"], 3),
               "same_rewards": same}
    print(f"{'greedy turns':22s} {'episodes/s':>11s} {'seconds':>8s} {'reward':>7s}")
    for name, r in (("played by every sample", alone), ("played once, forked", shared)):
        print(f"{name:22s} {r['episodes_per_s']:11.3f} {r['seconds']:8.1f} {r['reward_mean']:7.4f}")
    print(f"speed-up x{results['speedup']:.2f}; per-task rewards {'identical' if same else 'DIFFER'}")
    if args.json:
        fileio.write_atomic(args.json, json.dumps(results, indent=2).encode("utf-8"))


if __name__ == "__main__":
    main()
