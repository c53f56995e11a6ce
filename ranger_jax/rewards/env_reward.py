"""The reward an environment's settings ask for: what `ToolEnv.score` / `ToolEnv.ascore` compute.

`make_reward(env)` reads the env's `[rewards]` table (`env.rewards`) and its `max_answer_refs`:

- `kind = "sim"` (the default): `rewards.offline.OfflineReward`, exact in the offline world (the backend's
  world), weighted by `text_coef`, with the hard-zero rules and the env's reference limits;
- `kind = "judge"`: `rewards.live.JudgeReward`, the live flow (SGLang images API generator, K-Score and
  text-reward judges over an OpenAI-compatible chat endpoint: `generator_url`, `judge_url`, `judge_model`).

Any object with `async ascore(state) -> env.Score` can stand in (`ToolEnv(..., reward=...)` or `env.reward = ...`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ranger_jax.clients import chat, media
from ranger_jax.clients import images as images_lib
from ranger_jax.env import config as config_lib
from ranger_jax.env import core, tool_env
from ranger_jax.env.sim import world as world_lib
from ranger_jax.rewards import combine, live, offline
from ranger_jax.rewards.judge import KScoreJudge
from ranger_jax.rewards.text_reward import TextRewardJudge


class Reward(Protocol):
    """Scores a finished episode of an env."""

    async def ascore(self, state: tool_env.EnvState) -> core.Score:
        """The reward of the finished episode in `state`."""


def _setting(settings: Mapping[str, Any], key: str, where: str) -> Any:
    if not settings.get(key):
        raise ValueError(f"{where}: reward kind 'judge' needs the [rewards] key {key!r} (e.g. make(..., {key}=...))")
    return settings[key]


def make_reward(env: tool_env.ToolEnv, *, world: world_lib.World | None = None, api_key: str | None = None,
                ground_truth: Callable[[core.Task], media.ImageLike | None] | None = None
                ) -> offline.OfflineReward | live.JudgeReward:
    """The reward `env`'s settings ask for (see the module docstring).

    Args:
        env: the environment (its `rewards` table and `config.max_answer_refs`).
        world: sim only: the offline world; default the backend's (`OfflineBackend.world`).
        api_key: judge only: bearer key for the judge and generator servers.
        ground_truth: judge only: the GT image of a task (default `live.task_ground_truth`).

    Raises:
        ValueError: an unknown kind, a sim reward without a world, or a judge setting that is missing (naming it).
    """
    settings, where = env.rewards, "env rewards"
    kind = settings.get("kind", "sim")
    if kind not in config_lib.REWARD_KINDS:
        raise ValueError(f"{where}: unknown reward kind {kind!r}; known kinds: {list(config_lib.REWARD_KINDS)}")
    if kind == "sim":
        world = world if world is not None else getattr(env.backend, "world", None)
        if not isinstance(world, world_lib.World):
            raise ValueError(f"{where}: reward kind 'sim' needs the offline world; backend "
                             f"{type(env.backend).__name__} has none (use the offline backend or pass world=)")
        return offline.OfflineReward.from_env(env, world)
    judge_client = chat.ChatClient(_setting(settings, "judge_url", where),
                                   model=_setting(settings, "judge_model", where), api_key=api_key)
    generator = images_lib.SGLangImageGenerator(_setting(settings, "generator_url", where),
                                                model=settings.get("generator_model"), api_key=api_key)
    alpha = combine.clamp_alpha(settings.get("text_coef", 0.0))
    reward = live.LiveReward(generator, image_judge=KScoreJudge(judge_client) if alpha < 1 else None,
                             text_judge=TextRewardJudge(judge_client) if alpha > 0 else None, alpha=alpha,
                             min_references=settings.get("min_references", combine.MIN_REFERENCES),
                             max_references=env.config.max_answer_refs)
    return live.JudgeReward(reward, ground_truth or live.task_ground_truth)
