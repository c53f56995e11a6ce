"""The world and policy of the evaluation benchmarks beside it (`shared_trunk.py`, `group_savings.py`,
`continuous_batching.py`, `active_rows.py`, `fit_images.py`), which import it as the sibling module `eval_setup` (a
script's own folder is first on `sys.path`): `--world` and `--policy` name an existing world and checkpoint; without
them a world of `--tasks` tasks is built from `--seed` and a random `Qwen3VLConfig.tiny()` checkpoint written, both
in a work folder. `timed_runs` times repeated evaluations, the first compiling from nothing, and `report` prints and
writes two settings' runs side by side."""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from pathlib import Path

import jax.monitoring

from ranger_jax import compilation_cache, fileio
from ranger_jax.env.sim import build
from ranger_jax.rollout import actor, evaluate, policy
from ranger_jax.sampling import Buckets

BUILT_TASKS = 24  # tasks of a built world
# how sim-tiny's GRPO actor samples its branching turn: draws where the top token is below 0.9, at most 2 a turn
DECISION_SAMPLING = policy.SamplingParams(temperature=1.0, draw_below=0.9, max_draws=2)


def actor_sampling(samples: int, branch_turn: int) -> dict:
    """`evaluate.evaluate_checkpoint` options that play as sim-tiny's GRPO actor: `samples` episodes a task, turn
    `branch_turn` decision-sampled alone, the other turns greedy."""
    return dict(sampling=DECISION_SAMPLING, samples_per_task=samples, branch_turns=(branch_turn,), sample_turns=1,
                seed=7)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds --world, --policy, --tasks and --seed."""
    parser.add_argument("--world", help="an existing world (default: build one of --tasks tasks)")
    parser.add_argument("--policy", help="a checkpoint folder (default: a random tiny one)")
    parser.add_argument("--tasks", type=int, default=None,
                        help=f"tasks to evaluate (default: every task of --world, or a built world of {BUILT_TASKS})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the built world")


def add_report_arguments(parser: argparse.ArgumentParser, *, concurrency_help: str) -> None:
    """Adds --concurrency (default 32), --sampled and --json: the options `report` reads."""
    parser.add_argument("--concurrency", type=int, default=32, help=concurrency_help)
    parser.add_argument("--sampled", action="store_true", help="score as the GRPO actor samples")
    parser.add_argument("--json", help="write the results here")


def world_and_policy(args: argparse.Namespace, workdir: Path) -> tuple[Path, Path]:
    """The world and checkpoint folders the arguments name, or ones built in `workdir`."""
    world = Path(args.world) if args.world else build.build_world(workdir / "world", args.tasks or BUILT_TASKS,
                                                                  args.seed)
    checkpoint = Path(args.policy) if args.policy else actor.write_tiny_checkpoint(
        workdir / "tiny", actor.default_tokenizer_dir())
    return world, checkpoint


COMPILE_EVENTS = ("/jax/core/compile/backend_compile_duration", "/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration")
_durations: collections.Counter = collections.Counter()
_programs: collections.Counter = collections.Counter()


def _listen(event: str, seconds: float, **_) -> None:
    if event in COMPILE_EVENTS:
        _durations[event] += seconds
    if event == COMPILE_EVENTS[0]:
        _programs["compiled"] += 1


jax.monitoring.register_event_duration_secs_listener(_listen)


def timed_runs(world: Path, checkpoint: Path, cache: Path, *, buckets: Buckets, limit: int | None,
               concurrency: int, sampled: bool, runs: int = 3, processes: int = 1, pin_cpus: bool = True) -> dict:
    """`runs` evaluations with `buckets` compiling into `cache` (a persistent compilation cache of their own): the
    first timed as cold, the best other as warm (which shapes a run meets depends on the timing of its episodes,
    so a warm run may still compile a few). Each run's seconds, compile seconds and programs compiled by XLA (None
    with `processes` > 1: the worker processes compile, out of this process's sight).
    `sampled` scores as sim-tiny's GRPO actor samples (4 episodes a task, turn 2 decision-sampled)."""
    options = dict(concurrency=concurrency, limit=limit, buckets=buckets, processes=processes, pin_cpus=pin_cpus)
    if sampled:
        options.update(actor_sampling(4, 2))
    timings = []
    with compilation_cache.enabled(cache):
        for _ in range(runs):
            _durations.clear()
            _programs.clear()
            started = time.perf_counter()
            result = evaluate.evaluate_checkpoint(world, checkpoint, **options)
            seen = processes == 1
            timings.append({"seconds": round(time.perf_counter() - started, 2),
                            "compile_s": round(sum(_durations.values()), 2) if seen else None,
                            "programs": _programs["compiled"] if seen else None})
    warm = min(timings[1:], key=lambda r: r["seconds"]) if runs > 1 else None
    return {"cold": timings[0], "warm": warm, "runs": timings, "reward_mean": result["reward_mean"],
            "reward_per_task": result["reward_per_task"]}


def timed_sampled_evaluation(world: Path, checkpoint: Path, *, limit: int | None, samples: int, branch_turn: int,
                             concurrency: int, **options) -> dict:
    """The evaluation played as sim-tiny's GRPO actor plays (`samples` episodes a task, turn `branch_turn`
    decision-sampled alone), twice: the second timed (the first, on the first 16 tasks, compiles). `options` go to
    `evaluate.evaluate_checkpoint` (e.g. `share_trunk`, `buckets`). Seconds, episodes/s and rewards."""
    options = dict(concurrency=concurrency, **actor_sampling(samples, branch_turn), **options)
    evaluate.evaluate_checkpoint(world, checkpoint, limit=min(16, limit or 16), **options)
    started = time.perf_counter()
    result = evaluate.evaluate_checkpoint(world, checkpoint, limit=limit, **options)
    seconds = time.perf_counter() - started
    episodes = result["num_tasks"] * samples
    return {"seconds": round(seconds, 2), "episodes_per_s": round(episodes / seconds, 3),
            "reward_mean": result["reward_mean"], "reward_per_task": result["reward_per_task"]}


def report(args: argparse.Namespace, world: Path, reference: tuple[str, str, dict], candidate: tuple[str, str, dict],
           **settings) -> dict:
    """Prints two settings' `timed_runs` side by side (cold and warm walls, compile seconds, programs, mean reward,
    the speed-ups of `candidate` over `reference`, whether the per-task rewards agree) and writes them to
    `args.json`. `reference` / `candidate` are (JSON key, printed label, runs); `settings` go into the JSON."""
    (ref_key, ref_label, ref), (new_key, new_label, new) = reference, candidate
    same = ref["reward_per_task"] == new["reward_per_task"]
    out = {"world": str(world) if args.world else None, "policy": args.policy, "concurrency": args.concurrency,
           "sampled": args.sampled, **settings, "cpu_count": os.cpu_count(),
           "num_tasks": len(new["reward_per_task"]), ref_key: ref, new_key: new,
           "speedup_warm": round(ref["warm"]["seconds"] / new["warm"]["seconds"], 3),
           "speedup_cold": round(ref["cold"]["seconds"] / new["cold"]["seconds"], 3), "same_rewards": same}
    print(f"{out['num_tasks']} tasks, {args.concurrency} rows{' sampled x4' if args.sampled else ''}")
    def compiled(run: dict) -> str:
        if run["compile_s"] is None:
            return "compiled in the workers"
        return f"compile {run['compile_s']:5.1f} s, {run['programs']} programs"

    for label, r in ((ref_label, ref), (new_label, new)):
        cold, warm = r["cold"], r["warm"]
        print(f"  {label:24s} cold {cold['seconds']:7.1f} s ({compiled(cold)})   warm {warm['seconds']:7.1f} s "
              f"({compiled(warm)})   reward {r['reward_mean']:.4f}")
    print(f"  speed-up: x{out['speedup_warm']:.2f} warm, x{out['speedup_cold']:.2f} cold; "
          f"per-task rewards {'identical' if same else 'DIFFER'}")
    if args.json:
        fileio.write_atomic(args.json, json.dumps(out, indent=2).encode("utf-8"))
    return out
