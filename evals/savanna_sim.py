"""Savanna search eval in the offline world, scored exactly (no judge): a scripted agent or any checkpoint.

    python -m ranger_jax.env.sim.build --out /tmp/world --tasks 40 --seed 3
    python evals/savanna_sim.py --world /tmp/world --policy expert --json /tmp/expert.json
    python evals/savanna_sim.py --world /tmp/world --policy /ckpt/policy --json /tmp/policy.json

or, building the world first when the folder holds none, in the generation the checkpoint trained in (its
`ranger_env.json`; an existing world must be that one):

    python evals/savanna_sim.py --world /tmp/w7 --build-seed 7 --build-tasks 100 --policy /ckpt/policy --json OUT

`--policy` is `expert`, `naive`, `finder` or a checkpoint folder (HF-layout Qwen3-VL with tokenizer.json), run
greedily through the JAX sampler with the env settings it was trained with (its `ranger_env.json`) unless `--env`
names others. Writes the summary of `ranger_jax.rollout.evaluate.evaluate` (search_score overall, per domain and
per subcategory, crop IoU / text score / reward means, terminations, one row per episode, the mean reward per task)
and prints a table.

A checkpoint can also be scored the way GRPO samples it — what RL optimises, where the greedy score shows the
policy's mode — and compared task by task with another evaluation of the same world:

    python evals/savanna_sim.py --world W --policy /runs/a/sft_policy --json sft.json \
        --temperature 1 --samples 4 --branch-turns 2 --sample-turns 1 --seed 7
    python evals/savanna_sim.py --world W --policy /runs/a/policy --json grpo.json \
        --temperature 1 --samples 4 --branch-turns 2 --sample-turns 1 --seed 7 --baseline sft.json

`--baseline` prints (and stores under `comparison`) the paired difference of the per-task mean rewards with its
standard error; with one `--seed` the two runs draw their samples from the same seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

from ranger_jax import compilation_cache, fileio
from ranger_jax.env.sim import build, savanna, world as world_lib
from ranger_jax.rollout import eval_world, evaluate, policy as policy_lib, runner

SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "draw_below", "max_draws", "samples", "branch_turns",
                  "sample_turns", "seed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--world", required=True, help="world directory (ranger_jax.env.sim.build)")
    parser.add_argument("--policy", required=True,
                        help=f"one of {sorted(savanna.POLICIES)} or a checkpoint folder")
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--env", default=None,
                        help='"offline", a shipped environment such as savanna_sim, or a .toml environment file '
                             "(default: a checkpoint's ranger_env.json, else offline)")
    parser.add_argument("--build-seed", type=int, default=None,
                        help="build the world at --world from this seed first when it holds none, in the generation "
                             "the checkpoint trained in (else the builder's default); an existing world must have "
                             "that seed and size, and the generation when the checkpoint or --build-world-version "
                             "pins one")
    parser.add_argument("--build-tasks", type=int, default=100, help="tasks of a world --build-seed builds")
    parser.add_argument("--build-world-version", type=int, default=None,
                        help="generation of a world --build-seed builds (default: the checkpoint's, else the "
                             "builder's); a checkpoint's own generation cannot be overridden")
    parser.add_argument("--limit", type=int, default=None, help="run only the first N tasks")
    parser.add_argument("--concurrency", type=int, default=None, help="checkpoints: episodes in flight")
    parser.add_argument("--processes", type=int, default=None,
                        help="checkpoints: worker processes splitting the tasks (the same episodes; 2 keep 2 CPU "
                             "cores busy where one keeps ~1.5), --concurrency rows among them (default 1)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="checkpoints: tokens per turn")
    parser.add_argument("--max-context-tokens", type=int, default=None, help="checkpoints: tokens per episode")
    sampled = parser.add_argument_group("sampled evaluation (checkpoints; default greedy)")
    sampled.add_argument("--temperature", type=float, default=None, help="sample at this temperature (0 = greedy)")
    sampled.add_argument("--top-p", type=float, default=None, help="nucleus mass (default 1: off)")
    sampled.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens (default -1: all)")
    sampled.add_argument("--draw-below", type=float, default=None,
                         help="decision sampling: draw a token only where the most likely one's probability is below "
                              "this, the argmax elsewhere (default 1: draw everywhere)")
    sampled.add_argument("--max-draws", type=int, default=None,
                         help="decision sampling: draw at most this many tokens a turn (default 0: no limit)")
    sampled.add_argument("--samples", type=int, default=None, help="episodes per task (default 1)")
    sampled.add_argument("--branch-turns", default=None,
                         help="comma-separated turns a task's samples branch at; earlier turns are greedy and shared "
                              "(default 0: sample from the first turn)")
    sampled.add_argument("--sample-turns", type=int, default=None,
                         help="turns sampled from the branch on; later ones greedy (default: all)")
    sampled.add_argument("--seed", type=int, default=None, help="base seed of the episodes' samples (default 0)")
    parser.add_argument("--baseline", default=None,
                        help="an earlier --json of the same world: print the paired per-task reward difference")
    cache = parser.add_mutually_exclusive_group()
    cache.add_argument("--compilation-cache", default=None, metavar="DIR",
                       help="checkpoints: JAX's persistent compilation cache folder, where the sampler's programs "
                            "compiled by a run or an earlier evaluation load instead of compiling again (default: "
                            f"the shared folder, ${compilation_cache.DEFAULT_DIR_VAR} or ~/.cache/ranger_jax/jax)")
    cache.add_argument("--no-compilation-cache", action="store_true", help="checkpoints: compile without one")
    args = parser.parse_args()
    options = {key: value for key, value in (("concurrency", args.concurrency), ("processes", args.processes),
                                             ("max_new_tokens", args.max_new_tokens),
                                             ("max_context_tokens", args.max_context_tokens)) if value is not None}
    given = [f"--{flag.replace('_', '-')}" for flag in SAMPLING_FLAGS if getattr(args, flag) is not None]
    checkpoint_only = given + (["--processes"] if args.processes is not None else [])
    if checkpoint_only and args.policy in savanna.POLICIES:
        parser.error(f"{', '.join(checkpoint_only)} only apply to checkpoints; {args.policy!r} is a scripted agent")
    if given:
        options.update(_sampled_options(parser, args))
    baseline = _read_json(parser, args.baseline) if args.baseline else None
    if args.build_world_version is not None and args.build_seed is None:
        parser.error("--build-world-version only applies with --build-seed")
    if args.build_seed is not None:
        if not 1 <= args.build_tasks <= build.MAX_TASKS:
            parser.error(f"--build-tasks must be in 1..{build.MAX_TASKS}; got {args.build_tasks}")
        _build_world(parser, args)
    uses_cache = args.policy not in savanna.POLICIES and not args.no_compilation_cache
    folder = Path(args.compilation_cache or compilation_cache.default_dir()).expanduser()
    try:
        with compilation_cache.enabled(folder) if uses_cache else contextlib.nullcontext():
            result = evaluate.evaluate(args.world, args.policy, env_name=args.env, limit=args.limit, progress=True,
                                       **options)
        if baseline is not None:
            result["comparison"] = evaluate.compare(baseline, result)
    except (ValueError, FileNotFoundError) as err:
        parser.error(str(err))
    fileio.write_atomic(Path(args.json), json.dumps(result, indent=2, ensure_ascii=False).encode("utf-8"))
    print(f"policy {result['policy']}  world {result['world']} (seed {result['seed']})  tasks {result['num_tasks']}")
    print(f"{'search_score':<28}{result['search_score']:.3f}")
    for domain, value in result["search_score_by_domain"].items():
        print(f"  {domain:<26}{value:.3f}  (n={result['num_tasks_by_domain'][domain]})")
    for key in ("crop_iou_mean", "text_score_mean", "reward_mean", "tool_calls_mean"):
        print(f"{key:<28}{result[key]:.3f}")
    print(f"{'terminations':<28}{result['terminations']}")
    if "comparison" in result:
        c = result["comparison"]
        d = c["reward_difference"]
        print(f"reward - baseline ({c['baseline']}): {d['mean']:+.4f} (paired SE {d['se_paired']:.4f}, "
              f"{d['num_tasks']} tasks; better on {c['tasks_better']}, worse on {c['tasks_worse']})")
    if result.get("world_mismatch"):
        print(f"note: {result['world_mismatch']}")
    print(f"wrote {args.json}")


def _sampled_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    try:
        branch_turns = runner.parse_branch_turns(args.branch_turns or "0")
    except ValueError as err:
        parser.error(str(err))
    try:
        sampling = policy_lib.SamplingParams(temperature=0.0 if args.temperature is None else args.temperature,
                                             top_p=1.0 if args.top_p is None else args.top_p,
                                             top_k=-1 if args.top_k is None else args.top_k,
                                             draw_below=1.0 if args.draw_below is None else args.draw_below,
                                             max_draws=0 if args.max_draws is None else args.max_draws)
    except ValueError as err:
        parser.error(f"--temperature/--top-p/--top-k/--draw-below/--max-draws: {err}")
    return {"sampling": sampling, "samples_per_task": 1 if args.samples is None else args.samples,
            "branch_turns": branch_turns, "sample_turns": args.sample_turns,
            "seed": 0 if args.seed is None else args.seed}


def _build_world(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    try:
        world_dir, built = eval_world.ensure_world(args.world, seed=args.build_seed, num_tasks=args.build_tasks,
                                                   policy=args.policy, world_version=args.build_world_version,
                                                   progress=True)
    except ValueError as err:
        parser.error(f"--world/--build-seed: {err}")
    if built:
        print(f"built {world_dir}: seed {args.build_seed}, {args.build_tasks} tasks, world version "
              f"{world_lib.read_meta(world_dir).get('world_version', 1)}")


def _read_json(parser: argparse.ArgumentParser, path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        parser.error(f"--baseline {path}: {err}")


if __name__ == "__main__":
    from ranger_jax import host_memory

    host_memory.retain_freed_memory()  # before JAX runs anything: each sampler call reuses the last one's pages
    main()
