"""Shared rollout fixtures: a small offline world, tokenizers/renderers, a tiny random policy and its sampler.

Built once per session: the world (sim builder), the real Qwen3 tokenizer (scripted / harness episodes, realistic
token counts), and a tiny random Qwen3-VL checkpoint with the tiny test tokenizer plus ONE `Sampler` over it, so
every JAX test (in-process policy and the loopback SGLang server alike) shares its compiled programs.
"""

from __future__ import annotations

import pytest
from support.tiny_tokenizer import qwen3_tokenizer_dir, write_tiny_tokenizer

from ranger_jax import env, sampling
from ranger_jax.env.sim import build, world
from ranger_jax.models import qwen3_vl
from ranger_jax.processing import ChatRenderer, load_tokenizer
from ranger_jax.rollout import actor, episode, policy, sequence

WORLD_TASKS, WORLD_SEED = 4, 11
# Tiny-policy episodes: the tiny tokenizer spends ~1.8k tokens on the system prompt of an image_search-only env,
# so one 2048-slot cache row holds the prompt plus a few 32-token turns and the context budget is reached.
TINY_CONTEXT = 2048
TINY_ENV = {"tools": ["image_search"], "max_turns": 4}
TINY_VISION = sequence.VisionSettings(min_pixels=1024, max_pixels=16_384)
SAMPLER_ROWS = 2


@pytest.fixture(scope="session")
def world_dir(tmp_path_factory):
    return build.build_world(tmp_path_factory.mktemp("rollout") / "world", WORLD_TASKS, WORLD_SEED, world_version=1)


@pytest.fixture(scope="session")
def the_world(world_dir):
    return world.load_world(world_dir)


@pytest.fixture(scope="session")
def tasks(world_dir):
    return world.load_tasks(world_dir)


@pytest.fixture(scope="session")
def qwen_renderer():
    return ChatRenderer(load_tokenizer(qwen3_tokenizer_dir()))


@pytest.fixture(scope="module")
def sim_env(world_dir):
    with env.make("savanna_sim", world=str(world_dir)) as tool_env:
        yield tool_env


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    tokenizer_dir = tmp_path_factory.mktemp("tiny_tokenizer")
    write_tiny_tokenizer(tokenizer_dir, vocab_size=512)
    return actor.write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", tokenizer_dir, seed=3)


@pytest.fixture(scope="session")
def tiny_renderer(tiny_checkpoint):
    return ChatRenderer(load_tokenizer(tiny_checkpoint))


@pytest.fixture(scope="session")
def tiny_sampler(tiny_checkpoint, tiny_renderer):
    return sampling.Sampler(qwen3_vl.load(tiny_checkpoint),
                            suppress_token_ids=sorted(tiny_renderer.tokenizer.vision_ids))


@pytest.fixture(scope="module")
def tiny_env(world_dir):
    with env.make("savanna_sim", world=str(world_dir), **TINY_ENV) as tool_env:
        yield tool_env


@pytest.fixture(scope="session")
def tiny_config():
    """`tiny_config(temperature=1.0) -> EpisodeConfig` for tiny-policy episodes."""

    def make(temperature: float = 1.0) -> episode.EpisodeConfig:
        return episode.EpisodeConfig(max_new_tokens=32, max_context_tokens=TINY_CONTEXT, vision=TINY_VISION,
                                     sampling=policy.SamplingParams(temperature=temperature, top_p=1.0))

    return make
