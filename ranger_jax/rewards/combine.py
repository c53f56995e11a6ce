"""The combined RL reward and its hard-zero rules (Gen-Searcher `gen_image_deepresearch_reward.py`).

    R = max(0, (1 − α)·R_image + α·R_text),   α = GEN_REWARD_TEXT_COEF clamped to [0, 1]

R_image is the per-sample K-Score of the generated image against the GT, judged on the original question;
R_text is the snapped text reward (`rewards.text_reward`). α = 0 skips the text judge, α = 1 the image one.

Hard zeros, checked before any generation or judge call (Gen-Searcher's rules): GT missing or
no question; terminations `max_response_length_exceeded` / `context_exceeded`, `repeated_response` and
`error`; no answer (including `no_answer`, `max_turns`), a failed answer parse or an unknown img_id; an empty
`gen_prompt`; a count of valid local references outside [1, 4]. After generation: a failed generation, and
a missing judge (e.g. no API key). Every zero records WHY in `RewardBreakdown.zero_reason`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping
from typing import Any

from ranger_jax.env import core

MIN_REFERENCES, MAX_REFERENCES = 1, 4  # GEN_MIN_INPUT_IMAGES, GEN_MAX_INPUT_IMAGES

# Why a reward is zero (RewardBreakdown.zero_reason).
GT_MISSING = "gt_missing"
NO_QUESTION = "no_question"
TERMINATED = "terminated"
NO_ANSWER = "no_answer"
ANSWER_PARSE_FAILED = "answer_parse_failed"
UNKNOWN_IMG_ID = "unknown_img_id"
EMPTY_GEN_PROMPT = "empty_gen_prompt"
REFERENCE_COUNT = "reference_count"
GENERATION_FAILED = "generation_failed"
NO_JUDGE = "no_judge"
JUDGE_FAILED = "judge_failed"
ZERO_REASONS = (GT_MISSING, NO_QUESTION, TERMINATED, NO_ANSWER, ANSWER_PARSE_FAILED, UNKNOWN_IMG_ID,
                EMPTY_GEN_PROMPT, REFERENCE_COUNT, GENERATION_FAILED, NO_JUDGE, JUDGE_FAILED)

# Terminations that zero the reward before anything is generated ("max_response_length_exceeded" is the
# Gen-Searcher label of our CONTEXT_EXCEEDED).
ZERO_TERMINATIONS = frozenset({"max_response_length_exceeded", core.CONTEXT_EXCEEDED, core.REPEATED_RESPONSE,
                               core.ERROR})
NO_ANSWER_TERMINATIONS = frozenset({core.NO_ANSWER, core.MAX_TURNS, "timeout", "max_rounds_reached"})


@dataclasses.dataclass(frozen=True)
class RewardBreakdown:
    """A reward and how it was reached.

    Attributes:
        reward: the final reward, ≥ 0.
        image_reward: R_image (per-sample K-Score) when computed.
        text_reward: R_text (snapped) when computed.
        alpha: the clamped text weight α used.
        zero_reason: one of ZERO_REASONS when a hard-zero rule fired, else None.
        detail: a human sentence on the zero (the counts, the unknown ids, the generator's error).
        components: judge outputs worth keeping (K-Score dimensions, rationales, …); JSON-serialisable.
    """

    reward: float
    image_reward: float | None = None
    text_reward: float | None = None
    alpha: float = 0.0
    zero_reason: str | None = None
    detail: str = ""
    components: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.zero_reason is not None and self.zero_reason not in ZERO_REASONS:
            raise ValueError(f"zero_reason {self.zero_reason!r} is not one of {ZERO_REASONS}")
        if not math.isfinite(self.reward) or self.reward < 0:
            raise ValueError(f"reward must be finite and >= 0, got {self.reward}")

    def to_dict(self) -> dict[str, Any]:
        """The breakdown as plain JSON-ready values."""
        return {**dataclasses.asdict(self), "components": dict(self.components)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RewardBreakdown":
        """The inverse of `to_dict`; unknown keys raise ValueError naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown RewardBreakdown keys {unknown}; known: {sorted(known)}")
        return cls(**data)


def clamp_alpha(alpha: float) -> float:
    """α clamped to [0, 1] (NaN is an error)."""
    if alpha != alpha:
        raise ValueError("alpha is NaN")
    return min(1.0, max(0.0, float(alpha)))


def zero(reason: str, detail: str, *, alpha: float = 0.0) -> RewardBreakdown:
    """A zero reward for `reason` (one of ZERO_REASONS)."""
    return RewardBreakdown(reward=0.0, alpha=clamp_alpha(alpha), zero_reason=reason, detail=detail)


def combine(image_reward: float | None, text_reward: float | None, alpha: float, *,
            components: Mapping[str, Any] | None = None) -> RewardBreakdown:
    """R = max(0, (1 − α)·R_image + α·R_text) with α clamped to [0, 1].

    A reward whose weight is 0 may be None (not computed).

    Raises:
        ValueError: a reward with non-zero weight is None or not finite (the message names it).
    """
    alpha = clamp_alpha(alpha)
    total = 0.0
    for name, value, weight in (("image_reward", image_reward, 1.0 - alpha), ("text_reward", text_reward, alpha)):
        if weight == 0.0:
            continue
        if value is None or not math.isfinite(value):
            raise ValueError(f"{name} is {value!r} but its weight is {weight:g} (alpha={alpha:g})")
        total += weight * value
    return RewardBreakdown(reward=max(0.0, total), image_reward=image_reward, text_reward=text_reward, alpha=alpha,
                           components=dict(components or {}))


def hard_zero(*, question: str | None, has_ground_truth: bool, termination: str | None, answer: core.Answer | None,
              known_img_ids: Collection[str], valid_img_ids: Collection[str] | None = None, alpha: float = 0.0,
              min_references: int = MIN_REFERENCES, max_references: int = MAX_REFERENCES) -> RewardBreakdown | None:
    """The zero breakdown of the first hard-zero rule that applies before generation, or None.

    Args:
        question: the task prompt.
        has_ground_truth: a GT image (or whatever the scorer needs) exists.
        termination: the episode's termination label.
        answer: the parsed answer, None when there is none.
        known_img_ids: every img_id the episode assigned.
        valid_img_ids: the ids whose local image file exists (defaults to `known_img_ids`).
        alpha: recorded on the breakdown.
        min_references / max_references: allowed count of valid local references (the env's reward settings).
    """
    if not 0 <= min_references <= max_references:
        raise ValueError(f"need 0 <= min_references <= max_references, got {min_references}, {max_references}")
    if not has_ground_truth:
        return zero(GT_MISSING, "the task has no ground truth to score against", alpha=alpha)
    if not (question or "").strip():
        return zero(NO_QUESTION, "the task has no question", alpha=alpha)
    if termination in ZERO_TERMINATIONS:
        return zero(TERMINATED, f"episode terminated with {termination!r}", alpha=alpha)
    if termination == core.ANSWER_PARSE_FAILED:
        return zero(ANSWER_PARSE_FAILED, "the final answer could not be parsed", alpha=alpha)
    if answer is None or termination in NO_ANSWER_TERMINATIONS:
        return zero(NO_ANSWER, f"no answer (termination {termination!r})", alpha=alpha)
    known = set(known_img_ids)
    unknown = [ref.img_id for ref in answer.reference_images if ref.img_id not in known]
    if unknown:
        return zero(UNKNOWN_IMG_ID, f"answer cites unknown image ids {unknown}; known: {sorted(known)}", alpha=alpha)
    if not answer.gen_prompt.strip():
        return zero(EMPTY_GEN_PROMPT, "the answer's gen_prompt is empty", alpha=alpha)
    valid = set(known if valid_img_ids is None else valid_img_ids)
    count = sum(ref.img_id in valid for ref in answer.reference_images)
    if not min_references <= count <= max_references:
        return zero(REFERENCE_COUNT, f"{count} valid local references, allowed [{min_references}, {max_references}]",
                    alpha=alpha)
    return None
