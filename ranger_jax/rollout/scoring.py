"""The rollout loop's `Scorer`: the environment's own reward (`ToolEnv.ascore`), plus a picture for the viewer.

The number a trajectory records is exactly `env.ascore(state).reward`, the one evaluations report. Live rewards
(`kind = "judge"`) generate an image as part of the reward, and it is recorded with the trajectory; for exact
offline rewards, which generate nothing, the OFFLINE compositor (`clients.compositor`) makes the viewer's image
from the answer's references when no hard-zero rule fired (it never changes the reward; a failure is recorded).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from ranger_jax.clients import compositor, media
from ranger_jax.clients import images as images_lib
from ranger_jax.env import core, tool_env
from ranger_jax.env.sim import world as world_lib
from ranger_jax.rewards import env_reward

COMPOSITOR_SEED = 0  # the viewer's picture is pinned like a generator call


class EnvScorer:
    """Scores an episode with its env's reward (see the module docstring).

    Args:
        generator: makes the viewer's image when the reward generated none (None: no image).
    """

    def __init__(self, generator: images_lib.Generator | None = None):
        self.generator = generator

    async def ascore(self, env: tool_env.ToolEnv, state: tool_env.EnvState) -> core.Score:
        """`env.ascore(state)`, with the viewer's image as its `generation` when the reward made none."""
        score = await env.ascore(state)
        if score.generation is not None or self.generator is None or score.zero_reason is not None \
                or state.answer is None:
            return score
        paths = [state.images[ref.img_id].path for ref in state.answer.reference_images
                 if ref.img_id in state.images and os.path.isfile(state.images[ref.img_id].path)]
        generation = await self.generator.agenerate(state.answer.gen_prompt, paths, seed=COMPOSITOR_SEED)
        return dataclasses.replace(score, generation=generation)


def make_scorer(env: tool_env.ToolEnv, *, world: world_lib.World | None = None, generate_images: bool = True,
                ground_truth: Callable[[core.Task], media.ImageLike | None] | None = None) -> EnvScorer:
    """The rollout scorer of `env`: its reward, and the offline compositor's picture for the viewer.

    With `world` or `ground_truth`, the env's reward is first rebuilt from its settings with them
    (`env.reward = rewards.env_reward.make_reward(env, ...)`), so `env.score` and the rollout agree. The judge's
    and generator's keys come from the environment variables the settings name (`judge_api_key_env`,
    `generator_api_key_env`), never from the policy's.

    Args:
        env: the environment; its `[rewards]` settings choose the reward.
        world: sim: the offline world (default the backend's).
        generate_images: compose the viewer's image for rewards that generate none.
        ground_truth: judge: the GT image of a task (default `rewards.live.task_ground_truth`).

    Raises:
        ValueError: the settings cannot make a reward (an unknown kind, no world, a missing judge setting, an unset
            key variable).
        TypeError: a reward installed on the env has no `ascore`.
    """
    if world is not None or ground_truth is not None:
        env.reward = env_reward.make_reward(env, world=world, ground_truth=ground_truth)
    elif not callable(getattr(env.reward, "ascore", None)):  # built now: a missing setting fails here, not mid-run
        raise TypeError(f"env.reward ({type(env.reward).__name__}) has no ascore(state) method")
    generator = compositor.CompositorGenerator(max_references=env.config.max_answer_refs) if generate_images \
        else None
    return EnvScorer(generator)
