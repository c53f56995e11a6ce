"""The policy interface of the agent loop: one async `generate(request) -> Generation` per assistant turn.

Every backend is multi-turn aware and keyed by the episode's `rid`: the loop sends the WHOLE token sequence so
far (already processor-expanded: each image is its `<|image_pad|>` run) plus the images whose placeholders
were appended since that episode's previous turn, and calls `release(rid)` when the episode ends. A backend
keeps whatever per-episode state it needs (a KV cache, the cumulative image list, a chat history), and
`fork(rid, into)` copies it, so the samples of a group can share the greedy turns they have in common.

Backends: `sampler_policy.SamplerPolicy` (in-process JAX sampler), `sglang_policy.SGLangPolicy` (SGLang
`/generate`), `harness.HarnessPolicy` (OpenAI-compatible chat with tool calling; not token-exact) and
`ScriptedPolicy` below (the offline world's expert / naive agents, so their episodes become SFT data).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ranger_jax.env import prompts, tool_env
from ranger_jax.env.sim import agents
from ranger_jax.processing.tokenizer import Tokenizer
from ranger_jax.rollout import sequence

FINISH_REASONS = ("stop", "length", "abort")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How a turn is sampled (Gen-Searcher rollouts: temperature 0.7, top_p 0.95, all top-k)."""

    temperature: float = 0.7  # 0 = greedy
    top_p: float = 0.95  # nucleus mass, in (0, 1]
    top_k: int = -1  # -1 = the whole vocabulary
    # decision sampling (the JAX sampler only): draw a token only where the policy's most likely token has
    # probability below `draw_below`, and at most `max_draws` tokens a turn; take the argmax everywhere else. Only
    # drawn tokens are trained, so a GRPO group's samples differ in, and are credited for, their uncertain choices.
    draw_below: float = 1.0  # 1 = draw at every position
    max_draws: int = 0  # 0 = no limit

    def __post_init__(self):
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not self.temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0; got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            raise ValueError(f"top_k must be a positive int or -1 (all); got {self.top_k!r}")
        if isinstance(self.draw_below, bool) or not isinstance(self.draw_below, (int, float)) \
                or not 0 < self.draw_below <= 1:
            raise ValueError(f"draw_below must be in (0, 1] (1 = draw at every position); got {self.draw_below!r}")
        if isinstance(self.max_draws, bool) or not isinstance(self.max_draws, int) or self.max_draws < 0:
            raise ValueError(f"max_draws must be an int >= 0 (0 = no limit); got {self.max_draws!r}")

    @property
    def greedy(self) -> bool:
        """Whether sampling is greedy (temperature 0)."""
        return self.temperature == 0

    @property
    def limits_draws(self) -> bool:
        """Whether a sampled turn draws only some of its tokens (`draw_below` < 1 or `max_draws` > 0)."""
        return not self.greedy and (self.draw_below < 1 or self.max_draws > 0)


@dataclasses.dataclass(frozen=True, eq=False)
class TurnRequest:
    """One assistant turn to generate.

    Attributes:
        rid: the episode's id; every turn of an episode carries the same rid.
        turn: 0-based turn index within the episode.
        prompt_ids: [T] int32, the whole sequence so far, ending with `<|im_start|>assistant\\n`.
        new_images: images whose placeholder runs were appended since this rid's previous turn, in order.
        sampling: temperature / top-p / top-k.
        max_new_tokens: generate at most this many tokens (the loop's per-turn cap, lowered near the
            context budget).
        stop_token_ids: generation stops after emitting one of these (`<|im_end|>`); it is returned.
        seed: the turn's sampling seed (derived from the episode's seed and `turn`).
        state: the environment state the turn answers (read by scripted and harness policies).
    """

    rid: str
    turn: int
    prompt_ids: np.ndarray
    new_images: tuple[sequence.PreparedImage, ...]
    sampling: SamplingParams
    max_new_tokens: int
    stop_token_ids: tuple[int, ...]
    seed: int
    state: tool_env.EnvState


@dataclasses.dataclass(frozen=True, eq=False)
class Generation:
    """What a policy produced for one turn.

    Attributes:
        token_ids: [N] int32, the generated ids, the matched stop token included.
        logprobs: [N] float32, the sampler's log-prob of each id (0 for policies without one).
        finish_reason: `stop` (a stop token or the end of a scripted turn), `length` (max_new_tokens hit)
            or `abort` (the server dropped the request).
        policy_version: integer version of the weights that produced it (staleness control).
        weight_version: the backend's own version label (SGLang `meta_info.weight_version`), when it has one.
        info: backend facts worth keeping on the trajectory (JSON: usage, abort message, …).
        drawn: [N] bool, which ids were drawn from the distribution (the rest are the argmax); None when the
            backend does not say. A turn whose sampling limits draws trains its drawn ids only.
    """

    token_ids: np.ndarray
    logprobs: np.ndarray
    finish_reason: str
    policy_version: int = 0
    weight_version: str = ""
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    drawn: np.ndarray | None = None

    def __post_init__(self):
        ids = np.asarray(self.token_ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"Generation.token_ids must be a 1-D int sequence; got shape {ids.shape} "
                             f"dtype {ids.dtype}")
        logprobs = np.asarray(self.logprobs, np.float32).reshape(-1)
        if logprobs.shape != ids.shape:
            raise ValueError(f"Generation has {ids.size} token_ids but {logprobs.size} logprobs")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason {self.finish_reason!r} is not one of {FINISH_REASONS}")
        if self.drawn is not None:
            drawn = np.asarray(self.drawn).reshape(-1)
            if drawn.shape != ids.shape:
                raise ValueError(f"Generation has {ids.size} token_ids but {drawn.size} drawn flags")
            object.__setattr__(self, "drawn", drawn.astype(bool))
        object.__setattr__(self, "token_ids", ids.astype(np.int32))
        object.__setattr__(self, "logprobs", logprobs)


class Policy(Protocol):
    """A policy backend (see the module docstring).

    Attributes:
        name: label recorded on trajectories.
        token_exact: the returned ids are the policy's own tokens, so the trajectory is the exact sequence
            it saw and produced (false for the chat harness, whose text is re-encoded).
        has_logprobs: the returned log-probs are real sampler log-probs (GRPO needs them).
    """

    name: str
    token_exact: bool
    has_logprobs: bool

    async def generate(self, request: TurnRequest) -> Generation:
        """The next assistant turn of the episode `request.rid`."""

    async def fork(self, rid: str, into: Sequence[str]) -> None:
        """Episodes `into` (new rids) continue episode `rid`'s history so far, each on its own from there: their
        next turn sends only what is new since `rid`'s last turn (`episode.run_shared_trunk`)."""

    async def release(self, rid: str) -> None:
        """Frees what the backend holds for episode `rid` once it has ended."""

    async def aclose(self) -> None:
        """Closes the backend's connections."""


def text_generation(tokenizer: Tokenizer, text: str, *, max_new_tokens: int, policy_version: int = 0,
                    info: Mapping[str, Any] | None = None) -> Generation:
    """A Generation for a turn given as text: its ids plus `<|im_end|>`, log-probs 0, cut at `max_new_tokens`.

    Text that spells a chat-control or vision token is encoded with those strings removed, so the ids never
    hold a special id the policy did not mean (a stray `<|image_pad|>` would break the image-token count).
    """
    ids = tokenizer.encode(prompts.strip_control_tokens(text)) + [tokenizer.im_end_id]
    finish = "stop"
    if len(ids) > max_new_tokens:
        ids, finish = ids[:max_new_tokens], "length"
    return Generation(token_ids=np.asarray(ids, np.int32), logprobs=np.zeros(len(ids), np.float32),
                      finish_reason=finish, policy_version=policy_version, info=dict(info or {}))


class ScriptedPolicy:
    """A scripted agent (`act(state) -> text`, e.g. `agents.ExpertAgent`) as a policy backend.

    Its text is encoded once with the tokenizer (log-probs 0), so the trajectory's ids are exactly what the
    environment was given and the episode is valid SFT data.

    Args:
        agent: anything with `act(state) -> assistant_text`.
        tokenizer: the policy model's tokenizer.
        name: label recorded on trajectories.
        policy_version: recorded on every turn.
    """

    token_exact = True
    has_logprobs = False

    def __init__(self, agent: agents.Policy, tokenizer: Tokenizer, *, name: str = "scripted", policy_version: int = 0):
        self.agent, self.tokenizer, self.name, self.policy_version = agent, tokenizer, name, policy_version

    async def generate(self, request: TurnRequest) -> Generation:
        """The scripted agent's next turn, encoded as if the policy had produced it."""
        text = self.agent.act(request.state)
        return text_generation(self.tokenizer, text, max_new_tokens=request.max_new_tokens,
                               policy_version=self.policy_version)

    async def fork(self, rid: str, into: Sequence[str]) -> None:
        """Scripted agents keep no per-episode state: the forked episodes' states say everything."""

    async def release(self, rid: str) -> None:
        """Scripted agents keep no per-episode state."""

    async def aclose(self) -> None:
        """Nothing to release."""
