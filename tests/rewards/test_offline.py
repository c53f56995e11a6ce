"""The offline world's RL reward: hard-zero rules, then exactly the sim score; the compositor image for viewing."""

import asyncio
import dataclasses
import io

import pytest
from PIL import Image

from ranger_jax import env
from ranger_jax.env import core
from ranger_jax.env.sim import agents, build, rewards as sim_rewards, world
from ranger_jax.env.sim.detector import OracleDetector
from ranger_jax.rewards import combine, offline


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    """(world, [(task, final state of the expert's episode)]) on a small world."""
    root = build.build_world(tmp_path_factory.mktemp("offline_reward") / "w", 3, 21)
    the_world = world.load_world(root)
    expert = agents.ExpertAgent(OracleDetector(the_world))
    with env.make("envs/savanna_sim.toml", world=str(root)) as tool_env:
        yield the_world, [(task, agents.run_episode(tool_env, task, expert)) for task in world.load_tasks(root)], \
            dict(tool_env.rewards)


def score(reward, task, state, **changes):
    fields = {"answer": state.answer, "termination": state.termination, "images": state.images, **changes}
    return asyncio.run(reward.ascore(task, **fields))


def test_reward_is_the_exact_sim_score(episodes):
    the_world, runs, settings = episodes
    reward = offline.OfflineReward.from_settings(the_world, settings)
    for task, state in runs:
        breakdown, generation = score(reward, task, state)
        exact = sim_rewards.score(the_world, task, state.answer, state.images, criteria=reward.criteria)
        assert breakdown.reward == exact.reward > 0 and breakdown.zero_reason is None
        sim = breakdown.components["sim"]
        assert (sim["search_pass"], sim["crop_iou"], sim["text_score"]) == (exact.search_pass, exact.crop_iou,
                                                                           exact.text_score)
        assert [r["img_id"] for r in sim["references"]] == [r.img_id for r in state.answer.reference_images][:3]
        assert generation.ok and Image.open(io.BytesIO(generation.image)).format == "PNG"
        assert generation.request["generator"] == "offline-compositor" and generation.request["num_references"] == 1


def test_hard_zero_rules_keep_the_sim_parts(episodes):
    the_world, runs, settings = episodes
    reward = offline.OfflineReward.from_settings(the_world, settings)
    task, state = runs[0]
    breakdown, generation = score(reward, task, state, termination=core.REPEATED_RESPONSE)
    assert breakdown.reward == 0 and breakdown.zero_reason == combine.TERMINATED and generation is None
    assert breakdown.components["sim"]["reward"] > 0  # what the answer would have scored
    no_refs = dataclasses.replace(state.answer, reference_images=())
    breakdown, _ = score(reward, task, state, answer=no_refs)
    assert breakdown.zero_reason == combine.REFERENCE_COUNT and "0 valid local references" in breakdown.detail
    breakdown, _ = score(reward, task, state, answer=None, termination=core.NO_ANSWER)
    assert breakdown.zero_reason == combine.NO_ANSWER and breakdown.components["sim"]["reason"] == "no answer"
    strict = offline.OfflineReward(the_world, min_references=2, max_references=4, generate=False)
    breakdown, generation = score(strict, task, state)
    assert breakdown.zero_reason == combine.REFERENCE_COUNT and generation is None


def test_settings_and_errors(episodes):
    the_world, runs, settings = episodes
    criteria = offline.criteria_from_settings({"coverage_min": 0.5, "max_ref_images": 2, "text_coef": 0.5})
    assert criteria == sim_rewards.Criteria(coverage_min=0.5, max_references=2)
    reward = offline.OfflineReward.from_settings(the_world, {**settings, "max_ref_images": 2, "min_references": 0})
    assert reward.criteria.max_references == 2 and reward.min_references == 0 and reward.generator.max_references == 2
    task, state = runs[0]
    quiet = offline.OfflineReward(the_world, generate=False)
    assert score(quiet, task, state)[1] is None
    with pytest.raises(ValueError, match="need 0 <= min_references <= max_references, got 3, 1"):
        offline.OfflineReward(the_world, min_references=3, max_references=1)
    with pytest.raises(ValueError, match="has no offline-world ground truth"):
        quiet.breakdown(core.Task("x", "p"), answer=None, termination=None, images={})
