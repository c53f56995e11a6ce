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
import os
import tempfile
from pathlib import Path

import eval_setup  # benchmarks/eval_setup.py, beside this script
from ranger_jax.sampling import Buckets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    eval_setup.add_arguments(parser)
    eval_setup.add_report_arguments(parser, concurrency_help="episodes in flight (the batch)")
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
    eval_setup.report(args, world, ("per_image_bucket", "append per image bucket", per_bucket),
                      ("fitted", "append fitted (default)", fitted))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
