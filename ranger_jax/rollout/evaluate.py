"""Savanna-style evaluation of any policy in the offline world: a scripted agent, your agent, or a checkpoint.

    evaluate(world_dir, "expert")                     # built-in scripted agents: expert, naive, finder
    evaluate(world_dir, my_agent)                     # a callable act(state) -> str, or an object with act
    evaluate(world_dir, "/ckpt/policy")               # an HF-layout Qwen3-VL folder with tokenizer.json

A checkpoint runs through the JAX sampler (`sampling.Sampler` behind `rollout.SamplerPolicy`), greedy
(temperature 0) by default, every task through `rollout.runner` with `concurrency` episodes in flight, and is scored
with the env's reward (`ToolEnv.ascore`, the number RL trains on). A sampled evaluation (`sampling` with a
temperature, `samples_per_task` episodes a task, optionally only some turns sampled as GRPO's rollouts sample them:
`branch_turns`, `sample_turns`) scores the distribution RL optimises rather than its mode; its episodes' seeds come
from `seed` exactly as a rollout actor's do, so two checkpoints evaluated with one seed are compared pairwise
(`paired_difference`, `compare`). When the folder carries the settings it was trained
with (`rollout.trained_env`, `ranger_env.json`), the eval uses them: its tools, prompt style, limits and
reward settings, image pixel bounds and token budgets; an `env_name` (e.g. `"savanna_sim"`) replaces
the recorded env and reward settings, and keyword options override either. Scripted and callable agents run
through `env.sim.savanna.evaluate`. Every kind reports the same summary (`savanna.report`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tqdm

from ranger_jax import cpu_affinity
from ranger_jax import env as env_lib
from ranger_jax.data import shards
from ranger_jax.env import core, tool_env
from ranger_jax.env.sim import savanna, world as world_lib
from ranger_jax.processing import chat as chat_lib
from ranger_jax.processing import tokenizer as tokenizer_lib
from ranger_jax.rollout import episode as episode_lib
from ranger_jax.rollout import policy as policy_lib
from ranger_jax.rollout import runner, sampler_policy, trained_env

GREEDY = episode_lib.GREEDY  # temperature 0, top-p 1, top-k off
DEFAULT_CONCURRENCY = 8

logger = logging.getLogger(__name__)


def is_checkpoint(path: str | os.PathLike) -> bool:
    """Whether `path` is a folder with an HF `config.json` (a model checkpoint)."""
    return (Path(path) / "config.json").is_file()


class _RowScorer:
    """The env's own score of each episode, keeping the report rows of every finished state, by task."""

    def __init__(self):
        self.rows: dict[str, list[savanna.Episode]] = {}

    async def ascore(self, env: tool_env.ToolEnv, state: tool_env.EnvState) -> core.Score:
        score = await env.ascore(state)
        self.rows.setdefault(state.task.id, []).append(savanna.episode_row(env, state, score))
        return score

    def passed(self) -> float:
        """The search score of the episodes finished so far."""
        episodes = [e for rows in self.rows.values() for e in rows]
        return sum(e.judgement.search_pass for e in episodes) / max(len(episodes), 1)


async def _arun(tool_env: tool_env.ToolEnv, policy: policy_lib.Policy, tasks: list[core.Task], *,
                renderer: chat_lib.ChatRenderer, config: runner.RolloutConfig, scorer: _RowScorer,
                progress: bool, writer: shards.ShardWriter | None = None) -> None:
    bar = tqdm.tqdm(total=len(tasks), desc=f"savanna-sim {policy.name}", unit="task", disable=not progress)
    with bar:
        async for group in runner.agroups(tool_env, policy, tasks, renderer=renderer, config=config, scorer=scorer):
            if writer is not None:
                for trajectory in group.trajectories:
                    writer.write(trajectory)
            bar.update(1)
            bar.set_postfix(search=f"{scorer.passed():.3f}")


def check_sampled(sampling: policy_lib.SamplingParams, samples_per_task: Any, branch_turns: Any,
                  sample_turns: Any) -> None:
    """Raises ValueError for settings a sampled evaluation cannot honour (each named with its value)."""
    if not isinstance(sampling, policy_lib.SamplingParams):
        raise ValueError(f"sampling must be a rollout.policy.SamplingParams; got {sampling!r}")
    if isinstance(samples_per_task, bool) or not isinstance(samples_per_task, int) or samples_per_task < 1:
        raise ValueError(f"samples_per_task must be an int >= 1; got {samples_per_task!r}")
    if sampling.greedy and samples_per_task > 1:
        raise ValueError(f"samples_per_task={samples_per_task} with greedy sampling (temperature 0) plays one "
                         "episode that many times; give a temperature > 0")
    branch_turns = runner.checked_branch_turns(branch_turns, "evaluate")
    runner.check_sample_turns(sample_turns, "evaluate")
    if sampling.greedy and (branch_turns != (0,) or sample_turns is not None):
        raise ValueError(f"branch_turns={branch_turns} / sample_turns={sample_turns} choose which turns are "
                         "sampled; with temperature 0 every turn is greedy")


def task_rewards(result: Mapping[str, Any]) -> dict[str, float]:
    """Mean reward per task id of an evaluation result (over its samples), in the result's task order.

    Raises:
        ValueError: the result has no episode rows.
    """
    rows = result.get("episodes")
    if not rows:
        raise ValueError(f"evaluation result of {result.get('policy')!r} has no episode rows")
    by_task: dict[str, list[float]] = {}
    for row in rows:
        by_task.setdefault(row["task_id"], []).append(float(row["reward"]))
    return {task: statistics.fmean(values) for task, values in by_task.items()}


def paired_difference(before: Sequence[float], after: Sequence[float]) -> dict[str, float]:
    """Mean of `after - before` over the same tasks, with its standard error (paired, sample std) and the unpaired
    standard error of the two means: one policy beats the other when the difference exceeds two standard errors.

    Raises:
        ValueError: lists of different lengths, or fewer than two tasks.
    """
    if len(before) != len(after) or len(before) < 2:
        raise ValueError(f"paired_difference needs two equal-length lists of >= 2 rewards; got {len(before)} and "
                         f"{len(after)}")
    a, b = np.asarray(before, np.float64), np.asarray(after, np.float64)
    n = a.size
    return {"mean": float((b - a).mean()), "se_paired": float((b - a).std(ddof=1) / np.sqrt(n)),
            "se_unpaired": float(np.sqrt(a.var(ddof=1) / n + b.var(ddof=1) / n)), "num_tasks": n}


def compare(baseline: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    """`result` against `baseline` task by task: `paired_difference` of their per-task mean rewards, the tasks each
    one wins, and both evaluations' sampling (compare like with like: the same world, tasks and settings).

    Raises:
        ValueError: the two were run on different worlds or different tasks.
    """
    if baseline.get("world") != result.get("world") or baseline.get("seed") != result.get("seed"):
        raise ValueError(f"cannot compare evaluations of different worlds: {baseline.get('world')} (seed "
                         f"{baseline.get('seed')}) and {result.get('world')} (seed {result.get('seed')})")
    before, after = task_rewards(baseline), task_rewards(result)
    if list(before) != list(after):
        missing = sorted(set(before) ^ set(after))
        raise ValueError(f"cannot compare evaluations of different tasks ({len(before)} and {len(after)}; "
                         f"not in both: {missing[:5]})" if missing else
                         "cannot compare evaluations whose tasks are in a different order")
    diff = paired_difference(list(before.values()), list(after.values()))
    wins = sum(after[t] > before[t] for t in before)
    losses = sum(after[t] < before[t] for t in before)
    return {"baseline": baseline.get("policy"), "policy": result.get("policy"), "reward_difference": diff,
            "tasks_better": wins, "tasks_worse": losses, "tasks_equal": len(before) - wins - losses,
            "sampling": {"baseline": baseline.get("sampling"), "policy": result.get("sampling")}}


def evaluate_checkpoint(world_dir: str | os.PathLike, checkpoint: str | os.PathLike, *, env_name: str | None = None,
                        limit: int | None = None, concurrency: int = DEFAULT_CONCURRENCY, processes: int = 1,
                        pin_cpus: bool = True, max_new_tokens: int | None = None, max_context_tokens: int | None = None,
                        blank_observations: bool = False, trajectories_out: str | os.PathLike | None = None,
                        sampling: policy_lib.SamplingParams = GREEDY, samples_per_task: int = 1,
                        branch_turns: tuple[int, ...] = (0,), sample_turns: int | None = None, seed: int = 0,
                        chunk_tokens: int | None = sampler_policy.DEFAULT_CHUNK_TOKENS, share_trunk: bool = True,
                        prefill_trunk: bool = True, share_continuations: bool = False, buckets: Any = None,
                        progress: bool = False, **env_options: Any) -> dict[str, Any]:
    """Runs a checkpoint on the world's tasks, greedily unless `sampling` says otherwise (module docstring);
    returns the summary and one row per episode.

    Args:
        world_dir: a world built by `ranger_jax.env.sim.build`.
        checkpoint: an HF-layout Qwen3-VL folder (`config.json`, safetensors, `tokenizer.json`), optionally with
            `ranger_env.json`.
        env_name: an environment file or backend name replacing the checkpoint's env and reward settings.
        limit: run only the first `limit` tasks.
        concurrency: episodes in flight (rows of the sampler's KV cache), over all `processes`.
        processes: worker processes splitting the tasks between them (`runner.RolloutConfig.part`: each plays the
            tasks whose index is its own modulo `processes`, seeded as in one process), each with `concurrency //
            processes` rows (at least one). Like `chunk_tokens`, it changes the time, not the episodes: a process
            keeps ~1.5 of 2 CPU cores busy, two keep both. The workers compile into this process's persistent
            compilation cache, if it has one. 1: the episodes run in this process.
        pin_cpus: with `processes` > 1, each worker runs on its own share of this process's cores
            (`cpu_affinity.split_cpus`), so their JAX thread pools do not preempt one another (measured on 2 cores:
            26-30 s against 31-36 s for a sampled evaluation, the same rewards).
        max_new_tokens / max_context_tokens: token budgets per turn / per episode (default: the checkpoint's
            recorded ones, else the rollout defaults).
        blank_observations: the policy sees every observation blank (evaluating a blind control policy as it
            was trained; `episode.EpisodeConfig.blank_observations`).
        trajectories_out: also write every episode as a trajectory shard here (e.g. for `data.viewer`).
        sampling: how the sampled turns are drawn (default greedy: the policy's mode).
        samples_per_task: episodes a task (> 1 needs a temperature > 0). The summary's means are over every
            episode (a task's rows follow one another, in a fixed order); `reward_per_task` holds each task's mean
            reward in task order.
        branch_turns / sample_turns: which turns are sampled (`runner.RolloutConfig`: the turns before a group's
            branching turn, and those after its `sample_turns` sampled ones, are greedy), e.g. `(2,)` and 1 to
            score a policy the way GRPO rollouts that sample turn 2 alone play it.
        seed: base seed of the episodes' sampling seeds (`runner.episode_seed(seed, task index, sample)`, as an
            actor run with that seed and no rounds).
        chunk_tokens: tokens a row decodes per sampler call (`SamplerPolicy`'s continuous batching; None: whole
            turns per call). The results do not depend on it, only the time.
        share_trunk: a task's samples play their greedy turns before the branching turn once and fork from there
            (`runner.RolloutConfig.share_trunk`); like `chunk_tokens`, it changes the time, not the episodes, and
            so does `prefill_trunk` (the branching turn's prompt computed once a task, `RolloutConfig.prefill_trunk`).
        share_continuations: a sample repeating an earlier sample's sampled turns takes over its greedy continuation
            (`runner.RolloutConfig.share_continuations`; needs `sample_turns`): the same episodes on the offline world.
        buckets: the sampler's shape buckets (`sampling.Buckets`; None: its defaults), e.g. `min_active_rows` equal
            to `concurrency` to run every call on the whole batch. Like `chunk_tokens`, they change the time.
        progress: show a tqdm bar with the running search score (over the parts finished with `processes` > 1).
        **env_options: passed to `env.make`, over everything else.

    Raises:
        FileNotFoundError: the folder has no `config.json` or no `tokenizer.json`.
        ValueError: a bad `ranger_env.json` or option, or a `limit` below 1, or sampling settings that do not fit
            together (`check_sampled`), or `processes` below 1.
    """
    savanna.check_limit(limit)
    check_sampled(sampling, samples_per_task, branch_turns, sample_turns)
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be an int >= 1; got {processes!r}")
    if not is_checkpoint(checkpoint):
        raise FileNotFoundError(f"{checkpoint} is not a checkpoint folder (no config.json)")
    trained = trained_env.read(checkpoint) or trained_env.TrainedEnv()
    the_world = world_lib.load_world(world_dir)
    mismatch = trained.world_mismatch(the_world.version)
    if mismatch is not None:
        logger.warning("%s: %s", world_dir, mismatch)
    tasks = world_lib.load_tasks(world_dir)[:limit]
    play = _PlaySettings(
        tasks=tasks, trained=trained, env_name=env_name, rows=max(1, concurrency // processes),
        max_new_tokens=max_new_tokens, max_context_tokens=max_context_tokens,
        blank_observations=blank_observations, sampling=sampling,
        samples_per_task=samples_per_task, branch_turns=tuple(branch_turns), sample_turns=sample_turns, seed=seed,
        chunk_tokens=chunk_tokens, share_trunk=share_trunk, prefill_trunk=prefill_trunk,
        share_continuations=share_continuations, buckets=buckets, env_options=dict(env_options))
    if processes == 1:
        rows, settings = _play(str(world_dir), str(checkpoint), play, (0, 1),
                               None if trajectories_out is None else str(trajectories_out), progress)
    else:
        rows, settings = _play_in_processes(str(world_dir), str(checkpoint), play, processes, trajectories_out,
                                            progress, pin_cpus=pin_cpus)
    # a task's samples in a fixed order (not the order they finished in, which depends on `concurrency`)
    episodes = [e for task in tasks for e in sorted(rows[task.id], key=lambda e: json.dumps(e.row()))]
    result = savanna.report(str(checkpoint), world_dir, the_world, episodes)
    result["num_tasks"] = len(tasks)
    result["num_tasks_by_domain"] = {d: n // samples_per_task for d, n in result["num_tasks_by_domain"].items()}
    result["reward_per_task"] = [round(r, 4) for r in task_rewards(result).values()]
    result["world_version"] = the_world.version
    result["world_mismatch"] = trained.world_mismatch(the_world.version)
    return {**result, "settings": settings,
            "sampling": {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                         "draw_below": sampling.draw_below, "max_draws": sampling.max_draws,
                         "samples_per_task": samples_per_task, "branch_turns": list(play.branch_turns),
                         "sample_turns": sample_turns, "seed": seed, "concurrency": concurrency}}


@dataclasses.dataclass(frozen=True)
class _PlaySettings:
    """What one process of `evaluate_checkpoint` needs besides the world, the checkpoint and its part: the tasks
    (all of them: a part's group indices are those of the whole list) and the checkpoint's recorded settings, read
    once by the caller."""

    tasks: list[core.Task]
    trained: trained_env.TrainedEnv
    env_name: str | None
    rows: int
    max_new_tokens: int | None
    max_context_tokens: int | None
    blank_observations: bool
    sampling: policy_lib.SamplingParams
    samples_per_task: int
    branch_turns: tuple[int, ...]
    sample_turns: int | None
    seed: int
    chunk_tokens: int | None
    share_trunk: bool
    prefill_trunk: bool
    share_continuations: bool
    buckets: Any
    env_options: dict[str, Any]


def _play(world_dir: str, checkpoint: str, play: _PlaySettings, part: tuple[int, int],
          trajectories_out: str | None, progress: bool) -> tuple[dict[str, list[savanna.Episode]], dict[str, Any]]:
    """Plays `part` of the world's tasks with the checkpoint in this process; returns the report rows by task and
    the settings the episodes ran with."""
    from ranger_jax import sampling as sampling_lib  # jax and the model load only when a checkpoint is evaluated
    from ranger_jax.models import qwen3_vl

    trained, tasks = play.trained, play.tasks
    tokenizer = tokenizer_lib.load_tokenizer(checkpoint)
    model = qwen3_vl.load(checkpoint, sharding_rules="sample")
    vision_config = model.config.vision_config
    vision = trained.vision(patch_size=vision_config.patch_size, merge_size=vision_config.spatial_merge_size,
                            temporal_patch_size=vision_config.temporal_patch_size)
    budgets = {"max_new_tokens": episode_lib.GEN_SEARCHER_MAX_NEW_TOKENS,
               "max_context_tokens": episode_lib.GEN_SEARCHER_MAX_CONTEXT, **trained.episode}
    budgets.update({k: v for k, v in (("max_new_tokens", play.max_new_tokens),
                                      ("max_context_tokens", play.max_context_tokens)) if v is not None})
    config = runner.RolloutConfig(group_size=play.samples_per_task, concurrency=play.rows, seed=play.seed,
                                  run_id="eval", branch_turns=play.branch_turns, sample_turns=play.sample_turns,
                                  share_trunk=play.share_trunk, prefill_trunk=play.prefill_trunk,
                                  share_continuations=play.share_continuations, part=part,
                                  episode=episode_lib.EpisodeConfig(sampling=play.sampling, vision=vision,
                                                                    blank_observations=play.blank_observations,
                                                                    **budgets))
    sampler = sampling_lib.Sampler(model, suppress_token_ids=sorted(tokenizer.vision_ids), buckets=play.buckets)
    policy = sampler_policy.SamplerPolicy(sampler, num_rows=play.rows, name=f"jax:{Path(checkpoint).name}",
                                          chunk_tokens=play.chunk_tokens)
    renderer = chat_lib.ChatRenderer(tokenizer, merge_size=vision.merge_size)
    options = (play.env_options if play.env_name is not None
               else {**trained.env, **trained.rewards, **play.env_options})
    scorer = _RowScorer()
    with env_lib.make(play.env_name or "offline", world=world_dir, **options) as tool_env:
        writer = shards.ShardWriter(trajectories_out, overwrite=True) if trajectories_out is not None else None
        try:
            asyncio.run(_arun(tool_env, policy, tasks, renderer=renderer, config=config, scorer=scorer,
                              progress=progress, writer=writer))
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        if writer is not None:
            writer.close()
        settings = {"env": {"tools": list(tool_env.config.tools), "prompt_style": tool_env.config.prompt_style,
                            "max_turns": tool_env.config.max_turns,
                            "max_answer_refs": tool_env.config.max_answer_refs},
                    "rewards": dict(tool_env.rewards),
                    "image": {"min_pixels": vision.min_pixels, "max_pixels": vision.max_pixels}, "episode": budgets}
    return scorer.rows, settings


def _play_part(world_dir: str, checkpoint: str, play: _PlaySettings, part: tuple[int, int],
               trajectories_out: str | None, cache: tuple[str | None, float, str | None],
               cpus: list[int] | None = None) -> tuple[dict[str, list[savanna.Episode]], dict[str, Any]]:
    """`_play` in a worker process, compiling into the parent's persistent compilation cache (`cache`:
    `compilation_cache.settings()` there), on `cpus` alone when given (pinned before JAX starts)."""
    if cpus is not None:
        cpu_affinity.pin(cpus)
    from ranger_jax import compilation_cache

    compilation_cache.join(cache)
    return _play(world_dir, checkpoint, play, part, trajectories_out, False)


def _play_in_processes(world_dir: str, checkpoint: str, play: _PlaySettings, processes: int,
                       trajectories_out: str | os.PathLike | None, progress: bool, *, pin_cpus: bool = True
                       ) -> tuple[dict[str, list[savanna.Episode]], dict[str, Any]]:
    """`_play` of each part in its own spawned process (each on its share of the cores with `pin_cpus`, where the
    platform can pin); the report rows of all, their trajectories in one shard."""
    from ranger_jax import compilation_cache, process_pool

    cache = compilation_cache.settings()
    final = Path(trajectories_out) if trajectories_out is not None else None
    parts = [None if final is None else str(final.with_name(f"{final.stem}.part{i}of{processes}{final.suffix}"))
             for i in range(processes)]
    shares = cpu_affinity.split_cpus(processes) if pin_cpus and cpu_affinity.can_pin() else [None] * processes
    try:
        results = process_pool.run_jobs(
            _play_part, [(world_dir, checkpoint, play, (i, processes), parts[i], cache, shares[i])
                         for i in range(processes)],
            workers=processes, labels=[f"part {i}/{processes}" for i in range(processes)],
            desc=f"savanna-sim jax:{Path(checkpoint).name} ({processes} processes)", progress=progress)
        if final is not None:
            with shards.ShardWriter(final, overwrite=True) as writer:
                for part in parts:
                    for trajectory in shards.read_shard(part):
                        writer.write(trajectory)
    finally:
        for part in parts:
            if part is not None:
                Path(part).unlink(missing_ok=True)
    rows: dict[str, list[savanna.Episode]] = {}
    for part_rows, _ in results:
        for task_id, episodes in part_rows.items():
            rows.setdefault(task_id, []).extend(episodes)
    return rows, results[0][1]


def evaluate(world_dir: str | os.PathLike, policy: str | os.PathLike | savanna.Agent, *,
             env_name: str | None = None, limit: int | None = None, progress: bool = False,
             **options: Any) -> dict[str, Any]:
    """Evaluates a built-in agent name, a checkpoint folder, or an agent object / callable (module docstring).

    Args:
        world_dir: a world built by `ranger_jax.env.sim.build`.
        policy: `expert`, `naive`, `finder`, a checkpoint folder, a callable `act(state) -> str` or an object
            with that `act` method.
        env_name: an environment file or backend name (agents: default "offline"; checkpoints: default their
            recorded settings).
        limit: run only the first `limit` tasks.
        progress: show a progress bar.
        **options: checkpoints: `evaluate_checkpoint` keywords; every kind: `env.make` options.

    Raises:
        ValueError: a name that is neither a built-in agent nor a checkpoint folder (listing the built-ins).
    """
    if isinstance(policy, (str, os.PathLike)) and os.fspath(policy) not in savanna.POLICIES:
        if not is_checkpoint(policy):
            raise ValueError(f"policy {os.fspath(policy)!r} is neither a built-in agent {sorted(savanna.POLICIES)} "
                             "nor a checkpoint folder (config.json, safetensors, tokenizer.json)")
        return evaluate_checkpoint(world_dir, policy, env_name=env_name, limit=limit, progress=progress, **options)
    agent = os.fspath(policy) if isinstance(policy, os.PathLike) else policy
    return savanna.evaluate(world_dir, agent, env_name=env_name or "offline", limit=limit, progress=progress,
                            **options)
