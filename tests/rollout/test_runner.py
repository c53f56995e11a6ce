"""Many episodes in flight, GRPO groups, and the live reward flow (loopback images API + judge) on trajectories."""

import asyncio
import base64
import io
import json

import pytest
from PIL import Image
from support.loopback import LoopbackServer, Reply

from ranger_jax import env
from ranger_jax.data import viewer
from ranger_jax.env import core
from ranger_jax.env.sim import savanna
from ranger_jax.rewards import combine, kscore, live, text_reward
from ranger_jax.rollout import episode, policy, runner, scoring, sequence

CONFIG = episode.EpisodeConfig(max_new_tokens=512, max_context_tokens=20_000,
                               vision=sequence.VisionSettings(min_pixels=4096, max_pixels=40_000))


class PacedExpert:
    """The expert, slowed per sample so episodes finish out of order; logs starts and episodes in flight."""

    name, token_exact, has_logprobs = "paced", True, False

    def __init__(self, inner):
        self.inner, self.started, self.active, self.max_active = inner, [], set(), 0

    async def generate(self, request):
        if request.turn == 0:
            self.started.append(request.rid)
            self.active.add(request.rid)
            self.max_active = max(self.max_active, len(self.active))
        await asyncio.sleep(0.002 * (3 - int(request.rid.rsplit("/", 1)[1])))
        return await self.inner.generate(request)

    async def release(self, rid):
        self.active.discard(rid)

    async def aclose(self):
        pass


def test_groups_are_emitted_complete_as_soon_as_they_finish(sim_env, tasks, the_world, qwen_renderer):
    pol = PacedExpert(policy.ScriptedPolicy(savanna.make_policy("expert", the_world), qwen_renderer.tokenizer))
    config = runner.RolloutConfig(group_size=3, concurrency=2, seed=1, run_id="step7", episode=CONFIG)

    async def collect():
        seen = []
        async for group in runner.agroups(sim_env, pol, tasks[:3], renderer=qwen_renderer, config=config):
            seen.append((group, len(pol.started)))
        return seen

    seen = asyncio.run(collect())
    assert pol.max_active == 2 and len(pol.started) == 9
    assert seen[0][1] < 9  # the first group came out while later episodes had not started yet
    ids = [group.group_id for group, _ in seen]
    assert sorted(ids) == [f"step7/{i:06d}/{t.id}" for i, t in enumerate(tasks[:3])]
    for group, _ in seen:
        assert [t.sample_index for t in group.trajectories] == [0, 1, 2]
        assert {t.group_id for t in group.trajectories} == {group.group_id}
        assert {t.task_id for t in group.trajectories} == {group.task_id}
        assert len({t.metadata["seed"] for t in group.trajectories}) == 3
        assert group.rewards.shape == (3,) and group.rewards.dtype.name == "float32"
    again = runner.run(sim_env, pol, tasks[:3], renderer=qwen_renderer, config=config)
    assert sorted(t.metadata["seed"] for g in again for t in g.trajectories) == \
        sorted(t.metadata["seed"] for g, _ in seen for t in g.trajectories)


class ForkingExpert:
    """The expert as a backend that can fork: counts its turns and the episodes it holds at once."""

    name, token_exact, has_logprobs = "forking", True, False

    def __init__(self, inner):
        self.inner, self.turns, self.live, self.max_live, self.forks = inner, [], set(), 0, []

    def _hold(self, *rids):
        self.live.update(rids)
        self.max_live = max(self.max_live, len(self.live))

    async def generate(self, request):
        self._hold(request.rid)
        self.turns.append((request.rid, request.turn))
        await asyncio.sleep(0.001 * (hash(request.rid) % 3))
        return await self.inner.generate(request)

    async def fork(self, rid, into):
        assert rid in self.live and not set(into) & self.live
        self.forks.append((rid, tuple(into)))
        self._hold(*into)

    async def release(self, rid):
        self.live.discard(rid)

    async def aclose(self):
        pass


class TwoMindedExpert(ForkingExpert):
    """The expert, whose sampled turns come out one of two ways by their seed: the expert's text, or the same call
    with a trailing newline (the env reads both alike, the tokens differ)."""

    name = "two-minded"

    async def generate(self, request):
        generation = await super().generate(request)
        if request.sampling.greedy or request.seed % 2 == 0:
            return generation
        text = self.inner.tokenizer.decode(generation.token_ids[:-1]) + "\n"
        return policy.text_generation(self.inner.tokenizer, text, max_new_tokens=request.max_new_tokens)


@pytest.mark.parametrize("branch", [1, 2])
def test_samples_repeating_a_sampled_turn_share_the_continuation(sim_env, tasks, the_world, qwen_renderer, branch):
    """`share_continuations`: samples whose sampled turn repeats an earlier sample's take over its continuation
    (`metadata["continued_from"]`): the same trajectories as samples that each played it, fewer turns played."""
    expert = policy.ScriptedPolicy(savanna.make_policy("expert", the_world), qwen_renderer.tokenizer)
    env_scorer = scoring.make_scorer(sim_env, generate_images=False)

    class CountingScorer:  # a scorer may keep a record of every episode (an evaluation's rows)
        def __init__(self):
            self.scored = 0

        async def ascore(self, env, state):
            self.scored += 1
            return await env_scorer.ascore(env, state)

    runs = {}
    for share in (False, True):
        pol = TwoMindedExpert(expert)
        config = runner.RolloutConfig(group_size=4, concurrency=8, seed=3, run_id="cont", episode=CONFIG,
                                      branch_turns=(branch,), sample_turns=1, share_continuations=share)
        scorer = CountingScorer()
        groups = sorted(runner.run(sim_env, pol, tasks[:5], renderer=qwen_renderer, config=config, scorer=scorer),
                        key=lambda g: g.group_id)
        runs[share] = groups, pol, scorer.scored
    (alone, alone_pol, alone_scored), (shared, shared_pol, shared_scored) = runs[False], runs[True]
    assert not shared_pol.live and shared_pol.max_live <= 8
    assert shared_scored == alone_scored > 0  # every episode scored as before, a follower too
    continued = 0
    for a, b in zip(alone, shared, strict=True):
        by_rid = {t.metadata["rid"]: t for t in b.trajectories}
        for x, y in zip(a.trajectories, b.trajectories, strict=True):
            assert x.token_ids.tolist() == y.token_ids.tolist() and x.loss_mask.tolist() == y.loss_mask.tolist()
            assert (x.reward, x.termination, x.answer, x.messages) == (y.reward, y.termination, y.answer, y.messages)
            assert len(x.images) == len(y.images) and x.metadata["rid"] == y.metadata["rid"]
            assert [t["turn"] for t in x.metadata["turns"]] == [t["turn"] for t in y.metadata["turns"]]
            assert x.metadata["continued_from"] is None
            lead = by_rid.get(y.metadata["continued_from"])
            if lead is not None:  # the first of the group to play these tokens, which played on itself
                continued += 1
                assert lead.token_ids.tolist() == y.token_ids.tolist() and lead.metadata["continued_from"] is None
        # one sample played on per distinct episode
        assert sum(t.metadata["continued_from"] is None for t in b.trajectories) == \
            len({t.token_ids.tobytes() for t in b.trajectories})
    assert continued > 0
    assert len(shared_pol.turns) == len(alone_pol.turns) - sum(
        len(t.metadata["turns"]) - branch - 1 for g in shared for t in g.trajectories if t.metadata["continued_from"])
    with pytest.raises(ValueError, match="share_continuations needs sample_turns"):
        runner.RolloutConfig(group_size=2, branch_turns=(1,), share_continuations=True)


@pytest.mark.parametrize("concurrency", [3, 4, 7])
def test_shared_trunks_play_greedy_turns_once_within_the_rows(sim_env, tasks, the_world, qwen_renderer, concurrency):
    """Groups branching after turn 0 play their greedy turns once and fork (`share_trunk`): the same episodes as
    independent samples, fewer turns, never more episodes held than `concurrency`, groups of every kind done."""
    expert = policy.ScriptedPolicy(savanna.make_policy("expert", the_world), qwen_renderer.tokenizer)
    runs = {}
    for share in (False, True):
        pol = ForkingExpert(expert)
        config = runner.RolloutConfig(group_size=3, concurrency=concurrency, seed=4, run_id="trunk", episode=CONFIG,
                                      branch_turns=(0, 1, 2, 9), share_trunk=share)
        assert runner.shares_trunks(config, pol) is share
        groups = sorted(runner.run(sim_env, pol, (list(tasks) * 3)[:10], renderer=qwen_renderer, config=config),
                        key=lambda g: g.group_id)
        runs[share] = groups, pol
    (alone, alone_pol), (shared, shared_pol) = runs[False], runs[True]
    assert shared_pol.max_live <= concurrency and not shared_pol.live and not alone_pol.forks
    assert [g.group_id for g in shared] == [g.group_id for g in alone] and len(shared) == 10
    branches = [g.trajectories[0].metadata["sample_from_turn"] for g in shared]
    assert {0, 1, 2, 9} <= set(branches)  # every kind of group: whole episodes, trunks, ended before branching
    for a, b, branch in zip(alone, shared, branches):
        for x, y in zip(a.trajectories, b.trajectories, strict=True):
            assert x.token_ids.tolist() == y.token_ids.tolist() and x.loss_mask.tolist() == y.loss_mask.tolist()
            assert (x.reward, x.termination, x.metadata["rid"]) == (y.reward, y.termination, y.metadata["rid"])
            assert x.metadata["forked_from"] is None
            trunk = branch > 0 and y.sample_index > 0
            assert y.metadata["forked_from"] == (b.trajectories[0].metadata["rid"] if trunk else None)
        turns = len(a.trajectories[0].metadata["turns"])
        played = sum(1 for rid, _ in shared_pol.turns if rid.startswith(b.group_id + "/"))
        assert played == (3 * turns if branch == 0 else min(branch, turns) + 3 * max(turns - branch, 0))
    assert sum(1 for branch in branches if 0 < branch < 4) == len(shared_pol.forks)
    # groups in flight: about 2·rows / (G + 1), never so many that waiting trunks could hold every row a fork needs
    assert [runner.max_shared_groups(rows, 4) for rows in (4, 5, 8, 16, 32)] == [1, 2, 3, 6, 12]
    assert runner.max_shared_groups(3, 3) == 1 and runner.max_shared_groups(64, 2) == 42


@pytest.mark.parametrize("share", [False, True])
def test_parts_of_a_run_play_exactly_its_groups(sim_env, tasks, the_world, qwen_renderer, share):
    """Runners with parts (i, n) (actor processes splitting a round) play between them the groups of one run: the
    same group ids, seeds, branching turns, tokens and rewards, each group once."""
    expert = policy.ScriptedPolicy(savanna.make_policy("expert", the_world), qwen_renderer.tokenizer)
    run_tasks = (list(tasks) * 3)[:10]

    def play(part):
        config = runner.RolloutConfig(group_size=3, concurrency=6, seed=7, run_id="split", episode=CONFIG,
                                      branch_turns=(0, 1, 2), share_trunk=share, part=part)
        return runner.run(sim_env, TwoMindedExpert(expert), run_tasks, renderer=qwen_renderer, config=config)

    whole = sorted(play((0, 1)), key=lambda g: g.group_id)
    parts = [play((i, 3)) for i in range(3)]
    assert [len(p) for p in parts] == [4, 3, 3]
    assert [int(g.group_id.split("/")[1]) % 3 for g in parts[1]] == [1] * 3
    split = sorted((g for p in parts for g in p), key=lambda g: g.group_id)
    assert [g.group_id for g in split] == [g.group_id for g in whole] and len(whole) == 10
    assert len({g.trajectories[0].metadata["sample_from_turn"] for g in whole}) == 3
    assert len({x.token_ids.tobytes() for g in whole for x in g.trajectories}) > 10  # seeds decide the samples
    for a, b in zip(whole, split):
        for x, y in zip(a.trajectories, b.trajectories, strict=True):
            assert x.token_ids.tolist() == y.token_ids.tolist() and x.loss_mask.tolist() == y.loss_mask.tolist()
            assert (x.reward, x.metadata["seed"], x.metadata["rid"], x.metadata["sample_from_turn"]) == (
                y.reward, y.metadata["seed"], y.metadata["rid"], y.metadata["sample_from_turn"])
    assert [k for k, _ in runner.indexed_tasks(runner.RolloutConfig(part=(2, 4)), "abcdefghij")] == [2, 6]
    assert runner.parse_part("1/2") == (1, 2) and runner.RolloutConfig(part=[0, 1]).part == (0, 1)
    for bad in ((2, 2), (-1, 2), (0, 0), (True, 2), (0,), "0/2", (0.0, 1)):
        with pytest.raises(ValueError, match=r"RolloutConfig.part must be a pair \(i, n\) with 0 <= i < n"):
            runner.RolloutConfig(part=bad)
    for bad in ("2", "2/2", "a/b", "1/2/3", "-1/2"):
        with pytest.raises(ValueError, match=f"a part must be I/N with ints 0 <= I < N .e.g. 0/2.; got '{bad}'"):
            runner.parse_part(bad)


def test_seeds_and_config_errors():
    seeds = {runner.episode_seed(0, g, k) for g in range(20) for k in range(6)}
    assert len(seeds) == 120 and runner.episode_seed(3, 1, 2) == runner.episode_seed(3, 1, 2)
    assert episode.turn_seed(7, 0) != episode.turn_seed(7, 1) and 0 <= episode.turn_seed(2**62, 9) < 2**31
    with pytest.raises(ValueError, match="group_size must be a positive int; got 0"):
        runner.RolloutConfig(group_size=0)
    with pytest.raises(ValueError, match="seed must be an int >= 0; got -1"):
        runner.RolloutConfig(seed=-1)
    with pytest.raises(ValueError, match="run_id must be non-empty without '/'; got 'a/b'"):
        runner.RolloutConfig(run_id="a/b")
    for bad in ((), (1, -1), (True,), (1.0,)):
        with pytest.raises(ValueError, match="branch_turns must be a non-empty tuple of ints >= 0"):
            runner.RolloutConfig(branch_turns=bad)
    # each group draws its branching turn from the choices, the same for the same (seed, group) and varied across
    config = runner.RolloutConfig(seed=4, branch_turns=[1, 2, 3])
    assert config.branch_turns == (1, 2, 3)
    drawn = [runner.branch_turn(config, g) for g in range(300)]
    assert drawn == [runner.branch_turn(config, g) for g in range(300)] and set(drawn) == {1, 2, 3}
    assert min(drawn.count(t) for t in (1, 2, 3)) > 60
    assert drawn != [runner.branch_turn(runner.RolloutConfig(seed=5, branch_turns=(1, 2, 3)), g) for g in range(300)]
    assert {runner.branch_turn(runner.RolloutConfig(seed=4), g) for g in range(10)} == {0}
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="sample_turns must be None or an int >= 1"):
            runner.RolloutConfig(sample_turns=bad)
    assert runner.RolloutConfig(sample_turns=2).sample_turns == 2
    with pytest.raises(ValueError, match="top_p must be in"):
        policy.SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="top_k must be a positive int or -1"):
        policy.SamplingParams(top_k=0)
    with pytest.raises(ValueError, match="finish_reason 'eos' is not one of"):
        policy.Generation(token_ids=[1], logprobs=[0.0], finish_reason="eos")
    with pytest.raises(ValueError, match="Generation has 2 token_ids but 1 logprobs"):
        policy.Generation(token_ids=[1, 2], logprobs=[0.0], finish_reason="stop")


def png_b64(colour=(200, 30, 30)):
    buffer = io.BytesIO()
    Image.new("RGB", (32, 24), colour).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


JUDGE = {"rationale": "ok", "faithfulness": 1, "visual_correctness": 0.5, "text_accuracy": 0, "aesthetics": 0.5,
         "text_accuracy_na": False, "score": 0.8}


@pytest.fixture(scope="module")
def services():
    with LoopbackServer() as server:
        server.route("POST", "/v1/chat/completions", lambda req: Reply.json({
            "id": "j", "object": "chat.completion", "created": 0, "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": json.dumps(JUDGE)},
                         "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                              "total_tokens": 2}}))
        server.route("POST", "/v1/images/edits", lambda req: Reply.json(
            {"id": "i", "created": 0, "data": [{"b64_json": png_b64(), "url": None}]}))
        yield server


@pytest.fixture(scope="module")
def judged_env(services, world_dir):
    """The offline world with the live reward: loopback images API and judge (the env's [rewards] options)."""
    judge = {"kind": "judge", "judge_url": services.url + "/v1", "judge_model": "judge",
             "generator_url": services.url}
    with env.make("savanna_sim", world=str(world_dir), **judge) as tool_env:
        yield tool_env


def test_live_reward_records_the_generated_image_or_its_failure(services, judged_env, tasks, the_world,
                                                                qwen_renderer):
    expert = policy.ScriptedPolicy(savanna.make_policy("expert", the_world), qwen_renderer.tokenizer)
    scorer = scoring.make_scorer(judged_env, generate_images=False)  # the reward generates its own image
    [group] = runner.run(judged_env, expert, tasks[:1], renderer=qwen_renderer, scorer=scorer,
                         config=runner.RolloutConfig(episode=CONFIG))
    traj = group.trajectories[0]
    assert traj.termination == core.ANSWER and traj.generation_error is None
    assert Image.open(io.BytesIO(traj.generated_image)).getpixel((0, 0)) == (200, 30, 30)
    overall = kscore.parse_judge_output(JUDGE).overall
    assert traj.reward == pytest.approx(0.5 * overall + 0.5 * text_reward.snap(0.8))
    assert traj.reward_breakdown["breakdown"]["kind"] == "judge"
    assert traj.reward_breakdown["breakdown"]["components"]["kscore"]["faithfulness"] == 1
    assert traj.metadata["generation_request"]["num_references"] == 1 and traj.timings["generation_s"] > 0
    edits = [r for r in services.requests if r.path == "/v1/images/edits"]
    assert len(edits) == 1

    services.fail_next("POST", "/v1/images/edits", Reply.json({"detail": "CUDA out of memory"}, status=400))
    [group] = runner.run(judged_env, expert, tasks[:1], renderer=qwen_renderer, scorer=scorer,
                         config=runner.RolloutConfig(episode=CONFIG))
    failed = group.trajectories[0]
    assert failed.generated_image is None and "CUDA out of memory" in failed.generation_error
    assert failed.reward == 0.0 and failed.reward_breakdown["zero_reason"] == combine.GENERATION_FAILED
    page = viewer.render_html([traj, failed])
    assert base64.b64encode(traj.generated_image).decode() in page and "zero: generation_failed" in page
    assert "generation failed: HTTP 400" in page and "CUDA out of memory" in page


def test_task_ground_truth_and_scorer_errors(sim_env, tasks, world_dir):
    assert live.task_ground_truth(tasks[0]) == str(world_dir / tasks[0].ground_truth["image_file"])
    assert live.task_ground_truth(core.Task("k", "p", ground_truth={"gt_image": "a.png"})) == "a.png"
    assert live.task_ground_truth(core.Task("k", "p", ground_truth=b"raw")) == b"raw"
    assert live.task_ground_truth(core.Task("k", "p", ground_truth={"other": 1})) is None
    with env.make("savanna_sim", world=str(world_dir), kind="judge") as judged:
        with pytest.raises(ValueError, match="needs the \\[rewards\\] key 'judge_url'"):
            scoring.make_scorer(judged)  # fails when the scorer is made, not mid-run
    with env.make("savanna_live", kind="sim") as live_env:
        with pytest.raises(ValueError, match="reward kind 'sim' needs the offline world; backend LiveBackend"):
            scoring.make_scorer(live_env)
    with env.make("savanna_sim", world=str(world_dir)) as tool_env:
        tool_env.reward = object()
        with pytest.raises(TypeError, match=r"env.reward \(object\) has no ascore"):
            scoring.make_scorer(tool_env)