"""The reward an environment's settings ask for: what `ToolEnv.score` / `ToolEnv.ascore` compute.

`make_reward(env)` reads the env's `[rewards]` table (`env.rewards`) and its `max_answer_refs`:

- `kind = "sim"` (the default): `rewards.offline.OfflineReward`, exact in the offline world (the backend's
  world), weighted by `text_coef`, with the hard-zero rules and the env's reference limits;
- `kind = "judge"`: `rewards.live.JudgeReward`, the live flow: a generator (`generator_kind = "sglang"`, the SGLang
  images API, or `"gen_searcher"`, Gen-Searcher's `/generate` service, at `generator_url`), then K-Score and
  text-reward judges over an OpenAI-compatible chat endpoint (`judge_url`, `judge_model`). Each service reads its
  own key from the environment variable its settings name (`judge_api_key_env`, `generator_api_key_env`); a named
  variable that is not set is an error when the reward is made, before any episode is scored.

Any object with `async ascore(state) -> env.Score` can stand in (`ToolEnv(..., reward=...)` or `env.reward = ...`).
"""

from __future__ import annotations

import os
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


def service_key(settings: Mapping[str, Any], key_env_setting: str, environ: Mapping[str, str] | None = None,
                where: str = "env rewards") -> str | None:
    """The API key of one reward service: the value of the environment variable that `settings[key_env_setting]`
    names, or None when the settings name none (the service takes no key).

    Raises:
        ValueError: the named variable is not set, naming it and the setting.
    """
    variable = settings.get(key_env_setting)
    if not variable:
        return None
    value = (os.environ if environ is None else environ).get(variable)
    if not value:
        raise ValueError(f"{where}: ${variable} is not set ({key_env_setting} names it as the key of the "
                         f"{key_env_setting.removesuffix('_api_key_env')})")
    return value


def make_generator(settings: Mapping[str, Any], *, environ: Mapping[str, str] | None = None,
                   where: str = "env rewards") -> images_lib.Generator:
    """The image generator the reward settings name: `generator_kind` "sglang" (default) or "gen_searcher".

    Raises:
        ValueError: a missing `generator_url` or an unset key variable, naming it.
    """
    url = _setting(settings, "generator_url", where)
    if settings.get("generator_kind", "sglang") == "gen_searcher":
        return images_lib.GenSearcherGenerator(url)
    return images_lib.SGLangImageGenerator(url, model=settings.get("generator_model"),
                                           api_key=service_key(settings, "generator_api_key_env", environ, where))


def make_reward(env: tool_env.ToolEnv, *, world: world_lib.World | None = None,
                ground_truth: Callable[[core.Task], media.ImageLike | None] | None = None,
                environ: Mapping[str, str] | None = None) -> offline.OfflineReward | live.JudgeReward:
    """The reward `env`'s settings ask for (see the module docstring).

    Args:
        env: the environment (its `rewards` table and `config.max_answer_refs`).
        world: sim only: the offline world; default the backend's (`OfflineBackend.world`).
        ground_truth: judge only: the GT image of a task (default `live.task_ground_truth`).
        environ: judge only: where the services' key variables are read (default `os.environ`).

    Raises:
        ValueError: an unknown kind, a sim reward without a world, a judge setting that is missing, or a key
            variable the settings name that is not set (naming it).
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
                                   model=_setting(settings, "judge_model", where),
                                   api_key=service_key(settings, "judge_api_key_env", environ, where))
    generator = make_generator(settings, environ=environ, where=where)
    alpha = combine.clamp_alpha(settings.get("text_coef", 0.0))
    reward = live.LiveReward(generator, image_judge=KScoreJudge(judge_client) if alpha < 1 else None,
                             text_judge=TextRewardJudge(judge_client) if alpha > 0 else None, alpha=alpha,
                             min_references=settings.get("min_references", combine.MIN_REFERENCES),
                             max_references=env.config.max_answer_refs)
    return live.JudgeReward(reward, ground_truth or live.task_ground_truth)
