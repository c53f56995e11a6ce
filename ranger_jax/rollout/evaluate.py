"""Savanna-style evaluation of any policy in the offline world: a scripted agent, your agent, or a checkpoint.

    evaluate(world_dir, "expert")                     # built-in scripted agents: expert, naive, finder
    evaluate(world_dir, my_agent)                     # a callable act(state) -> str, or an object with act
    evaluate(world_dir, "/ckpt/policy")               # an HF-layout Qwen3-VL folder with tokenizer.json

A checkpoint runs through the JAX sampler (`sampling.Sampler` behind `rollout.SamplerPolicy`), greedy
(temperature 0), every task through `rollout.runner` with `concurrency` episodes in flight, and is scored with the
env's reward (`ToolEnv.ascore`, the number RL trains on). When the folder carries the settings it was trained
with (`rollout.trained_env`, `ranger_env.json`), the eval uses them: its tools, prompt style, limits and
reward settings, image pixel bounds and token budgets; an `env_name` (e.g. `"savanna_sim"`) replaces
the recorded env and reward settings, and keyword options override either. Scripted and callable agents run
through `env.sim.savanna.evaluate`. Every kind reports the same summary (`savanna.report`).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import tqdm

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


def is_checkpoint(path: str | os.PathLike) -> bool:
    """Whether `path` is a folder with an HF `config.json` (a model checkpoint)."""
    return (Path(path) / "config.json").is_file()


class _RowScorer:
    """The env's own score of each episode, keeping the report row of every finished state."""

    def __init__(self):
        self.rows: dict[str, savanna.Episode] = {}

    async def ascore(self, env: tool_env.ToolEnv, state: tool_env.EnvState) -> core.Score:
        score = await env.ascore(state)
        self.rows[state.task.id] = savanna.episode_row(env, state, score)
        return score


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
            passed = sum(e.judgement.search_pass for e in scorer.rows.values())
            bar.set_postfix(search=f"{passed / len(scorer.rows):.3f}")


def evaluate_checkpoint(world_dir: str | os.PathLike, checkpoint: str | os.PathLike, *, env_name: str | None = None,
                        limit: int | None = None, concurrency: int = DEFAULT_CONCURRENCY,
                        max_new_tokens: int | None = None, max_context_tokens: int | None = None,
                        blank_observations: bool = False, trajectories_out: str | os.PathLike | None = None,
                        progress: bool = False, **env_options: Any) -> dict[str, Any]:
    """Runs a checkpoint greedily on the world's tasks (see the module docstring); returns the summary and rows.

    Args:
        world_dir: a world built by `ranger_jax.env.sim.build`.
        checkpoint: an HF-layout Qwen3-VL folder (`config.json`, safetensors, `tokenizer.json`), optionally with
            `ranger_env.json`.
        env_name: an environment file or backend name replacing the checkpoint's env and reward settings.
        limit: run only the first `limit` tasks.
        concurrency: episodes in flight (rows of the sampler's KV cache).
        max_new_tokens / max_context_tokens: token budgets per turn / per episode (default: the checkpoint's
            recorded ones, else the rollout defaults).
        blank_observations: the policy sees every observation blank (evaluating a blind control policy as it
            was trained; `episode.EpisodeConfig.blank_observations`).
        trajectories_out: also write every episode as a trajectory shard here (e.g. for `data.viewer`).
        progress: show a tqdm bar with the running search score.
        **env_options: passed to `env.make`, over everything else.

    Raises:
        FileNotFoundError: the folder has no `config.json` or no `tokenizer.json`.
        ValueError: a bad `ranger_env.json` or option, or a `limit` below 1.
    """
    from ranger_jax import sampling  # jax and the model load only when a checkpoint is evaluated
    from ranger_jax.models import qwen3_vl

    savanna.check_limit(limit)
    if not is_checkpoint(checkpoint):
        raise FileNotFoundError(f"{checkpoint} is not a checkpoint folder (no config.json)")
    trained = trained_env.read(checkpoint) or trained_env.TrainedEnv()
    the_world = world_lib.load_world(world_dir)
    tasks = world_lib.load_tasks(world_dir)[:limit]
    tokenizer = tokenizer_lib.load_tokenizer(checkpoint)
    model = qwen3_vl.load(checkpoint, sharding_rules="sample")
    vision_config = model.config.vision_config
    vision = trained.vision(patch_size=vision_config.patch_size, merge_size=vision_config.spatial_merge_size,
                            temporal_patch_size=vision_config.temporal_patch_size)
    budgets = {"max_new_tokens": episode_lib.GEN_SEARCHER_MAX_NEW_TOKENS,
               "max_context_tokens": episode_lib.GEN_SEARCHER_MAX_CONTEXT, **trained.episode}
    budgets.update({k: v for k, v in (("max_new_tokens", max_new_tokens),
                                      ("max_context_tokens", max_context_tokens)) if v is not None})
    config = runner.RolloutConfig(group_size=1, concurrency=concurrency, seed=0, run_id="eval",
                                  episode=episode_lib.EpisodeConfig(sampling=GREEDY, vision=vision,
                                                                    blank_observations=blank_observations,
                                                                    **budgets))
    sampler = sampling.Sampler(model, suppress_token_ids=sorted(tokenizer.vision_ids))
    policy = sampler_policy.SamplerPolicy(sampler, num_rows=concurrency, name=f"jax:{Path(checkpoint).name}")
    renderer = chat_lib.ChatRenderer(tokenizer, merge_size=vision.merge_size)
    options = env_options if env_name is not None else {**trained.env, **trained.rewards, **env_options}
    scorer = _RowScorer()
    with env_lib.make(env_name or "offline", world=str(world_dir), **options) as tool_env:
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
    episodes = [scorer.rows[task.id] for task in tasks]
    return {**savanna.report(str(checkpoint), world_dir, the_world, episodes), "settings": settings,
            "sampling": {"temperature": GREEDY.temperature, "concurrency": concurrency}}


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
