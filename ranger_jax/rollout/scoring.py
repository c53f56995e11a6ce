"""Rewards for finished episodes, behind the loop's `Scorer` interface: exact offline, or generator + judges live.

`make_scorer(env, …)` follows the environment's `[rewards]` table: `kind = "sim"` scores exactly in the
offline world (`rewards.offline.OfflineReward`, the compositor's image for the viewer); `kind = "judge"` runs
the live flow (`rewards.live.LiveReward`: SGLang images API generator, K-Score and text-reward judges over an
OpenAI-compatible chat endpoint).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ranger_jax.clients import chat, media
from ranger_jax.clients import images as images_lib
from ranger_jax.env import core, tool_env
from ranger_jax.env.sim import world as world_lib
from ranger_jax.rewards import combine, live, offline
from ranger_jax.rewards.judge import KScoreJudge
from ranger_jax.rewards.text_reward import TextRewardJudge

REWARD_KINDS = ("sim", "judge")


class OfflineScorer:
    """The exact offline-world reward of an episode (`rewards.offline.OfflineReward`)."""

    def __init__(self, reward: offline.OfflineReward):
        self.reward = reward

    async def ascore(self, env: tool_env.ToolEnv, state: tool_env.EnvState
                     ) -> tuple[combine.RewardBreakdown, images_lib.GenerationResult | None]:
        """The exact offline reward of the episode in `state`; nothing is generated."""
        return await self.reward.ascore(state.task, answer=state.answer, termination=state.termination,
                                        images=state.images)


def task_ground_truth(task: core.Task) -> media.ImageLike | None:
    """The GT image of a task: `ground_truth` itself (path, bytes, image), or its `gt_image` / `gen_image` key, or
    an offline-world task's `image_file` (relative to `metadata["world"]`)."""
    truth = task.ground_truth
    if not isinstance(truth, Mapping):
        return truth
    if truth.get("gt_image", truth.get("gen_image")) is not None:
        return truth.get("gt_image", truth.get("gen_image"))
    world = (task.metadata or {}).get("world")
    if truth.get("image_file") and world:
        return str(Path(world) / truth["image_file"])
    return None


class LiveScorer:
    """The live reward of an episode (`rewards.live.LiveReward`).

    Args:
        reward: generator + judges + α.
        ground_truth: the GT image of a task (default: `task_ground_truth`).
    """

    def __init__(self, reward: live.LiveReward,
                 ground_truth: Callable[[core.Task], media.ImageLike | None] = task_ground_truth):
        self.reward, self.ground_truth = reward, ground_truth

    async def ascore(self, env: tool_env.ToolEnv, state: tool_env.EnvState
                     ) -> tuple[combine.RewardBreakdown, images_lib.GenerationResult | None]:
        """The live reward of the episode in `state`: generator, then judges."""
        episode = live.Episode(question=state.task.prompt, ground_truth=self.ground_truth(state.task),
                               answer=state.answer, termination=state.termination, images=state.images)
        return await self.reward.ascore(episode)


def _setting(settings: Mapping[str, Any], key: str, where: str) -> Any:
    if not settings.get(key):
        raise ValueError(f"{where}: reward kind 'judge' needs the [rewards] key {key!r} (or pass it to make_scorer)")
    return settings[key]


def make_scorer(env: tool_env.ToolEnv, *, world: str | os.PathLike | world_lib.World | None = None,
                generate_images: bool = True, overrides: Mapping[str, Any] | None = None,
                api_key: str | None = None,
                ground_truth: Callable[[core.Task], media.ImageLike | None] = task_ground_truth
                ) -> OfflineScorer | LiveScorer:
    """The scorer an environment's `[rewards]` table asks for.

    Args:
        env: the environment (its `rewards` settings choose the kind).
        world: the offline world (a loaded `World` or its folder) for `kind = "sim"`.
        generate_images: sim only: run the offline compositor for the viewer.
        overrides: reward settings that replace the env's (e.g. `judge_url`, `generator_url` for a test).
        api_key: bearer key for the judge and generator servers.
        ground_truth: judge only: the GT image of a task.

    Raises:
        ValueError: an unknown kind, a missing world, or a live setting that is missing (naming the key).
    """
    settings = {**dict(env.rewards), **dict(overrides or {})}
    kind = settings.get("kind", "sim")
    where = "env rewards"
    if kind not in REWARD_KINDS:
        raise ValueError(f"{where}: unknown reward kind {kind!r}; known kinds: {list(REWARD_KINDS)}")
    if kind == "sim":
        if world is None:
            raise ValueError(f"{where}: reward kind 'sim' needs the offline world (world=DIR)")
        loaded = world if isinstance(world, world_lib.World) else world_lib.load_world(Path(world))
        return OfflineScorer(offline.OfflineReward.from_settings(loaded, settings, generate=generate_images))
    judge_client = chat.ChatClient(_setting(settings, "judge_url", where),
                                   model=_setting(settings, "judge_model", where), api_key=api_key)
    generator = images_lib.SGLangImageGenerator(
        _setting(settings, "generator_url", where), model=settings.get("generator_model"),
        max_references=settings.get("max_ref_images", images_lib.MAX_REFERENCES), api_key=api_key)
    alpha = float(settings.get("text_coef", 0.0))
    reward = live.LiveReward(generator, image_judge=KScoreJudge(judge_client) if alpha < 1 else None,
                             text_judge=TextRewardJudge(judge_client) if alpha > 0 else None, alpha=alpha,
                             min_references=settings.get("min_references", combine.MIN_REFERENCES),
                             max_references=settings.get("max_references", combine.MAX_REFERENCES))
    return LiveScorer(reward, ground_truth)
