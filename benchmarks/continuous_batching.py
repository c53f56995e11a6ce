"""Continuous batching of the JAX policy backend against whole-turn batches: one evaluation each, side by side.

    python benchmarks/continuous_batching.py [--world DIR --policy CHECKPOINT] [--tasks 24] [--concurrency 8]
                                             [--chunk-tokens 32] [--json OUT]

Runs `rollout.evaluate.evaluate_checkpoint` (greedy, every task of the world) twice with the same sampler settings:
whole turns per sampler call (`chunk_tokens=None`: a batch decodes until its longest turn stops) and
`--chunk-tokens` tokens a row per call (finished turns leave, waiting turns join between calls). Prints episodes/s
of both, the speed-up, and whether the per-task rewards agree (they should: continuing a row is exact). Without
`--policy` it builds a world and a random `Qwen3VLConfig.tiny()` checkpoint (whose turns run long and ragged, the
case continuous batching is for); the sim-tiny run's `sft_policy/` on its held-out world is the realistic case.
Each evaluation is timed on its second run (the first compiles into a persistent compilation cache).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import eval_setup  # benchmarks/eval_setup.py, beside this script
from ranger_jax import compilation_cache, fileio
from ranger_jax.rollout import evaluate


def timed_evaluation(world: Path, checkpoint: Path, *, concurrency: int, chunk_tokens: int | None,
                     limit: int | None) -> dict:
    """The evaluation twice: the first fills the persistent compilation cache with every program it needs (each
    evaluation builds its own sampler, which would otherwise compile again), the second is timed."""
    evaluate.evaluate_checkpoint(world, checkpoint, concurrency=concurrency, chunk_tokens=chunk_tokens, limit=limit)
    started = time.perf_counter()
    result = evaluate.evaluate_checkpoint(world, checkpoint, concurrency=concurrency, chunk_tokens=chunk_tokens,
                                          limit=limit)
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 2), "episodes_per_s": round(result["num_tasks"] / seconds, 3),
            "reward_mean": result["reward_mean"], "reward_per_task": result["reward_per_task"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    eval_setup.add_arguments(parser)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--chunk-tokens", type=int, default=32)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.chunk_tokens < 1:
        parser.error(f"--chunk-tokens must be >= 1; got {args.chunk_tokens}")

    workdir = Path(tempfile.mkdtemp(prefix="continuous_batching_"))
    world, checkpoint = eval_setup.world_and_policy(args, workdir)
    limit = args.tasks
    with compilation_cache.enabled(workdir / "jax_cache"):
        whole = timed_evaluation(world, checkpoint, concurrency=args.concurrency, chunk_tokens=None, limit=limit)
        chunked = timed_evaluation(world, checkpoint, concurrency=args.concurrency, chunk_tokens=args.chunk_tokens,
                                   limit=limit)
    same = whole["reward_per_task"] == chunked["reward_per_task"]
    results = {"world": str(world), "policy": str(checkpoint), "concurrency": args.concurrency,
               "chunk_tokens": args.chunk_tokens, "cpu_count": os.cpu_count(), "whole_turns": whole,
               "chunks": chunked, "speedup": round(whole["seconds"] / chunked["seconds"], 3),
               "same_rewards": same}
    print(f"{'batching':14s} {'episodes/s':>11s} {'seconds':>8s} {'reward':>7s}")
    for name, r in (("whole turns", whole), (f"chunks of {args.chunk_tokens}", chunked)):
        print(f"{name:14s} {r['episodes_per_s']:11.3f} {r['seconds']:8.1f} {r['reward_mean']:7.4f}")
    print(f"speed-up x{results['speedup']:.2f}; per-task rewards {'identical' if same else 'DIFFER'}")
    if args.json:
        fileio.write_atomic(args.json, json.dumps(results, indent=2).encode("utf-8"))


if __name__ == "__main__":
    main()
