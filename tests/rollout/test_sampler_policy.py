"""The tiny random policy end to end: the in-process JAX sampler, and the same sampler behind a loopback server
speaking SGLang's native API (which tests our SGLang wire path, not SGLang itself)."""

import asyncio
import dataclasses

import numpy as np
import pytest
from scipy.special import log_softmax
from support.sglang_server import SGLangSamplerServer

from ranger_jax.clients import sglang
from ranger_jax.data import viewer
from ranger_jax.env import core
from ranger_jax.models import qwen3_vl
from ranger_jax.rollout import actor, episode, policy, runner, sampler_policy, scoring, sglang_policy

ROWS = 2
CAPACITY = 2048


def mask_runs(mask):
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return list(zip(edges[::2], edges[1::2]))


@pytest.fixture(scope="module")
def scorer(tiny_env, the_world):
    return scoring.make_scorer(tiny_env, world=the_world, generate_images=False)


@pytest.fixture(scope="module")
def random_groups(tiny_env, tiny_sampler, tiny_renderer, tiny_config, tasks, scorer):
    pol = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=ROWS, capacity=CAPACITY)
    config = runner.RolloutConfig(group_size=2, concurrency=ROWS, seed=5, run_id="tiny", episode=tiny_config())
    groups = runner.run(tiny_env, pol, tasks[:2], renderer=tiny_renderer, config=config, scorer=scorer)
    return pol, groups


def test_tiny_random_policy_gives_valid_trajectories_with_named_terminations(random_groups, tiny_renderer):
    pol, groups = random_groups
    tok = tiny_renderer.tokenizer
    trajectories = [t for g in groups for t in g.trajectories]
    assert len(groups) == 2 and len(trajectories) == 4
    for traj in trajectories:
        assert traj.termination in core.TERMINATIONS and traj.termination != core.ANSWER
        assert traj.metadata["token_exact"] and traj.metadata["rl_trainable"]
        assert traj.num_tokens <= 2048 and traj.reward == 0.0 and traj.reward_breakdown["zero_reason"]
        runs = mask_runs(traj.loss_mask)
        assert len(runs) == len(traj.metadata["turns"]) >= 1
        generated = traj.loss_mask == 1
        assert (traj.sampler_logprobs[generated] < 0).all() and not traj.sampler_logprobs[~generated].any()
        for a, b in runs:  # each turn is closed: by its own <|im_end|> (mask 1) or the loop's (mask 0)
            assert tok.im_end_id in (traj.token_ids[b - 1], traj.token_ids[b])
    samples = groups[0].trajectories
    assert samples[0].metadata["seed"] != samples[1].metadata["seed"]
    assert not np.array_equal(samples[0].token_ids, samples[1].token_ids)
    said = [m["content"] for t in trajectories for m in t.messages if m["role"] == "user"][2:]
    assert any("Invalid format" in text or "RESPONSE TOO LONG" in text for text in said)
    batch_sizes = {turn["policy"]["batch_size"] for t in trajectories for turn in t.metadata["turns"]}
    assert 2 in batch_sizes  # turns of different episodes ran as one sampler call
    assert pol.num_batches < sum(len(t.metadata["turns"]) for t in trajectories)
    page = viewer.render_html(trajectories)  # no images, no answer, no generation: the page still says so
    assert page.count("(no generation)") == page.count("(no answer)") == 4 and "data:image/png" not in page
    assert page.count("zero: ") == 4


def test_recorded_logprobs_are_the_models_on_the_recorded_tokens(random_groups, tiny_checkpoint):
    """Token-exact: a full forward pass over the recorded sequence reproduces every sampled log-prob."""
    _, groups = random_groups
    traj = max((t for g in groups for t in g.trajectories), key=lambda t: len(t.metadata["turns"]))
    model = qwen3_vl.load(tiny_checkpoint)
    length = 2048
    ids = np.zeros((1, length), np.int32)
    ids[0, :traj.num_tokens] = traj.token_ids
    mask = (np.arange(length) < traj.num_tokens)[None].astype(np.int32)
    logits = np.asarray(model(ids, attention_mask=mask))[0]
    logprobs = log_softmax(logits.astype(np.float64), axis=-1)
    positions = np.flatnonzero(traj.loss_mask)
    expected = logprobs[positions - 1, traj.token_ids[positions]]  # temperature 1: log_softmax(logits)
    np.testing.assert_allclose(traj.sampler_logprobs[positions], expected, atol=1e-4)


def test_trajectories_survive_the_sglang_wire_path(
        tiny_env, tiny_sampler, tiny_renderer, tiny_config, tiny_checkpoint, tasks, scorer):
    """Whole episodes through `SGLangPolicy` and HTTP equal the in-process ones, with our sampler on both sides."""
    config = runner.RolloutConfig(group_size=2, concurrency=1, seed=9, run_id="same", episode=tiny_config())
    local = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=ROWS, capacity=CAPACITY)
    ours = runner.run(tiny_env, local, tasks[2:3], renderer=tiny_renderer, config=config, scorer=scorer)
    with SGLangSamplerServer(tiny_checkpoint, sampler=tiny_sampler, num_rows=ROWS, capacity=CAPACITY,
                             min_pixels=1024, max_pixels=16_384, deterministic_inference=True) as server:
        remote = sglang_policy.SGLangPolicy(sglang.SGLangClient(server.url),
                                            image_pad_id=tiny_renderer.tokenizer.image_pad_id)
        theirs = runner.run(tiny_env, remote, tasks[2:3], renderer=tiny_renderer, config=config, scorer=scorer)
        assert server.num_generate == sum(len(t.metadata["turns"]) for t in theirs[0].trajectories)
    for a, b in zip(ours[0].trajectories, theirs[0].trajectories, strict=True):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
        np.testing.assert_array_equal(a.sampler_logprobs, b.sampler_logprobs)
        assert (a.termination, a.messages, a.policy_version) == (b.termination, b.messages, b.policy_version)
        assert a.metadata["policy"] == "jax" and b.metadata["policy"] == "sglang"
        cached = [turn["policy"]["cached_tokens"] for turn in b.metadata["turns"]]
        assert cached[0] == 0 and all(c > 0 for c in cached[1:])  # later turns reuse the server's cached prefix


def test_rows_wait_free_and_weights_update(tiny_sampler, tiny_renderer, tiny_checkpoint, tmp_path):
    """More episodes than rows wait for a released row; new weights stamp later turns with their version."""
    tok = tiny_renderer.tokenizer
    pol = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=ROWS, capacity=CAPACITY)

    def request(rid, offset):
        ids = (tiny_renderer.render_user(f"task {offset}") + tiny_renderer.generation_prompt()).ids
        return policy.TurnRequest(rid=rid, turn=0, prompt_ids=ids, new_images=(), max_new_tokens=4,
                                  sampling=policy.SamplingParams(temperature=0.0), stop_token_ids=(tok.im_end_id,),
                                  seed=offset, state=None)

    async def scenario():
        first = await asyncio.gather(pol.generate(request("a", 1)), pol.generate(request("b", 2)))
        waiting = asyncio.ensure_future(pol.generate(request("c", 3)))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # both rows are held by a and b
        await pol.release("a")
        third = await asyncio.wait_for(waiting, timeout=60)
        await pol.release("b")
        await pol.release("c")
        return first, third

    (a, b), c = asyncio.run(scenario())
    assert a.info["batch_size"] == 2 and c.info["batch_size"] == 1
    assert (a.policy_version, c.policy_version) == (0, 0)
    other = qwen3_vl.load(actor.write_tiny_checkpoint(tmp_path / "v3", tiny_checkpoint, seed=8))
    try:
        pol.update_weights(other, policy_version=3)
        again = asyncio.run(pol.generate(request("a2", 1)))
    finally:
        tiny_sampler.update_weights(qwen3_vl.load(tiny_checkpoint))
    assert again.policy_version == 3 and not np.array_equal(again.logprobs, a.logprobs)


def test_batches_wait_for_stragglers_and_survive_new_event_loops(tiny_sampler, tiny_renderer):
    """A turn that arrives a moment late joins the batch instead of waiting a whole call; the policy (its rows,
    queue and asyncio primitives) keeps working when reused from another event loop, rows contended."""
    tok = tiny_renderer.tokenizer

    def request(rid, turn, ids):
        return policy.TurnRequest(rid=rid, turn=turn, prompt_ids=np.asarray(ids, np.int32), new_images=(),
                                  max_new_tokens=3, sampling=policy.SamplingParams(temperature=0.0),
                                  stop_token_ids=(tok.im_end_id,), seed=turn, state=None)

    def follow_up(ids, generated):
        closing = [] if generated.token_ids[-1] == tok.im_end_id else [tok.im_end_id]
        tail = tiny_renderer.render_user("go on") + tiny_renderer.generation_prompt()
        return np.concatenate([ids, generated.token_ids, closing, tiny_renderer.assistant_suffix().ids, tail.ids])

    async def two_turns(pol, late_s):
        starts = {rid: (tiny_renderer.render_user(f"task {rid}") + tiny_renderer.generation_prompt()).ids
                  for rid in ("a", "b")}
        first = dict(zip("ab", await asyncio.gather(*[pol.generate(request(r, 0, ids)) for r, ids in starts.items()])))

        async def second(rid, delay):
            await asyncio.sleep(delay)  # e.g. a slower tool call or image preparation
            return await pol.generate(request(rid, 1, follow_up(starts[rid], first[rid])))

        before = pol.num_batches
        out = await asyncio.gather(second("a", 0.0), second("b", late_s))
        for rid in "ab":
            await pol.release(rid)
        return [g.info["batch_size"] for g in out], pol.num_batches - before

    waiting = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=ROWS, capacity=CAPACITY, batch_wait_s=5.0)
    assert asyncio.run(two_turns(waiting, 0.05)) == ([2, 2], 1)
    eager = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=ROWS, capacity=CAPACITY, batch_wait_s=0.0)
    assert asyncio.run(two_turns(eager, 0.05)) == ([1, 1], 2)

    async def contended():  # three episodes on two rows: one waits for a release
        async def one(rid):
            ids = (tiny_renderer.render_user(f"task {rid}") + tiny_renderer.generation_prompt()).ids
            generated = await waiting.generate(request(rid, 0, ids))
            await waiting.release(rid)
            return generated.token_ids.tolist()
        return await asyncio.wait_for(asyncio.gather(*[one(rid) for rid in "xyz"]), timeout=120)

    assert asyncio.run(contended()) == asyncio.run(contended())  # a second loop: no "bound to a different loop"
    with pytest.raises(ValueError, match="batch_wait_s must be >= 0; got -1"):
        sampler_policy.SamplerPolicy(tiny_sampler, num_rows=1, batch_wait_s=-1)


def test_a_group_shares_its_greedy_turns_before_its_branching_turn(tiny_env, tiny_sampler, tiny_renderer, tiny_config,
                                                                   tasks, scorer):
    pol = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=3, capacity=CAPACITY)
    config = runner.RolloutConfig(group_size=3, concurrency=3, seed=11, run_id="branch", episode=tiny_config(),
                                  branch_turns=(1,))
    (group,) = runner.run(tiny_env, pol, tasks[:1], renderer=tiny_renderer, config=config, scorer=scorer)
    firsts = []
    for t in group.trajectories:
        turns = t.metadata["turns"]
        assert t.metadata["sample_from_turn"] == 1
        assert [turn["sampled"] for turn in turns] == [False] + [True] * (len(turns) - 1)
        mask = np.asarray(t.loss_mask)
        # turn 0 is context: not trained, no log-probs; the sampled turns are trained, with their log-probs
        assert int(mask.sum()) == sum(turn["new_tokens"] for turn in turns[1:])
        assert not np.any(np.asarray(t.sampler_logprobs)[mask == 0])
        first_trained = int(np.flatnonzero(mask)[0]) if mask.any() else len(mask)
        firsts.append(np.asarray(t.token_ids)[:first_trained])
    # the greedy first turn (and the observation after it) is the same in every sample of the group
    shortest = min(len(f) for f in firsts)
    assert shortest > 0 and all(np.array_equal(f[:shortest], firsts[0][:shortest]) for f in firsts)
    assert len({tuple(np.asarray(t.token_ids)) for t in group.trajectories}) > 1  # the samples differ after it


def test_forked_rows_give_the_episodes_of_independent_samples(tiny_env, tiny_sampler, tiny_renderer, tiny_config,
                                                              tasks, scorer):
    """With `share_trunk` a group's greedy turns run once and its samples fork the KV row: the trajectories (ids,
    masks, log-probs, rewards) are those of samples that each played every turn, in fewer sampler rows."""
    sampling = policy.SamplingParams(temperature=1.0, draw_below=0.9, max_draws=2)
    runs = {}
    for share, prefill in ((False, True), (True, True), (True, False)):
        pol = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=4, capacity=CAPACITY)
        appended = []
        real_append = pol.sampler.append
        pol.sampler.append = lambda session, segments: (
            appended.append(sum(len(s.token_ids) for s in segments if s is not None)),
            real_append(session, segments))[1]
        try:
            config = runner.RolloutConfig(group_size=3, concurrency=4, seed=8, run_id="fork", branch_turns=(1, 2),
                                          sample_turns=1, share_trunk=share, prefill_trunk=prefill,
                                          episode=dataclasses.replace(tiny_config(), sampling=sampling))
            groups = runner.run(tiny_env, pol, tasks[:3], renderer=tiny_renderer, config=config, scorer=scorer)
        finally:
            del pol.sampler.append
        runs[share, prefill] = sorted(groups, key=lambda g: g.group_id), pol, sum(appended)
    alone, _, appended_alone = runs[False, True]
    for key in ((True, True), (True, False)):
        shared, pol, _ = runs[key]
        assert not pol._rows and sorted(pol._free) == [0, 1, 2, 3]  # every row back
        forked = 0
        for a, b in zip(alone, shared, strict=True):
            for x, y in zip(a.trajectories, b.trajectories, strict=True):
                np.testing.assert_array_equal(x.token_ids, y.token_ids)
                np.testing.assert_array_equal(x.loss_mask, y.loss_mask)
                np.testing.assert_allclose(x.sampler_logprobs, y.sampler_logprobs, atol=1e-5)
                assert (x.reward, x.termination) == (y.reward, y.termination)
                forked += y.metadata["forked_from"] is not None
        assert forked > 0
    # with `prefill_trunk` the trunk's last observation goes into the sampler once a group, not once a fork
    assert runs[True, True][2] < runs[True, False][2] < appended_alone


def test_prefill_appends_a_turns_prompt_that_its_generate_then_continues(tiny_sampler):
    """`prefill` puts the turn's prompt in the row without generating (a fork then copies it): the turn's generate
    appends nothing and gives what a plain generate gives, in the forked row too."""
    prompt = np.arange(20, 40, dtype=np.int32)

    def request(rid, ids=prompt):
        return policy.TurnRequest(rid=rid, turn=0, prompt_ids=ids, new_images=(), sampling=episode.GREEDY,
                                  max_new_tokens=6, stop_token_ids=(), seed=1, state=None)

    async def go():
        plain = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=2, capacity=CAPACITY)
        expected = await plain.generate(request("a/0"))
        await plain.release("a/0")
        pol = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=2, capacity=CAPACITY)
        await pol.prefill(request("b/0"))
        assert pol.session.token_ids[pol._rows["b/0"]] == prompt.tolist()
        await pol.fork("b/0", ["b/1"])
        segments = []
        real_append = pol.sampler.append
        pol.sampler.append = lambda session, segs: (segments.extend(s for s in segs if s is not None),
                                                    real_append(session, segs))[1]
        try:
            for rid in ("b/0", "b/1"):
                gen = await pol.generate(request(rid))
                np.testing.assert_array_equal(gen.token_ids, expected.token_ids)
                np.testing.assert_allclose(gen.logprobs, expected.logprobs, atol=1e-5)
        finally:
            del pol.sampler.append
        assert segments == []
        with pytest.raises(ValueError, match="episode b/0: the sampler row holds 26 tokens that are not a prefix"):
            await pol.prefill(request("b/0", np.arange(50, 80, dtype=np.int32)))
        for rid in ("b/0", "b/1"):
            await pol.release(rid)
        assert sorted(pol._free) == [0, 1]

    asyncio.run(go())


def test_fork_errors_name_the_episode(tiny_sampler):
    pol = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=2, capacity=CAPACITY)

    async def go():
        with pytest.raises(ValueError, match="episode g/0 holds no sampler row to fork"):
            await pol.fork("g/0", ["g/1"])
        request = policy.TurnRequest(rid="g/0", turn=0, prompt_ids=np.arange(20, 30, dtype=np.int32),
                                     new_images=(), sampling=episode.GREEDY, max_new_tokens=3, stop_token_ids=(),
                                     seed=1, state=None)
        await pol.generate(request)
        with pytest.raises(ValueError, match=r"cannot fork episode g/0 into \['g/0'\]"):
            await pol.fork("g/0", ["g/0"])
        await pol.fork("g/0", ["g/1"])
        assert pol.session.token_ids[pol._rows["g/1"]] == pol.session.token_ids[pol._rows["g/0"]]
        for rid in ("g/0", "g/1"):
            await pol.release(rid)

    asyncio.run(go())


def test_sample_turns_samples_only_that_many_turns_from_the_branch(tiny_env, tiny_sampler, tiny_renderer, tiny_config,
                                                                    tasks, scorer):
    pol = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=3, capacity=CAPACITY)
    config = runner.RolloutConfig(group_size=3, concurrency=3, seed=12, run_id="span", episode=tiny_config(),
                                  branch_turns=(1,), sample_turns=1)
    (group,) = runner.run(tiny_env, pol, tasks[:1], renderer=tiny_renderer, config=config, scorer=scorer)
    for t in group.trajectories:
        turns = t.metadata["turns"]
        assert t.metadata["sample_turns"] == 1
        assert [turn["sampled"] for turn in turns] == [i == 1 for i in range(len(turns))]
        mask = np.asarray(t.loss_mask)
        # only turn 1's tokens are trained; the greedy turns after it are context like the one before it
        assert int(mask.sum()) == (turns[1]["new_tokens"] if len(turns) > 1 else 0)
        assert not np.any(np.asarray(t.sampler_logprobs)[mask == 0])
    spec = episode.EpisodeSpec(task=tasks[0], group_id="g", sample_index=0, seed=1, sample_from_turn=2,
                               sample_turns=2)
    assert [spec.samples_turn(turn) for turn in range(6)] == [False, False, True, True, False, False]
    assert all(dataclasses.replace(spec, sample_turns=None).samples_turn(turn) for turn in range(2, 9))


def test_a_greedy_member_plays_its_sampled_turn_greedily_and_trains_it(tiny_env, tiny_sampler, tiny_renderer,
                                                                        tiny_config, tasks, scorer):
    def group(seed, *, greedy_member=True, sampling=None):
        pol = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=3, capacity=CAPACITY)
        episode_config = tiny_config() if sampling is None else dataclasses.replace(tiny_config(), sampling=sampling)
        config = runner.RolloutConfig(group_size=3, concurrency=3, seed=seed, run_id="mode", episode=episode_config,
                                      branch_turns=(1,), sample_turns=1, greedy_member=greedy_member)
        (out,) = runner.run(tiny_env, pol, tasks[:1], renderer=tiny_renderer, config=config, scorer=scorer)
        return out.trajectories

    first, second = group(21), group(22)
    all_greedy = group(21, greedy_member=False, sampling=episode.GREEDY)
    assert [t.metadata["greedy_member"] for t in first] == [True, False, False]
    # the greedy member is the greedy episode, whatever the group's seed; the others are samples
    np.testing.assert_array_equal(first[0].token_ids, all_greedy[0].token_ids)
    np.testing.assert_array_equal(second[0].token_ids, all_greedy[0].token_ids)
    assert any(not np.array_equal(t.token_ids, first[0].token_ids) for t in first[1:] + second[1:])
    turns, mask = first[0].metadata["turns"], np.asarray(first[0].loss_mask)
    assert [turn["sampled"] for turn in turns] == [i == 1 for i in range(len(turns))]
    # its branching turn is trained like a sample's, with the sampler's log-probs of the greedy tokens
    assert len(turns) > 1 and int(mask.sum()) == turns[1]["new_tokens"] > 0
    assert np.all(np.asarray(first[0].sampler_logprobs)[mask == 1] <= 0)
    assert np.any(np.asarray(first[0].sampler_logprobs)[mask == 1] < 0)
    with pytest.raises(ValueError, match="greedy_member needs group_size >= 2"):
        runner.RolloutConfig(group_size=1, greedy_member=True)
    with pytest.raises(ValueError, match="greedy_member must be a bool"):
        runner.RolloutConfig(group_size=2, greedy_member=1)


def test_decision_sampling_trains_only_the_drawn_tokens(tiny_env, tiny_sampler, tiny_renderer, tiny_config, tasks,
                                                        scorer):
    sampling = policy.SamplingParams(temperature=1.0, top_p=1.0, draw_below=0.9, max_draws=2)
    pol = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=3, capacity=CAPACITY)
    config = runner.RolloutConfig(group_size=3, concurrency=3, seed=13, run_id="draws", branch_turns=(1,),
                                  sample_turns=1, episode=dataclasses.replace(tiny_config(), sampling=sampling))
    (group,) = runner.run(tiny_env, pol, tasks[:1], renderer=tiny_renderer, config=config, scorer=scorer)
    greedy_pol = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=1, capacity=CAPACITY)
    greedy_config = runner.RolloutConfig(group_size=1, concurrency=1, seed=13, run_id="draws",
                                         episode=dataclasses.replace(tiny_config(), sampling=episode.GREEDY))
    (greedy,) = runner.run(tiny_env, greedy_pol, tasks[:1], renderer=tiny_renderer, config=greedy_config,
                           scorer=scorer)
    for t in group.trajectories:
        turns, mask = t.metadata["turns"], np.asarray(t.loss_mask)
        assert len(turns) > 1 and turns[1]["sampled"]
        # the random policy is unsure everywhere: its first two tokens of turn 1 are drawn, trained, with log-probs
        start = int(np.flatnonzero(mask)[0])
        assert mask_runs(mask) == [(start, start + 2)]
        assert np.all(np.asarray(t.sampler_logprobs)[mask == 1] < 0)
        assert not np.any(np.asarray(t.sampler_logprobs)[mask == 0])
        # before the branch the episode is the greedy one, token for token
        np.testing.assert_array_equal(np.asarray(t.token_ids)[:start],
                                      np.asarray(greedy.trajectories[0].token_ids)[:start])
    # a greedy member takes the argmax where the samples draw, and trains those positions (where it is unsure)
    greedy_member_config = dataclasses.replace(config, greedy_member=True)
    (with_greedy,) = runner.run(tiny_env, sampler_policy.SamplerPolicy(tiny_sampler, num_rows=3, capacity=CAPACITY),
                                tasks[:1], renderer=tiny_renderer, config=greedy_member_config, scorer=scorer)
    mode = with_greedy.trajectories[0]
    assert [t.metadata["greedy_member"] for t in with_greedy.trajectories] == [True, False, False]
    np.testing.assert_array_equal(mode.token_ids, greedy.trajectories[0].token_ids)
    mask = np.asarray(mode.loss_mask)
    start = int(np.flatnonzero(mask)[0])
    assert mask_runs(mask) == [(start, start + 2)] and start == int(np.flatnonzero(group.trajectories[0].loss_mask)[0])
    assert np.all(np.asarray(mode.sampler_logprobs)[mask == 1] < 0)  # tempered log-probs of the tokens it took
    assert episode.turn_sampling(sampling, sampled=True, greedy_member=True) == dataclasses.replace(sampling, top_k=1)
    assert episode.turn_sampling(sampling, sampled=False, greedy_member=False) == episode.GREEDY
    assert episode.turn_sampling(tiny_config().sampling, sampled=True, greedy_member=True) == episode.GREEDY
    with pytest.raises(ValueError, match="need the JAX sampler"):
        sglang_policy.sampling_params(policy.TurnRequest(
            rid="r", turn=0, prompt_ids=np.zeros(3, np.int32), new_images=(), sampling=sampling, max_new_tokens=4,
            stop_token_ids=(1,), seed=0, state=None))
    with pytest.raises(ValueError, match="2 token_ids but 3 drawn flags"):
        policy.Generation(token_ids=[1, 2], logprobs=[0.0, 0.0], finish_reason="stop", drawn=[True, False, True])
    with pytest.raises(ValueError, match="draw_below must be in"):
        policy.SamplingParams(draw_below=0)
    with pytest.raises(ValueError, match="max_draws must be an int >= 0"):
        policy.SamplingParams(max_draws=-1)
    assert not policy.SamplingParams(temperature=0.0, max_draws=2).limits_draws  # greedy turns draw nothing
    assert sampling.limits_draws and not policy.SamplingParams().limits_draws


@pytest.mark.parametrize("chunk_tokens, sampling", [
    (1, policy.SamplingParams(temperature=1.0, draw_below=0.9, max_draws=2)),  # draws spent across calls
    (5, policy.SamplingParams(temperature=0.8, top_k=20)),
])
def test_turns_decoded_in_chunks_equal_whole_turns(tiny_env, tiny_sampler, tiny_renderer, tiny_config, tasks, scorer,
                                                   chunk_tokens, sampling):
    """Continuous batching is exact: a turn decoded a few tokens per call, sharing calls with other episodes' turns,
    has the tokens, log-probabilities and draws of the same turn decoded in one call."""
    config = runner.RolloutConfig(group_size=3, concurrency=3, seed=21, run_id="chunks", branch_turns=(0,),
                                  episode=dataclasses.replace(tiny_config(), sampling=sampling))
    runs = {}
    for chunk in (None, chunk_tokens):
        pol = sampler_policy.SamplerPolicy(tiny_sampler, num_rows=3, capacity=CAPACITY, chunk_tokens=chunk)
        (group,) = runner.run(tiny_env, pol, tasks[1:2], renderer=tiny_renderer, config=config, scorer=scorer)
        runs[chunk] = group.trajectories, pol.num_batches
    (whole, whole_calls), (chunked, chunked_calls) = runs[None], runs[chunk_tokens]
    assert chunked_calls > whole_calls
    for a, b in zip(whole, chunked, strict=True):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
        np.testing.assert_allclose(a.sampler_logprobs, b.sampler_logprobs, atol=1e-6)
        assert [t["finish_reason"] for t in a.metadata["turns"]] == [t["finish_reason"] for t in b.metadata["turns"]]
    if sampling.limits_draws:  # two drawn tokens a sampled turn, the first two (the random policy is unsure)
        assert all(int(np.sum(b.loss_mask)) == 2 * len(b.metadata["turns"]) for b in chunked)
    with pytest.raises(ValueError, match="chunk_tokens must be None or an int >= 1; got 0"):
        sampler_policy.SamplerPolicy(tiny_sampler, num_rows=1, chunk_tokens=0)
