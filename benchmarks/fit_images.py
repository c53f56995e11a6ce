"""Append programs independent of the images (`Buckets.fit_images_up_to`) against one program per image bucket: a
held-out evaluation compiled from nothing, side by side.

    python benchmarks/fit_images.py [--world DIR --policy CHECKPOINT] [--tasks N] [--concurrency 32] [--sampled]
                                    [--json OUT]

An append call's program used to be keyed on its rows, tokens and cache slots and also on its images' feature rows
and image count (each rounded to a power of two), so a run met several times more append programs than
(rows, tokens, slots) shapes and compiled each. With `fit_images` the image features and grids are fitted to the
call's rows x tokens before the append (exact: the placeholders read them in order), so only the vision tower's
small programs depend on the images (for calls of up to `fit_images_up_to` rows x tokens, 16384 by default:
every call of sim-tiny's 32-row evaluation). Runs `rollout.evaluate.evaluate_checkpoint` twice per setting, each setting
with a persistent compilation cache of its own (a short evaluation first absorbs the process's one-time costs): the
first run is cold (compiles everything), the second warm. Prints walls, compile seconds, programs compiled and
whether the per-task rewards agree (they must). Without `--policy` it builds a world and a random
`Qwen3VLConfig.tiny()` checkpoint; the sim-tiny run's `sft_policy/` on its held-out world is the realistic case.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import eval_setup  # benchmarks/eval_setup.py, beside this script
from ranger_jax import fileio
from ranger_jax.sampling import Buckets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    eval_setup.add_arguments(parser)
    parser.add_argument("--concurrency", type=int, default=32, help="episodes in flight (the batch)")
    parser.add_argument("--sampled", action="store_true", help="score as the GRPO actor samples")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.concurrency < 1:
        parser.error(f"--concurrency must be >= 1; got {args.concurrency}")
    options = dict(limit=args.tasks, concurrency=args.concurrency, sampled=args.sampled, runs=2)
    with tempfile.TemporaryDirectory(prefix="fit_images_") as tmp:
        tmp = Path(tmp)
        world, checkpoint = eval_setup.world_and_policy(args, tmp)
        eval_setup.timed_runs(world, checkpoint, tmp / "cache-first", buckets=Buckets(), limit=2,
                              concurrency=args.concurrency, sampled=args.sampled, runs=1)
        per_bucket = eval_setup.timed_runs(world, checkpoint, tmp / "cache-off", buckets=Buckets(fit_images_up_to=0),
                                           **options)
        fitted = eval_setup.timed_runs(world, checkpoint, tmp / "cache-on", buckets=Buckets(), **options)
    same = per_bucket["reward_per_task"] == fitted["reward_per_task"]
    out = {"world": str(world) if args.world else None, "policy": args.policy, "concurrency": args.concurrency,
           "sampled": args.sampled, "cpu_count": os.cpu_count(), "num_tasks": len(fitted["reward_per_task"]),
           "per_image_bucket": per_bucket, "fitted": fitted,
           "speedup_cold": round(per_bucket["cold"]["seconds"] / fitted["cold"]["seconds"], 3),
           "speedup_warm": round(per_bucket["warm"]["seconds"] / fitted["warm"]["seconds"], 3), "same_rewards": same}
    print(f"{out['num_tasks']} tasks, {args.concurrency} rows{' sampled x4' if args.sampled else ''}")
    for name, r in (("append per image bucket", per_bucket), ("append fitted (default)", fitted)):
        print(f"  {name:24s} cold {r['cold']['seconds']:7.1f} s (compile {r['cold']['compile_s']:5.1f} s, "
              f"{r['cold']['programs']} programs)   warm {r['warm']['seconds']:7.1f} s   reward {r['reward_mean']:.4f}")
    print(f"  speed-up: x{out['speedup_cold']:.2f} cold, x{out['speedup_warm']:.2f} warm; "
          f"per-task rewards {'identical' if same else 'DIFFER'}")
    if args.json:
        fileio.write_atomic(args.json, json.dumps(out, indent=2).encode("utf-8"))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
