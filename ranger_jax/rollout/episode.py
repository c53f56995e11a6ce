"""One episode, token-exact: `ToolEnv` × policy → `Trajectory` (docs/trajectory.md walks through it).

    reset → prefix (system prompt with its date, task prompt) → repeat:
        generation prompt → policy ids → decoded text → env.astep(state, text, truncated=finish=="length")
        → observation images prepared (min/max pixels) → user turn rendered, images before text → appended
    → reward (+ generated image) → Trajectory

The sequence is the concatenation of the tokens the policy was given and produced, turn by turn (never re-rendered
or re-tokenized, which could give different ids than the policy saw): sampled ids, the closing `<|im_end|>`
included, get loss mask 1 and their log-probs; a closing `<|im_end|>` the policy did not produce (a truncated turn)
and everything else get mask 0 and log-prob 0. Image tokens count against `max_context_tokens` BEFORE a segment is
appended: a generation prompt without room for one token, or an observation that would not fit, ends the episode
with `context_exceeded` and nothing partial is appended (never a cut inside an image run), so placeholder counts and
image lists always agree (a cut image run is the classic cause of "image features and image tokens do not match" in
multi-turn VLM training).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ranger_jax.clients import images as images_lib
from ranger_jax.data import trajectory
from ranger_jax.env import core, tool_env
from ranger_jax.processing import chat
from ranger_jax.rollout import policy as policy_lib
from ranger_jax.rollout import sequence

log = logging.getLogger(__name__)

GEN_SEARCHER_MAX_NEW_TOKENS = 4096  # GEN_MAX_NEW_TOKENS_PER_TURN
GEN_SEARCHER_MAX_CONTEXT = 36_000  # max_response_length 30000 + 6000: cumulative prompt tokens, images included
MAX_SYSTEM_TURNS = 64  # rendered system turns kept by an EpisodeCache (one per distinct date / tool set)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeConfig:
    """Per-episode limits and sampling (defaults follow Gen-Searcher's RL rollouts)."""

    max_new_tokens: int = GEN_SEARCHER_MAX_NEW_TOKENS  # per assistant turn
    max_context_tokens: int = GEN_SEARCHER_MAX_CONTEXT  # whole sequence, image placeholders included
    sampling: policy_lib.SamplingParams = policy_lib.SamplingParams()
    vision: sequence.VisionSettings = sequence.VisionSettings()
    # A control for learning experiments: the policy's tokens show every observation as BLANK_OBSERVATION (no
    # text, no images) while the environment (and a scripted teacher reading its state) runs as usual. A policy
    # that still scores well when blind is memorising tasks, not searching.
    blank_observations: bool = False

    def __post_init__(self):
        for name in ("max_new_tokens", "max_context_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EpisodeConfig.{name} must be a positive int; got {value!r}")


class Scorer(Protocol):
    """Rewards one finished episode (`scoring.EnvScorer`: the env's own `ToolEnv.ascore`)."""

    async def ascore(self, env: tool_env.ToolEnv, state: tool_env.EnvState) -> core.Score:
        """The score of the finished episode in `state`; its `generation` is the generated image, if any."""


class EpisodeCache:
    """Work the episodes of one run share (`runner.agroups` makes one per run): observation images prepared
    once per content digest, and each distinct system turn tokenized once — both exactly what preparing or
    rendering them per episode would give.

    Args:
        max_image_bytes: budget of the prepared-image cache (`sequence.PreparedImageCache`).
    """

    def __init__(self, *, max_image_bytes: int = sequence.DEFAULT_IMAGE_CACHE_BYTES):
        self.images = sequence.PreparedImageCache(max_image_bytes)
        self._system: collections.OrderedDict[tuple[chat.ChatRenderer, str], chat.Rendered] = \
            collections.OrderedDict()

    def prefix(self, renderer: chat.ChatRenderer, system: str, user: str) -> chat.Rendered:
        """`renderer.render_prefix(system, user, date=None)`: the system turn from the cache, the user turn
        rendered (each ChatML turn is encoded on its own, so the two concatenate exactly)."""
        key = (renderer, system)
        turn = self._system.get(key)
        if turn is None:
            turn = renderer.render([{"role": "system", "content": system}])
            self._system[key] = turn
            if len(self._system) > MAX_SYSTEM_TURNS:
                self._system.popitem(last=False)
        else:
            self._system.move_to_end(key)
        return turn + renderer.render_user(user)


GREEDY = policy_lib.SamplingParams(temperature=0.0, top_p=1.0, top_k=-1)


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """Who an episode is: its task, GRPO group, sample index and seed.

    `sample_from_turn` is the first turn sampled with the episode's sampling settings: the turns before it are
    greedy and recorded as context (loss mask 0), so the samples of a group share them and differ only from that
    turn on (`runner.RolloutConfig.branch_turns`). `sample_turns` (None: every later turn) is how many turns from
    there are sampled; the turns after them are greedy context again, so a group's rewards compare the sampled
    turns' choices alone. `greedy` plays the sampled turns greedily all the same (a group's greedy member,
    `runner.RolloutConfig.greedy_member`): they stay trained turns (with decision sampling, the positions where a
    sample would draw: `turn_sampling`), so the update learns whether the policy's mode beats its samples.
    """

    task: core.Task
    group_id: str
    sample_index: int
    seed: int
    sample_from_turn: int = 0
    sample_turns: int | None = None
    greedy: bool = False

    def samples_turn(self, turn: int) -> bool:
        """Whether `turn` is sampled with the episode's settings (else greedy, untrained context)."""
        if turn < self.sample_from_turn:
            return False
        return self.sample_turns is None or turn < self.sample_from_turn + self.sample_turns

    @property
    def rid(self) -> str:
        """The episode's request id, `group_id/sample_index`, unique within a run."""
        return f"{self.group_id}/{self.sample_index}"


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of one turn: a 31-bit mix of the episode seed and the turn index."""
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32, turn]).generate_state(1)[0] & 0x7FFFFFFF)


def turn_sampling(sampling: policy_lib.SamplingParams, *, sampled: bool,
                  greedy_member: bool) -> policy_lib.SamplingParams:
    """How a turn is generated: a sampled turn with the episode's `sampling`, other turns greedily. A group's greedy
    member (`EpisodeSpec.greedy`) plays its sampled turns greedily too; with decision sampling it keeps the
    samples' settings but takes the top token wherever it would draw (top-k 1), so the positions a sample would
    draw at are marked drawn and trained, with the tempered log-probabilities of the tokens it took."""
    if not sampled:
        return GREEDY
    if not greedy_member:
        return sampling
    return dataclasses.replace(sampling, top_k=1) if sampling.limits_draws else GREEDY


def _trained(sampled: bool, sampling: policy_lib.SamplingParams, gen: policy_lib.Generation) -> bool | np.ndarray:
    """Which ids of a turn are trained: a sampled turn's, all of them, or with decision sampling
    (`SamplingParams.limits_draws`) only the ids it drew — its argmax ids were not chosen by sampling.

    Raises:
        ValueError: decision sampling with a backend that does not report which ids it drew.
    """
    if not sampled or not sampling.limits_draws:
        return sampled
    if gen.drawn is None:
        raise ValueError("decision sampling (draw_below / max_draws) needs a policy backend that reports which ids "
                         "it drew (the JAX sampler)")
    return gen.drawn


def _decode_turn(renderer: chat.ChatRenderer, token_ids: np.ndarray) -> str:
    """The text of a turn for the env: its ids decoded, a final stop token left out."""
    tok = renderer.tokenizer
    ids = token_ids[:-1] if token_ids.size and int(token_ids[-1]) in (tok.im_end_id, tok.eos_id) else token_ids
    return tok.decode(ids)


class _Episode:
    """The mutable bookkeeping of one running episode (kept out of the pure env state)."""

    def __init__(self, spec: EpisodeSpec, renderer: chat.ChatRenderer, config: EpisodeConfig, cache: EpisodeCache):
        self.spec, self.renderer, self.config, self.cache = spec, renderer, config, cache
        tok = renderer.tokenizer
        self.seq = sequence.TokenSequence(image_pad_id=tok.image_pad_id, merge_size=config.vision.merge_size)
        self.generation_prompt = renderer.generation_prompt()
        self.suffix = renderer.assistant_suffix()
        self.turns: list[dict[str, Any]] = []
        self.versions: list[int] = []
        self.weight_versions: list[str] = []
        self.num_messages = 0  # env messages whose tokens are in the sequence
        self.error: str | None = None
        self.next_turn = 0  # the turn the loop plays next
        self.new_images: tuple[sequence.PreparedImage, ...] = ()  # the images of the observation not yet sent
        self.forked_from: str | None = None  # the rid whose turns this episode took over (`run_shared_trunk`)
        # the rid whose greedy continuation this episode took over after its sampled turns (`share_continuations`)
        self.continued_from: str | None = None

    def fork(self, spec: EpisodeSpec) -> _Episode:
        """A copy of this episode so far that goes on as `spec` (its own sequence, turn records and versions)."""
        twin = copy.copy(self)
        twin.spec, twin.seq = spec, self.seq.copy()
        twin.turns, twin.versions = copy.deepcopy(self.turns), list(self.versions)
        twin.weight_versions, twin.forked_from = list(self.weight_versions), self.spec.rid
        return twin

    def take_continuation(self, lead: _Episode) -> None:
        """Goes on as `lead` went on from where this episode stands (`lead` played the same tokens up to here):
        its later tokens, images, turn records and versions, and how it ended."""
        turns = len(self.turns)
        self.seq.extend_from(lead.seq)
        self.turns += copy.deepcopy(lead.turns[turns:])
        self.versions += lead.versions[turns:]
        self.weight_versions += lead.weight_versions[turns:]
        self.num_messages, self.error, self.next_turn = lead.num_messages, lead.error, lead.next_turn
        self.continued_from = lead.spec.rid

    def room_for_turn(self) -> int:
        """New tokens the next turn may take: the budget minus the generation prompt and the turn's closing."""
        closing = 1 + len(self.suffix)  # an <|im_end|> the loop may have to add, then "\n"
        return self.config.max_context_tokens - len(self.seq) - len(self.generation_prompt) - closing


async def run_episode(env: tool_env.ToolEnv, policy: policy_lib.Policy, spec: EpisodeSpec, *,
                      renderer: chat.ChatRenderer, config: EpisodeConfig, scorer: Scorer | None = None,
                      cache: EpisodeCache | None = None) -> trajectory.Trajectory:
    """Runs one episode to its end and records it (see the module docstring).

    A policy failure (transport error, server abort) ends the episode with `error`; the trajectory keeps every
    turn before it and the message in `metadata["error"]`. A failed generation is kept in `generation_error`.

    Args:
        env: the tool environment.
        policy: the policy backend.
        spec: task, group id, sample index and seed.
        renderer: the policy model's chat renderer (its tokenizer encodes every prompt segment).
        config: limits, sampling and image settings.
        scorer: rewards the finished episode (`scoring.make_scorer(env)`); None records reward 0 without a
            breakdown.
        cache: work shared with the run's other episodes (None: a private one).

    Returns:
        The validated `Trajectory`.
    """
    started = time.monotonic()
    ep = _Episode(spec, renderer, config, cache if cache is not None else EpisodeCache())
    state = _start(env, ep)
    try:
        state = await _loop(env, policy, ep, state)
    finally:
        await policy.release(spec.rid)
    rollout_s = time.monotonic() - started
    score, reward_s = await _score(env, state, scorer)
    return _record(ep, policy, state, score, rollout_s, reward_s)


async def run_shared_trunk(env: tool_env.ToolEnv, policy: policy_lib.Policy, specs: Sequence[EpisodeSpec], *,
                           renderer: chat.ChatRenderer, config: EpisodeConfig, scorer: Scorer | None = None,
                           cache: EpisodeCache | None = None,
                           before_fork: Callable[[], Awaitable[None]] | None = None,
                           on_release: Callable[[], None] | None = None, prefill: bool = True,
                           share_continuations: bool = False) -> list[trajectory.Trajectory]:
    """The samples of one group, its greedy turns played once: what `run_episode` gives for each spec, cheaper.

    The turns before `sample_from_turn` are greedy and identical for every sample of a group, so they are played
    once, as the first sample; the other samples then fork from it (`Policy.fork`: the JAX sampler copies its KV
    row, nothing is re-run) and each plays on from the branching turn with its own seed. An episode that ends before
    the branching turn is every sample's episode (scored once). Each trajectory records the trunk's turns as its
    own, and the rid it was forked from in `metadata["forked_from"]`. With `prefill`, the branching turn's prompt
    goes into the trunk's row before the fork where the backend can hold it (`SamplerPolicy.prefill`): computed
    once, copied by every fork.

    With `share_continuations` and `sample_turns` set, the turns after a sample's sampled ones are greedy: a
    sample whose tokens since the fork equal an earlier sample's at that point (the same sampled turns, the same
    observations) frees its row and takes over that sample's continuation instead of playing it again
    (`metadata["continued_from"]`; it is still scored itself). Exact when the environment answers a history the
    same way every time (the offline world); a live web may not, so it is the caller's choice.

    Args:
        specs: the group's samples in order: one task and group id, one `sample_from_turn` >= 1.
        before_fork: awaited before the other samples come into being (a runner reserves their rows with it).
        on_release: called after each episode of the group is released by the policy (its row is free again).
        env, policy, renderer, config, scorer, cache: as for `run_episode`.

    Raises:
        ValueError: specs that are not one group branching at a turn >= 1.
    """
    specs = list(specs)
    if not specs:
        raise ValueError("run_shared_trunk needs at least one EpisodeSpec")
    first = specs[0]
    for spec in specs[1:]:
        if (spec.task.id, spec.group_id, spec.sample_from_turn) != (first.task.id, first.group_id,
                                                                   first.sample_from_turn):
            raise ValueError(f"run_shared_trunk: sample {spec.sample_index} has task {spec.task.id!r}, group "
                             f"{spec.group_id!r}, branching turn {spec.sample_from_turn}; the first has "
                             f"{first.task.id!r}, {first.group_id!r}, {first.sample_from_turn}")
    if first.sample_from_turn < 1:
        raise ValueError(f"run_shared_trunk: group {first.group_id!r} branches at turn 0; nothing to share")
    started = time.monotonic()
    trunk = _Episode(first, renderer, config, cache if cache is not None else EpisodeCache())
    state = _start(env, trunk)
    forked = False
    try:
        state = await _loop(env, policy, trunk, state, stop_at=first.sample_from_turn)
        if not state.done:
            if prefill:
                await _prefill_shared_prompt(policy, trunk, state)
            if before_fork is not None:
                await before_fork()
            await policy.fork(first.rid, [spec.rid for spec in specs[1:]])
            forked = True
    finally:
        if not forked:
            await _release(policy, first.rid, on_release)
    if not forked:  # the episode ended before its branching turn: one episode for every sample
        rollout_s = time.monotonic() - started
        score, reward_s = await _score(env, state, scorer)
        return [_record(trunk if spec is first else trunk.fork(spec), policy, state, score, rollout_s, reward_s)
                for spec in specs]
    trunk_s = time.monotonic() - started
    episodes = [trunk] + [trunk.fork(spec) for spec in specs[1:]]
    fork_length = len(trunk.seq)
    merge_at = (first.sample_from_turn + first.sample_turns
                if share_continuations and first.sample_turns is not None else None)
    leads: dict[bytes, asyncio.Future] = {}  # tokens since the fork -> (episode, end state) of the first

    async def branch(ep: _Episode) -> trajectory.Trajectory:
        branch_started = time.monotonic()
        lead = following = None
        try:
            try:
                end = await _loop(env, policy, ep, state, stop_at=merge_at)
                if merge_at is not None and not end.done:
                    key = ep.seq.ids[fork_length:].tobytes()
                    following = leads.get(key)
                    if following is None:
                        leads[key] = lead = asyncio.get_running_loop().create_future()
                        lead.add_done_callback(lambda f: f.cancelled() or f.exception())  # followers may be none
                if following is None:
                    end = await _loop(env, policy, ep, end)
            finally:
                await _release(policy, ep.spec.rid, on_release)
            if following is not None:
                leader, end = await following
                ep.take_continuation(leader)
            if lead is not None:  # its followers go on while it is scored
                lead.set_result((ep, end))
            # every episode is scored, a follower too: a scorer may keep a record of each (an evaluation's rows)
            score, reward_s = await _score(env, end, scorer)
        except BaseException as err:
            if lead is not None and not lead.done():
                lead.set_exception(err if isinstance(err, Exception) else RuntimeError(f"{ep.spec.rid}: {err!r}"))
            raise
        rollout_s = trunk_s + time.monotonic() - branch_started
        return _record(ep, policy, end, score, rollout_s, reward_s)

    return list(await asyncio.gather(*(branch(ep) for ep in episodes)))


async def _release(policy: policy_lib.Policy, rid: str, on_release: Callable[[], None] | None) -> None:
    try:
        await policy.release(rid)
    finally:
        if on_release is not None:
            on_release()


def _start(env: tool_env.ToolEnv, ep: _Episode) -> tool_env.EnvState:
    """The env reset for the episode's task, its prefix (system and task prompt) in the sequence."""
    state = env.reset(ep.spec.task)
    prefix = ep.cache.prefix(ep.renderer, state.messages[0]["content"], state.messages[1]["content"])
    ep.seq.append(prefix)
    ep.num_messages = 2
    return state


async def _score(env: tool_env.ToolEnv, state: tool_env.EnvState, scorer: Scorer | None
                 ) -> tuple[core.Score | None, float]:
    """The finished episode's score (None without a scorer) and the seconds it took."""
    if scorer is None:
        return None, 0.0
    started = time.monotonic()
    score = await scorer.ascore(env, state)
    return score, time.monotonic() - started


async def _loop(env: tool_env.ToolEnv, policy: policy_lib.Policy, ep: _Episode, state: tool_env.EnvState, *,
                stop_at: int | None = None) -> tool_env.EnvState:
    """Plays turns from `ep.next_turn` until the episode ends (or, given `stop_at`, before that turn)."""
    renderer, config, tok = ep.renderer, ep.config, ep.renderer.tokenizer
    for turn in range(ep.next_turn, env.config.max_turns + 2):  # + the forced final turn + one of slack
        ep.next_turn = turn
        if state.done or turn == stop_at:
            return state
        room = ep.room_for_turn()
        if room < 1:
            ep.error = f"no room for a turn: {len(ep.seq)} tokens of {config.max_context_tokens}"
            return env.terminate(state, core.CONTEXT_EXCEEDED)
        sampled = ep.spec.samples_turn(turn)
        request = _turn_request(ep, state, turn, room)
        t0 = time.monotonic()
        try:
            gen = await policy.generate(request)
        except Exception as err:  # noqa: BLE001 — one failing request must not take the actor down; it is recorded
            log.exception("policy %s failed on episode %s turn %d", policy.name, ep.spec.rid, turn)
            ep.error = f"policy failed: {type(err).__name__}: {err}"
            return env.terminate(state, core.ERROR)
        generate_s = time.monotonic() - t0
        info: dict[str, Any] = {"turn": turn, "generate_s": round(generate_s, 6), "new_tokens": int(gen.token_ids.size),
                                "finish_reason": gen.finish_reason, "sampled": sampled, "policy": dict(gen.info)}
        ep.turns.append(info)
        problem = _check_generation(gen, request, tok.vision_ids)
        if problem is not None:
            ep.error = problem
            return env.terminate(state, core.ERROR)
        ep.seq.append(ep.generation_prompt)  # only now: a failed turn leaves the sequence at a turn boundary
        ep.versions.append(gen.policy_version)
        ep.weight_versions.append(gen.weight_version)
        ep.seq.append_generated(gen.token_ids, gen.logprobs, trained=_trained(sampled, request.sampling, gen))
        if not gen.token_ids.size or int(gen.token_ids[-1]) != tok.im_end_id:
            ep.seq.append(chat.Rendered(np.asarray([tok.im_end_id], np.int32), np.zeros(1, bool), (),
                                        np.zeros((0, 3), np.int64)))
        ep.seq.append(ep.suffix)
        t0 = time.monotonic()
        state, observation = await env.astep(state, _decode_turn(renderer, gen.token_ids),
                                             truncated=gen.finish_reason == "length")
        info["tool_s"] = round(time.monotonic() - t0, 6)
        ep.num_messages += 1  # the assistant message
        if observation.done:
            return state
        t0 = time.monotonic()
        try:
            if observation.images:  # resizing, patching and PNG-encoding release the GIL: off the event loop
                prepared, segment = await asyncio.to_thread(_observation_segment, ep, state, observation)
            else:
                prepared, segment = _observation_segment(ep, state, observation)
        except ValueError as err:  # e.g. an image the processor refuses (aspect ratio > 200)
            ep.error = f"observation of turn {turn} cannot be rendered: {err}"
            return env.terminate(state, core.ERROR)
        info["process_s"] = round(time.monotonic() - t0, 6)
        if len(ep.seq) + len(segment) > config.max_context_tokens:
            ep.error = (f"observation of {len(segment)} tokens ({sum(p.num_tokens for p in prepared)} image tokens) "
                        f"does not fit: {len(ep.seq)} of {config.max_context_tokens} used")
            return env.terminate(state, core.CONTEXT_EXCEEDED)
        ep.seq.append(segment, prepared)
        ep.num_messages += 1
        ep.new_images = prepared
    ep.next_turn = env.config.max_turns + 2
    ep.error = f"the episode did not end within {env.config.max_turns + 2} turns"
    return env.terminate(state, core.ERROR)


def _turn_request(ep: _Episode, state: tool_env.EnvState, turn: int, room: int) -> policy_lib.TurnRequest:
    """The request of the episode's next turn: the whole sequence and the generation prompt, the observation's
    images not yet sent, the turn's sampling and seed, at most `room` new tokens."""
    tok = ep.renderer.tokenizer
    prompt_ids = np.concatenate([ep.seq.ids, ep.generation_prompt.ids]).astype(np.int32)
    sampling = turn_sampling(ep.config.sampling, sampled=ep.spec.samples_turn(turn), greedy_member=ep.spec.greedy)
    return policy_lib.TurnRequest(
        rid=ep.spec.rid, turn=turn, prompt_ids=prompt_ids, new_images=ep.new_images, sampling=sampling,
        max_new_tokens=min(ep.config.max_new_tokens, room), stop_token_ids=(tok.im_end_id,),
        seed=turn_seed(ep.spec.seed, turn), state=state)


async def _prefill_shared_prompt(policy: policy_lib.Policy, ep: _Episode, state: tool_env.EnvState) -> None:
    """Before a fork: the branching turn's prompt (the trunk's last observation and the generation prompt) goes
    into the trunk's row once, where the backend can hold it (`SamplerPolicy.prefill`), so every fork copies it
    instead of appending it again. A failed prefill is logged and skipped: the forks then send it themselves."""
    prefill = getattr(policy, "prefill", None)
    room = ep.room_for_turn()
    if not callable(prefill) or room < 1:  # no room: the branching turn ends every fork's episode anyway
        return
    try:
        await prefill(_turn_request(ep, state, ep.next_turn, room))
    except Exception:  # noqa: BLE001 — an optimisation: the forks' own turns carry the prompt instead
        log.exception("policy %s could not prefill episode %s before its fork", policy.name, ep.spec.rid)
        return
    ep.new_images = ()  # in the row now: the next turn sends no new tokens and no images


BLANK_OBSERVATION = "<tool_response>\n</tool_response>"


def _observation_segment(ep: _Episode, state: tool_env.EnvState, observation: core.Observation
                         ) -> tuple[tuple[sequence.PreparedImage, ...], chat.Rendered]:
    """The observation's images prepared (through the run's cache) and its user turn rendered around them."""
    if ep.config.blank_observations:
        return (), ep.renderer.render_user(BLANK_OBSERVATION)
    prepared = tuple(ep.cache.images.prepare(lambda o=o: o.image, ep.config.vision,  # decoded only on a miss
                                             key=state.images[o.img_id].sha256, img_id=o.img_id,
                                             parent_id=state.images[o.img_id].parent_id)
                     for o in observation.images)
    return prepared, ep.renderer.render_user(observation.text, images_grid_thw=[p.grid_thw for p in prepared])


def _check_generation(gen: policy_lib.Generation, request: policy_lib.TurnRequest, vision_ids) -> str | None:
    """Why a generation cannot be appended (aborted, too long, vision tokens), or None."""
    if gen.finish_reason == "abort":
        return f"generation aborted: {gen.info.get('abort_message') or 'no message'}"
    if gen.token_ids.size > request.max_new_tokens:
        return f"policy returned {gen.token_ids.size} tokens, more than max_new_tokens={request.max_new_tokens}"
    bad = np.flatnonzero(np.isin(gen.token_ids, list(vision_ids)))
    if bad.size:
        return (f"policy emitted vision token id {int(gen.token_ids[bad[0]])} at position {int(bad[0])} of turn "
                f"{request.turn}; its image run would have no pixels")
    return None


def _record(ep: _Episode, policy: policy_lib.Policy, state: tool_env.EnvState, score: core.Score | None,
            rollout_s: float, reward_s: float) -> trajectory.Trajectory:
    tok = ep.renderer.tokenizer
    generation: images_lib.GenerationResult | None = score.generation if score is not None else None
    sums = {key: round(sum(t.get(key, 0.0) for t in ep.turns), 6) for key in ("generate_s", "tool_s", "process_s")}
    timings = {**sums, "rollout_s": round(rollout_s, 6), "reward_s": round(reward_s, 6),
               "generation_s": round(generation.latency_s, 6) if generation is not None else 0.0}
    metadata: Mapping[str, Any] = {
        "policy": policy.name, "token_exact": policy.token_exact,
        "rl_trainable": bool(policy.token_exact and policy.has_logprobs), "seed": ep.spec.seed, "rid": ep.spec.rid,
        "sample_from_turn": ep.spec.sample_from_turn, "sample_turns": ep.spec.sample_turns,
        "greedy_member": ep.spec.greedy, "forked_from": ep.forked_from, "continued_from": ep.continued_from,
        "num_turns": state.num_turns, "num_tool_calls": state.num_tool_calls, "turns": ep.turns,
        "policy_versions": ep.versions, "weight_versions": ep.weight_versions, "error": ep.error,
        "max_context_tokens": ep.config.max_context_tokens,
        "generation_request": dict(generation.request) if generation is not None else None,
    }
    generated_image = generation.image if generation is not None and generation.ok else None
    generation_error = generation.error if generation is not None and not generation.ok else None
    if generation is not None and generation.ok and generation.image is None:
        generation_error = "the generator reported success without an image"
    return trajectory.Trajectory(
        task_id=ep.spec.task.id, group_id=ep.spec.group_id, sample_index=ep.spec.sample_index,
        policy_version=min(ep.versions) if ep.versions else 0, **ep.seq.arrays(), images=tuple(ep.seq.images),
        termination=state.termination, reward=score.reward if score is not None else 0.0,
        reward_breakdown=score.to_dict() if score is not None else {}, answer=state.answer,
        messages=tuple(state.messages[:ep.num_messages]), generated_image=generated_image,
        generation_error=generation_error, timings=timings, metadata=metadata, image_pad_id=tok.image_pad_id,
        merge_size=ep.config.vision.merge_size)
