"""GRPO learner step on the same groups as plain rows and as a shared-prefix batch, side by side; ratio printed.

The groups look like sim-tiny's GRPO rounds with the decision turn sampled alone (`SimTinyConfig.sample_turns`):
every member of a group repeats a context of `--context` tokens with `--images` images (played once, greedily) and
then samples a turn of ~`--sampled` tokens. Plain rows (`batching.collate`) run the decoder over each member's
whole row; the shared-prefix batch (`data.shared_prefix.collate_shared`) runs each context once and the sampled
turns on from its KV cache. The model is the tiny policy's shape (`rl.tiny_policy.TinyPolicySize`) with random
weights. Before timing, the two gradients are compared (they must agree to float32 rounding).

    python benchmarks/shared_prefix_learner.py [--groups 4] [--members 8] [--context 760] [--repeats 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
import types

import numpy as np

from ranger_jax.data import batching, shared_prefix
from ranger_jax.models import qwen3_vl
from ranger_jax.rl import learner as learner_lib
from ranger_jax.rl import learner_config, tiny_policy

IDS = types.SimpleNamespace(vocab_size=2048, eos_id=2, pad_id=0, image_pad_id=5, video_pad_id=6, vision_start_id=3,
                            vision_end_id=4)
GRID = (1, 8, 8)  # 64 patches, 16 placeholder tokens: a 128 x 128 sim-tiny image


def groups(rng: np.random.Generator, args: argparse.Namespace) -> list[list[dict]]:
    """`args.groups` groups of `args.members` rows: shared context with images, then a sampled turn each."""
    features = 3 * 2 * 16 * 16
    out = []
    for _ in range(args.groups):
        text = args.context - args.images * (GRID[0] * GRID[1] * GRID[2] // 4 + 2)
        context = list(rng.integers(10, IDS.vocab_size, text))
        for i in range(args.images):
            at = (i + 1) * len(context) // (args.images + 1)
            context[at:at] = [IDS.vision_start_id] + [IDS.image_pad_id] * (np.prod(GRID) // 4) + [IDS.vision_end_id]
        pixels = rng.standard_normal((args.images * int(np.prod(GRID)), features)).astype(np.float32)
        rows = []
        for _ in range(args.members):
            sampled = rng.integers(10, IDS.vocab_size, int(rng.integers(args.sampled // 2, args.sampled * 3 // 2)))
            ids = np.array(context + sampled.tolist(), np.int32)
            loss = np.zeros(len(ids), np.float32)
            loss[len(context):] = 1
            rows.append({"input_ids": ids, "attention_mask": np.ones(len(ids), np.int32), "loss_mask": loss,
                         "sampler_logp": -loss * rng.random(len(ids)).astype(np.float32),
                         "pixel_values": pixels, "image_grid_thw": np.array([GRID] * args.images, np.int32),
                         "policy_version": np.int32(0), "advantage": np.float32(rng.normal())})
        out.append(rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--context", type=int, default=760, help="shared tokens per group (images included)")
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--sampled", type=int, default=32, help="mean sampled tokens per member")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    units = groups(np.random.default_rng(0), args)
    spec = batching.BatchSpec(batch_size=args.groups * args.members, length_buckets=(256, 512, 640, 896, 1152, 2048),
                              pad_id=IDS.pad_id, image_pad_id=IDS.image_pad_id, patch_step=1024, image_step=8)
    plain = batching.collate([r for u in units for r in u], spec)
    shared = shared_prefix.collate_shared(units, dataclasses.replace(spec, prefix_rows=args.groups))
    config = learner_config.LearnerConfig(objective="grpo", learning_rate=1e-4, schedule="constant",
                                          old_logp="learner", agg="seq-mean-token-mean", tis_cap=2.0)
    model_config = tiny_policy.model_config(IDS)
    learners = {name: learner_lib.Learner(qwen3_vl.init(model_config, seed=0), config) for name in ("plain", "shared")}
    batches = {"plain": plain, "shared": shared}
    a, b = learners["plain"].gradient(plain), learners["shared"].gradient(shared)
    print(f"gradient: max |shared - plain| / max |plain| = {np.abs(a - b).max() / np.abs(a).max():.2e}")
    tokens = {"plain": plain["input_ids"].size,
              "shared": shared["prefix_input_ids"].size + shared["input_ids"].size}
    first = {}
    for name in batches:  # compile
        start = time.perf_counter()
        learners[name].step(batches[name])
        first[name] = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in batches}
    for _ in range(args.repeats):  # interleaved, so drifting machine load hits both alike
        for name in batches:
            start = time.perf_counter()
            learners[name].step(batches[name])
            times[name].append(time.perf_counter() - start)
    for name in batches:
        print(f"{name:>6}: {tokens[name]:6d} padded tokens per step, first step {first[name]:.1f} s, median step "
              f"{statistics.median(times[name]):.3f} s")
    ratio = statistics.median(times["plain"]) / statistics.median(times["shared"])
    print(f"shared-prefix step is {ratio:.2f}x faster ({args.groups} groups x {args.members} members, context "
          f"{args.context} tokens)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shared_prefix_speedup": ratio, "gradient_max_relative_difference": float(
                np.abs(a - b).max() / np.abs(a).max()), "padded_tokens": tokens,
                "median_step_s": {k: statistics.median(v) for k, v in times.items()}, "args": vars(args)}, f, indent=2)


if __name__ == "__main__":
    main()
