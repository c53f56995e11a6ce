"""The offline world's reward through `ToolEnv.score`: hard-zero rules, then the sim judgement weighted by
text_coef; the env's max_answer_refs is the one reference limit; scores do not change when the env is closed."""

import dataclasses
import json
import os

import pytest

from ranger_jax import env
from ranger_jax.env import core
from ranger_jax.env.sim import agents, build, rewards as sim_rewards, world
from ranger_jax.env.sim.detector import OracleDetector
from ranger_jax.rewards import combine, env_reward, offline


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
    return build.build_world(tmp_path_factory.mktemp("offline_reward") / "w", 3, 21, world_version=1)


@pytest.fixture(scope="module")
def the_world(world_dir):
    return world.load_world(world_dir)


@pytest.fixture(scope="module")
def expert(the_world):
    return agents.ExpertAgent(OracleDetector(the_world))


@pytest.fixture(scope="module")
def runs(world_dir, expert):
    """[(task, final state of the expert's episode)] in an env that stays open for the module."""
    tool_env = env.make("savanna_sim", world=str(world_dir))
    yield tool_env, [(task, agents.run_episode(tool_env, task, expert)) for task in world.load_tasks(world_dir)]
    tool_env.close()


def expected(judged: sim_rewards.SimScore, alpha: float) -> float:
    """The reward written out: (1 − α)·(0.75·search pass + 0.25·crop IoU) + α·text score."""
    return (1 - alpha) * (0.75 * judged.search_pass + 0.25 * judged.crop_iou) + alpha * judged.text_score


def with_images(tool_env, task, queries):
    """A fresh episode of `task` after one image_search per query (five results each)."""
    state = tool_env.reset(task)
    for query in queries:
        call = json.dumps({"name": "image_search", "arguments": {"query": query, "top_k": 5}})
        state, _ = tool_env.step(state, f"<tool_call>\n{call}\n</tool_call>")
    return state


def answer_text(img_ids, gen_prompt="the new one, navy"):
    refs = [{"img_id": i, "note": "ref"} for i in img_ids]
    return f"<answer>{json.dumps({'gen_prompt': gen_prompt, 'reference_images': refs})}</answer>"


def test_reward_is_the_weighted_sim_judgement(runs, the_world):
    tool_env, episodes = runs
    assert tool_env.rewards["text_coef"] == 0.5
    for task, state in episodes:
        score = tool_env.score(state)
        judged = sim_rewards.score(the_world, task, state.answer, state.images)
        assert score.reward == pytest.approx(expected(judged, 0.5)) and score.reward > 0.5
        assert score.zero_reason is None and (score.reason is None) == (score.reward == 1.0)
        b = score.breakdown
        assert (b["kind"], b["search_pass"], b["crop_iou"], b["text_score"]) == ("sim", judged.search_pass,
                                                                                judged.crop_iou, judged.text_score)
        assert [r["img_id"] for r in b["references"]] == [r.img_id for r in state.answer.reference_images]
        assert json.loads(json.dumps(score.to_dict())) == score.to_dict()  # plain JSON, as trajectories store it
        assert core.Score.from_dict(score.to_dict()) == score


def test_text_coef_is_honoured(world_dir, the_world, runs):
    _, episodes = runs
    task, state = episodes[0]
    judged = sim_rewards.score(the_world, task, dataclasses.replace(state.answer, gen_prompt="nothing useful"),
                               state.images)
    assert judged.text_score < 1 and judged.search_pass  # the text part must matter for this test to mean much
    state = dataclasses.replace(state, answer=dataclasses.replace(state.answer, gen_prompt="nothing useful"))
    rewards = {}
    for alpha in (0.0, 0.2, 0.5, 1.0):
        with env.make("savanna_sim", world=str(world_dir), text_coef=alpha) as tool_env:
            rewards[alpha] = tool_env.score(state).reward
        assert rewards[alpha] == pytest.approx(expected(judged, alpha))
    assert rewards[0.2] == pytest.approx(0.6 + 0.2 * judged.crop_iou + 0.2 * judged.text_score)
    assert rewards[0.0] > rewards[0.5] > rewards[1.0]
    with env.make("offline", world=str(world_dir)) as bare:  # no [rewards] table: α = 0, image parts only
        assert bare.score(state).reward == pytest.approx(rewards[0.0])


def test_max_answer_refs_is_the_one_reference_limit(world_dir, runs, the_world):
    _, episodes = runs
    task = episodes[0][0]
    for limit in (5, 2):
        with env.make("savanna_sim", world=str(world_dir), max_answer_refs=limit) as tool_env:
            state = with_images(tool_env, task, [task.prompt, "official photo"])
            assert f"list at most {limit} references" in state.messages[0]["content"]
            ids = sorted(state.images)
            assert len(ids) >= 6
            for cited in (ids[:limit], ids[:6]):  # exactly the limit, and one too many (the parser keeps `limit`)
                final, _ = tool_env.step(state, answer_text(cited))
                assert final.termination == core.ANSWER and len(final.answer.reference_images) == limit
                score = tool_env.score(final)
                assert score.zero_reason is None, score
                judged = sim_rewards.score(the_world, task, final.answer, final.images)
                assert score.reward == pytest.approx(expected(judged, 0.5))
                assert len(score.breakdown["references"]) == score.breakdown["max_references"] == limit


def test_hard_zero_rules_keep_the_sim_parts(runs, world_dir):
    tool_env, episodes = runs
    task, state = episodes[0]
    full = tool_env.score(state)
    cut = tool_env.score(dataclasses.replace(state, termination=core.REPEATED_RESPONSE))
    assert cut.reward == 0 and cut.zero_reason == combine.TERMINATED and "repeated_response" in cut.reason
    assert cut.breakdown["search_pass"] == full.breakdown["search_pass"]  # what the answer would have scored
    no_refs = tool_env.score(dataclasses.replace(state, answer=dataclasses.replace(state.answer,
                                                                                   reference_images=())))
    assert no_refs.zero_reason == combine.REFERENCE_COUNT and no_refs.reason == "0 valid local references, " \
                                                                                "allowed [1, 5]"
    none = tool_env.score(dataclasses.replace(state, answer=None, termination=core.NO_ANSWER))
    assert none.zero_reason == combine.NO_ANSWER and none.breakdown["sim_reason"] == "no answer"
    with env.make("savanna_sim", world=str(world_dir), min_references=2) as strict:
        assert strict.score(state).zero_reason == combine.REFERENCE_COUNT


def test_scores_do_not_change_when_the_env_is_closed(world_dir, expert):
    tool_env = env.make("savanna_sim", world=str(world_dir))
    states = [agents.run_episode(tool_env, task, expert) for task in world.load_tasks(world_dir)]
    assert any(state.images[ref.img_id].parent_id for state in states for ref in state.answer.reference_images)
    before = [tool_env.score(state) for state in states]
    tool_env.close()  # removes the env's image store: the crops' files are gone
    assert not any(os.path.exists(state.images[ref.img_id].path) for state in states
                   for ref in state.answer.reference_images if state.images[ref.img_id].parent_id)
    assert [tool_env.score(state) for state in states] == before
    with env.make("savanna_sim", world=str(world_dir)) as other:  # a fresh env scores them the same
        assert [other.score(state) for state in states] == before


def test_live_reward_refuses_to_score_references_whose_files_are_gone(world_dir, expert):
    judge = {"kind": "judge", "judge_url": "http://127.0.0.1:9/v1", "judge_model": "j", "generator_url": "http://x"}
    tool_env = env.make("savanna_sim", world=str(world_dir), **judge)
    state = agents.run_episode(tool_env, world.load_tasks(world_dir)[0], expert)
    tool_env.close()
    with pytest.raises(ValueError, match=r"the files of references \['IMG_\d+'\] are gone .*before ToolEnv.close"):
        tool_env.score(state)


def test_errors(runs, world_dir, the_world):
    tool_env, episodes = runs
    task, state = episodes[0]
    with pytest.raises(ValueError, match=f"episode '{task.id}' is not over"):
        tool_env.score(tool_env.reset(task))
    with pytest.raises(TypeError, match="score needs an EnvState; got dict"):
        tool_env.score({})
    with pytest.raises(ValueError, match="has no offline-world ground truth"):
        tool_env.score(dataclasses.replace(state, task=core.Task("x", "p")))
    with pytest.raises(ValueError, match="need 0 <= min_references <= max_references, got 3, 1"):
        offline.OfflineReward(the_world, min_references=3, max_references=1)
    with env.make("savanna_sim", world=str(world_dir), kind="judge") as judged:
        with pytest.raises(ValueError, match=r"reward kind 'judge' needs the \[rewards\] key 'judge_url'"):
            judged.score(state)
    with env.make("savanna_live", judge_url="") as live_env:
        with pytest.raises(ValueError, match="judge_url"):
            env_reward.make_reward(live_env)
        live_env.reward = offline.OfflineReward(the_world)  # any reward can stand in
        assert live_env.score(state) == offline.OfflineReward(the_world).score(state)
