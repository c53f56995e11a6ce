"""One episode, token-exact, on the offline world: the scripted expert, the context budget, policy failures."""

import asyncio
import io

import numpy as np
import pytest
from PIL import Image

from ranger_jax import env
from ranger_jax.data import trajectory as trajectory_lib
from ranger_jax.env import config as config_lib
from ranger_jax.env import core, tool_env
from ranger_jax.env.backends import base
from ranger_jax.env.sim import agents, savanna
from ranger_jax.processing import preprocess_image
from ranger_jax.rollout import episode, policy, runner, scoring, sequence

VISION = sequence.VisionSettings(min_pixels=4096, max_pixels=40_000)
CONFIG = episode.EpisodeConfig(max_new_tokens=512, max_context_tokens=20_000, vision=VISION)


def mask_runs(mask):
    """(start, end) of every run of loss-mask 1."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return list(zip(edges[::2], edges[1::2]))


def run(the_env, pol, task, renderer, config=CONFIG, scorer=None, seed=0):
    spec = episode.EpisodeSpec(task=task, group_id=f"g/{task.id}", sample_index=0, seed=seed)
    return asyncio.run(episode.run_episode(the_env, pol, spec, renderer=renderer, config=config, scorer=scorer))


@pytest.fixture(scope="module")
def expert(the_world, qwen_renderer):
    return policy.ScriptedPolicy(savanna.make_policy("expert", the_world), qwen_renderer.tokenizer, name="expert")


@pytest.fixture(scope="module")
def expert_runs(sim_env, expert, tasks, qwen_renderer, the_world):
    scorer = scoring.make_scorer(sim_env, world=the_world)
    groups = runner.run(sim_env, expert, tasks, renderer=qwen_renderer, scorer=scorer,
                        config=runner.RolloutConfig(concurrency=4, episode=CONFIG))
    return {g.task_id: g.trajectories[0] for g in groups}


def test_expert_trajectories_are_exact_sft_data(expert_runs, tasks, qwen_renderer, the_world, sim_env):
    tok = qwen_renderer.tokenizer
    assert sorted(expert_runs) == sorted(t.id for t in tasks)
    for task in tasks:
        traj = expert_runs[task.id]
        assert traj.termination == core.ANSWER and traj.answer is not None
        # the reward is the env's own score, its parts kept
        assert traj.reward_breakdown["reward"] == traj.reward and traj.reward_breakdown["breakdown"]["kind"] == "sim"
        assert traj.reward >= 0.8 and traj.reward_breakdown["zero_reason"] is None
        # prompt: the rendered system + user turns, byte for byte
        system, user = traj.messages[0]["content"], traj.messages[1]["content"]
        prefix = qwen_renderer.render_prefix(system, user, date=None).ids
        np.testing.assert_array_equal(traj.token_ids[:len(prefix)], prefix)
        # every mask-1 run is one assistant message, decoded back exactly (closing <|im_end|> included)
        said = [m["content"] for m in traj.messages if m["role"] == "assistant"]
        runs = mask_runs(traj.loss_mask)
        assert [tok.decode(traj.token_ids[a:b]) for a, b in runs] == [s + "<|im_end|>" for s in said]
        for a, b in runs:  # each run follows the generation prompt and is followed by "\n"
            np.testing.assert_array_equal(traj.token_ids[a - 3:a], qwen_renderer.generation_prompt().ids)
        assert not traj.sampler_logprobs.any()
        assert traj.metadata["token_exact"] and not traj.metadata["rl_trainable"]
        # images: one per image part, in order, re-preprocessing the recorded PNG gives the recorded grid
        shown = [p["img_id"] for m in traj.messages if isinstance(m["content"], list)
                 for p in m["content"] if p.get("type") == "image"]
        assert [im.img_id for im in traj.images] == shown and shown
        for image in traj.images:
            _, grid = preprocess_image(image.pil(), min_pixels=VISION.min_pixels, max_pixels=VISION.max_pixels)
            assert tuple(grid) == image.grid_thw
        assert any(im.parent_id for im in traj.images)  # the expert's crop
        assert Image.open(io.BytesIO(traj.generated_image)).format == "PNG" and traj.generation_error is None
        assert set(traj.timings) == {"generate_s", "tool_s", "process_s", "rollout_s", "reward_s", "generation_s"}
        assert traj.metadata["num_tool_calls"] == len(said) - 1


def test_shared_cache_changes_nothing_but_the_work(sim_env, expert, tasks, qwen_renderer, the_world):
    """A run's EpisodeCache (prepared images by content, system turns) gives the same trajectories as none."""
    config = runner.RolloutConfig(group_size=2, concurrency=2, seed=3, episode=CONFIG)
    cache = episode.EpisodeCache()
    shared = runner.run(sim_env, expert, tasks[:2], renderer=qwen_renderer, config=config, cache=cache)
    assert cache.images.hits > cache.images.misses > 0  # a group's samples see the same search results
    alone = [runner.run(sim_env, expert, [task], renderer=qwen_renderer, config=runner.RolloutConfig(
        group_size=2, seed=3, episode=CONFIG, run_id="run"), cache=episode.EpisodeCache(max_image_bytes=0))[0]
        for task in tasks[:2]]
    by_task = {g.task_id: g for g in shared}
    for group in alone:
        for a, b in zip(by_task[group.task_id].trajectories, group.trajectories, strict=True):
            np.testing.assert_array_equal(a.token_ids, b.token_ids)
            assert [im.png for im in a.images] == [im.png for im in b.images] and a.messages == b.messages
    system, user = shared[0].trajectories[0].messages[0]["content"], "  a task\n with <b>text</b>  "
    for text in (user, "", "日本語 ✓"):
        np.testing.assert_array_equal(cache.prefix(qwen_renderer, system, text).ids,
                                      qwen_renderer.render_prefix(system, text, date=None).ids)


def test_rollout_records_the_reward_an_eval_reports(expert_runs, tasks, world_dir, sim_env, expert):
    """One reward for eval and RL: the same answer scores the same in savanna.evaluate, ToolEnv.score and the
    trajectory (the expert's episodes replayed through the env alone, scored after it is closed)."""
    report = savanna.evaluate(world_dir, expert.agent, env_name="savanna_sim")
    rows = {row["task_id"]: row for row in report["episodes"]}
    with env.make("savanna_sim", world=str(world_dir)) as replay:
        states = {task.id: agents.run_episode(replay, task, expert.agent) for task in tasks}
    for task in tasks:
        traj, state = expert_runs[task.id], states[task.id]
        assert traj.answer == state.answer
        score = replay.score(state)  # after close: crops cited, their files gone
        assert traj.reward == score.reward == pytest.approx(rows[task.id]["reward"], abs=5e-5)
        assert core.Score.from_dict(traj.reward_breakdown) == score
        assert rows[task.id]["search_pass"] == score.breakdown["search_pass"] is True


def test_context_budget_counts_image_tokens(expert_runs, tasks, sim_env, expert, qwen_renderer):
    task, tok = tasks[0], qwen_renderer.tokenizer
    full = expert_runs[task.id]
    turns = np.flatnonzero(full.token_ids == tok.im_start_id)
    first = full.images[0].token_index  # the first observation with images spans [start, end)
    start, end = int(turns[turns < first][-1]), int(turns[turns > first][0])
    image_tokens = sum(im.num_tokens() for im in full.images if start <= im.token_index < end)
    budget = end - image_tokens + 5  # its TEXT fits in this budget, its image placeholders do not
    assert start < budget < end
    cut = run(sim_env, expert, task, qwen_renderer,
              config=episode.EpisodeConfig(max_new_tokens=512, max_context_tokens=budget, vision=VISION))
    assert cut.termination == core.CONTEXT_EXCEEDED
    assert "image tokens" in cut.metadata["error"]
    assert cut.num_tokens == start <= budget  # nothing of the observation was appended
    np.testing.assert_array_equal(cut.token_ids, full.token_ids[:start])
    assert cut.images == () and not (cut.token_ids == qwen_renderer.tokenizer.image_pad_id).any()
    assert cut.reward == 0.0 and cut.reward_breakdown == {}


class ScriptedGenerations:
    """A policy that plays back fixed generations (or raises), turn by turn."""

    name, token_exact, has_logprobs = "script", True, True

    def __init__(self, turns):
        self.turns, self.released = list(turns), []

    async def generate(self, request):
        item = self.turns[request.turn]
        if isinstance(item, Exception):
            raise item
        return item(request) if callable(item) else item

    async def release(self, rid):
        self.released.append(rid)

    async def aclose(self):
        pass


def text_turn(renderer, text, logprob=-0.5):
    ids = renderer.tokenizer.encode(text) + [renderer.tokenizer.im_end_id]
    return policy.Generation(token_ids=ids, logprobs=np.full(len(ids), logprob), finish_reason="stop",
                             policy_version=7)


def test_truncated_turns_get_a_closing_im_end_outside_the_loss(sim_env, tasks, qwen_renderer):
    tok = qwen_renderer.tokenizer
    cut = policy.Generation(token_ids=tok.encode("<think>I will search the")[:5], logprobs=np.full(5, -1.0),
                            finish_reason="length", policy_version=2)
    pol = ScriptedGenerations([cut, cut])
    traj = run(sim_env, pol, tasks[1], qwen_renderer)
    assert traj.termination == core.REPEATED_RESPONSE  # two truncations in a row
    assert "RESPONSE TOO LONG" in traj.messages[3]["content"]
    runs = mask_runs(traj.loss_mask)
    assert [b - a for a, b in runs] == [5, 5]
    for a, b in runs:  # the loop closes the turn itself: <|im_end|> "\n", both mask 0, log-prob 0
        assert traj.token_ids[b] == tok.im_end_id and traj.loss_mask[b] == 0 and traj.sampler_logprobs[b] == 0
        np.testing.assert_allclose(traj.sampler_logprobs[a:b], -1.0)
    assert traj.policy_version == 2 and pol.released == ["g/" + tasks[1].id + "/0"]


def test_policy_failures_end_the_episode_with_error(sim_env, tasks, qwen_renderer):
    tok = qwen_renderer.tokenizer
    search = text_turn(qwen_renderer, '<tool_call>\n{"name": "image_search", "arguments": {"query": "kit"}}\n'
                                      '</tool_call>')
    cases = {
        "policy failed: ConnectionError: server went away": ConnectionError("server went away"),
        "generation aborted: weights updated": policy.Generation(token_ids=[], logprobs=[], finish_reason="abort",
                                                                 info={"abort_message": "weights updated"}),
        "policy emitted vision token id": policy.Generation(token_ids=[tok.encode("a")[0], tok.image_pad_id],
                                                            logprobs=[0.0, 0.0], finish_reason="stop"),
        "more than max_new_tokens=512": policy.Generation(token_ids=np.ones(513, int), logprobs=np.zeros(513),
                                                          finish_reason="length"),
    }
    for message, failure in cases.items():
        traj = run(sim_env, ScriptedGenerations([search, failure]), tasks[2], qwen_renderer)
        assert traj.termination == core.ERROR and message in traj.metadata["error"], traj.metadata["error"]
        # the first turn is kept whole; the sequence ends after its observation (no dangling generation prompt)
        assert len(mask_runs(traj.loss_mask)) == 1 and len(traj.messages) == 4
        assert traj.token_ids[-2:].tolist() == [tok.im_end_id, tok.encode("\n")[0]]
        np.testing.assert_allclose(traj.sampler_logprobs[traj.loss_mask == 1], -0.5)
        assert len(traj.images) == len([p for p in traj.messages[3]["content"] if p.get("type") == "image"]) > 0
        assert traj.policy_version == 7


def test_episode_config_and_sequence_errors(qwen_renderer):
    with pytest.raises(ValueError, match="max_context_tokens must be a positive int; got 0"):
        episode.EpisodeConfig(max_context_tokens=0)
    seq = sequence.TokenSequence(image_pad_id=qwen_renderer.tokenizer.image_pad_id, merge_size=2)
    image = sequence.prepare_image(Image.new("RGB", (100, 64)), VISION, img_id="IMG_001")
    segment = qwen_renderer.render_user("x", images_grid_thw=[image.grid_thw])
    with pytest.raises(ValueError, match="segment has 1 image slots but 0 images were given"):
        seq.append(segment)
    other = sequence.prepare_image(Image.new("RGB", (200, 64)), VISION, img_id="IMG_002")
    with pytest.raises(ValueError, match=r"image IMG_002: slot of \d+ pads for grid"):
        seq.append(segment, [other])
    with pytest.raises(ValueError, match="generated ids hold <|image_pad|>"):
        seq.append_generated(np.array([1, qwen_renderer.tokenizer.image_pad_id]), np.zeros(2))
    with pytest.raises(ValueError, match="2 generated ids but 1 log-probs"):
        seq.append_generated(np.array([1, 2]), np.zeros(1))
    with pytest.raises(ValueError, match="loss mask 0 everywhere"):
        seq.append(qwen_renderer.assistant_generated([1, 2]))
    seq.append(segment, [image])
    arrays = seq.arrays()
    traj = trajectory_lib.Trajectory(task_id="t", group_id="g", sample_index=0, policy_version=0, **arrays,
                                     images=tuple(seq.images), image_pad_id=qwen_renderer.tokenizer.image_pad_id)
    assert traj.images[0].token_index == segment.image_spans[0][0]


class StripBackend:
    """A backend whose one image search hit is a 1000x4 strip (aspect ratio 250: the processor refuses it)."""

    def __init__(self):
        buffer = io.BytesIO()
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (4, 1000, 3), dtype=np.uint8)).save(buffer, "PNG")
        self.png = buffer.getvalue()

    async def text_search(self, query, *, top_k, tbs=None):
        return []

    async def image_search(self, query, *, top_k, tbs=None):
        return [base.ImageHit(title="strip", image_url="https://img.example.com/strip.png")]

    async def fetch_page(self, url):
        raise base.BackendError(f"HTTP 404 from {url}")

    async def fetch_image(self, url, *, page_url=None):
        return base.FetchedImage(url=url, data=self.png, content_type="image/png", page_url=page_url)

    async def aclose(self):
        pass


def test_an_observation_the_processor_refuses_ends_with_error(qwen_renderer):
    search = text_turn(qwen_renderer, '<tool_call>\n{"name": "image_search", "arguments": {"query": "strip"}}\n'
                                      '</tool_call>')
    with tool_env.ToolEnv(StripBackend(), config_lib.EnvConfig()) as strip_env:
        traj = run(strip_env, ScriptedGenerations([search]), core.Task("s", "Draw the strip"), qwen_renderer)
    assert traj.termination == core.ERROR and "aspect ratio" in traj.metadata["error"]
    assert "IMG_001" in traj.metadata["error"] and traj.images == () and len(traj.messages) == 3


def test_decision_sampling_needs_a_backend_that_reports_its_draws(sim_env, tasks, qwen_renderer):
    tok = qwen_renderer.tokenizer
    ids = tok.encode("<think>I will search the")[:5]
    draws = episode.EpisodeConfig(max_new_tokens=512, max_context_tokens=20_000, vision=VISION,
                                  sampling=policy.SamplingParams(temperature=1.0, draw_below=0.5))
    drawn = policy.Generation(token_ids=ids, logprobs=np.full(5, -1.0), finish_reason="length",
                              drawn=[False, True, False, False, True])
    traj = run(sim_env, ScriptedGenerations([drawn, drawn]), tasks[1], qwen_renderer, config=draws)
    assert [b - a for a, b in mask_runs(traj.loss_mask)] == [1, 1, 1, 1]  # the drawn ids of both turns
    np.testing.assert_allclose(np.asarray(traj.sampler_logprobs)[np.asarray(traj.loss_mask) == 1], -1.0)
    silent = policy.Generation(token_ids=ids, logprobs=np.full(5, -1.0), finish_reason="length")
    with pytest.raises(ValueError, match="needs a policy backend that reports which ids it drew"):
        run(sim_env, ScriptedGenerations([silent]), tasks[1], qwen_renderer, config=draws)
