"""A sim-tiny run's GRPO rounds replayed through its learner: the recipe's few batch shapes against the fine ones.

    python benchmarks/learner_shapes.py --run DIR [--rounds 8] [--json OUT]

DIR is a finished `recipes/grpo_savanna.py --preset sim-tiny` folder (its tokenizer, SFT policy, teacher data and
recorded GRPO rounds). Each side runs in a fresh process, from the SFT policy, over the same rounds as the recipe's
learner does (records read, batches made with zero-advantage groups apart, one accumulated update that leaves them
out): "fine" with the SFT batches' shapes (length buckets from 640 tokens, pixels in steps of 256 patches and 8
images, every batch of the full 30 groups) and no memo of patched images, "recipe" with `sim_tiny.grpo_batch_spec`
(prefixes from 1,152 tokens, steps of 1,024 patches and 64 images, leftover groups in batches of 8 or 16) and the
memo. Every new shape compiles the step again, so the fine side compiles most rounds. Prints each side's wall and
CPU seconds, the distinct shapes, the ratio, and whether the two updates agree (loss and gradient norm to 1e-4:
padding changes only the rounding).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def replay(run: Path, rounds: int, fine: bool) -> dict:
    """The learner's work over the first `rounds` recorded rounds of `run`, in this process."""
    from ranger_jax.data import examples, filters, pipeline, shards
    from ranger_jax.models import qwen3_vl
    from ranger_jax.processing import tokenizer as tokenizer_lib
    from ranger_jax.rl import learner as learner_lib
    from ranger_jax.rl import sim_tiny, tiny_policy

    summary = json.loads((run / "summary.json").read_text())
    config = dataclasses.replace(sim_tiny.configure(seed=summary["seed"]), progress=False)
    tokenizer = tokenizer_lib.load_tokenizer(run / "tokenizer")
    learner = sim_tiny.grpo_learner(config, qwen3_vl.load(run / "sft_policy"))
    spec = sim_tiny.grpo_batch_spec(config, tokenizer)
    if fine:  # the SFT batches' length buckets and pixel steps, every batch of the full size
        sft = sim_tiny.batch_spec(tokenizer, spec.batch_size)
        spec = dataclasses.replace(spec, length_buckets=sft.length_buckets, patch_step=sft.patch_step,
                                   image_step=sft.image_step, prefix_row_buckets=())
        examples._PIXEL_MEMO = examples._PixelMemo(0)
    augment = sim_tiny.grpo_augmentation(tokenizer, run / "sft_data")
    shapes, steps = set(), []
    wall, cpu = time.perf_counter(), _cpu()
    for number in range(rounds):
        paths = sorted((run / "grpo_shards").glob(f"actor*-r{number:05d}-*.array_record"))
        if not paths:
            raise SystemExit(f"{run / 'grpo_shards'} has no shards of round {number}")
        source = shards.TrajectorySource(paths)
        _ = [source[i] for i in range(len(source))]  # the loop reads every record for its metrics
        batches = list(pipeline.trajectory_dataset(
            source, spec=spec, vision=tiny_policy.VISION, config=filters.FilterConfig(trim_untrained_tail=True),
            grpo_groups=True, num_epochs=1, augment=augment, seed=number, zero_advantage_apart=True))
        shapes.update(tuple((k, tuple(b[k].shape)) for k in ("input_ids", "prefix_input_ids", "pixel_values",
                                                             "image_grid_thw"))
                      for b in batches if not learner_lib.zero_advantage_batch(b))
        metrics = learner.accumulated_step(batches, skip_zero_advantage=True)
        steps.append({"loss": metrics["loss"], "grad_norm": metrics["grad_norm"]})
    return {"wall_s": time.perf_counter() - wall, "cpu_s": _cpu() - cpu, "shapes": len(shapes), "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a finished sim-tiny run folder")
    parser.add_argument("--rounds", type=int, default=8, help="recorded rounds to replay")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--side", choices=("fine", "recipe"), help=argparse.SUPPRESS)  # one side, in a child
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1; got {args.rounds}")
    for need in ("summary.json", "tokenizer", "sft_policy", "sft_data", "grpo_shards"):
        if not (args.run / need).exists():
            parser.error(f"--run {args.run} lacks {need}: pass a finished sim-tiny run folder")
    if args.side:
        print(json.dumps(replay(args.run, args.rounds, args.side == "fine")))
        return
    sides = {}
    for side in ("fine", "recipe"):
        done = subprocess.run([sys.executable, __file__, "--run", str(args.run), "--rounds", str(args.rounds),
                               "--side", side], capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"the {side} side failed:\n{done.stderr[-3000:]}")
        sides[side] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{side:>6}: {sides[side]['wall_s']:.1f} s wall, {sides[side]['cpu_s']:.1f} s CPU, "
              f"{sides[side]['shapes']} shapes of the batches run", flush=True)
    agree = all(abs(a[k] - b[k]) <= 1e-4 * max(1.0, abs(a[k]))
                for a, b in zip(sides["fine"]["steps"], sides["recipe"]["steps"]) for k in a)
    out = {"rounds": args.rounds, **{f"{side}_{k}": v[k] for side, v in sides.items()
                                     for k in ("wall_s", "cpu_s", "shapes")},
           "cpu_ratio": sides["fine"]["cpu_s"] / sides["recipe"]["cpu_s"],
           "wall_ratio": sides["fine"]["wall_s"] / sides["recipe"]["wall_s"], "updates_agree": agree}
    print(f"recipe shapes: x{out['wall_ratio']:.2f} wall, x{out['cpu_ratio']:.2f} CPU; updates agree: {agree}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
