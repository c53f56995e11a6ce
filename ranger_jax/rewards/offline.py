"""The offline world's reward: the hard-zero rules, then the exact sim judgement weighted into one number.

    hard_zero(termination, answer, cited ids, references in [min_references, max_answer_refs])  → 0 with its reason
    R_image = 0.75·search pass + 0.25·crop IoU         (env.sim.rewards.score: geometry of the references)
    R_text  = text score                                (key attributes named, sibling-only attributes not)
    R       = (1 − α)·R_image + α·R_text,  α = text_coef (rewards.combine.combine, the live reward's formula)

With α = 0.2 this is 0.6·search + 0.2·IoU + 0.2·text. The rules are the live reward's (`combine.hard_zero`), so a
`repeated_response` or `context_exceeded` episode earns 0 in both worlds; the upper reference limit is the env's
`max_answer_refs`, the number its system prompt states and its answer parser keeps, so an answer that follows the
prompt is never zeroed for its reference count. Nothing here reads an image file: references are judged from the
geometry the episode recorded (`ImageRecord.root_url` + `root_box`), so a score does not depend on when it is
taken (before or after `ToolEnv.close` removes the env's image store). The sim parts stay in the breakdown when a
rule zeroed the reward (what the answer would have scored).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ranger_jax.env import config as config_lib
from ranger_jax.env import core, tool_env
from ranger_jax.env.sim import rewards as sim_rewards
from ranger_jax.env.sim import world as world_lib
from ranger_jax.rewards import combine

IMAGE_WEIGHTS = (0.75, 0.25)  # search pass, crop IoU in R_image


def _judgement(judged: sim_rewards.SimScore) -> dict[str, Any]:
    """The sim judgement as plain JSON values."""
    return {"search_pass": judged.search_pass, "crop_iou": judged.crop_iou, "text_score": judged.text_score,
            "sim_reason": judged.reason, "key_attributes_present": list(judged.key_attributes_present),
            "key_attributes_missing": list(judged.key_attributes_missing),
            "sibling_attributes_mentioned": list(judged.sibling_attributes_mentioned),
            "references": [{**dataclasses.asdict(check), "region": list(check.region) if check.region else None,
                            "shown_siblings": list(check.shown_siblings)} for check in judged.references]}


def _why_reduced(judged: sim_rewards.SimScore, alpha: float) -> str | None:
    """The parts that kept the reward below 1, in words (None when none did)."""
    parts = []
    if not judged.search_pass and alpha < 1:
        parts.append(f"search failed: {judged.reason}")
    if judged.crop_iou < 1 and alpha < 1:
        parts.append(f"crop IoU {judged.crop_iou:.2f}")
    if judged.text_score < 1 and alpha > 0:
        detail = [f"missing {list(judged.key_attributes_missing)}"] if judged.key_attributes_missing else []
        if judged.sibling_attributes_mentioned:
            detail.append(f"names sibling attributes {list(judged.sibling_attributes_mentioned)}")
        parts.append(f"text score {judged.text_score:.2f}" + (f" ({'; '.join(detail)})" if detail else ""))
    return "; ".join(parts) or None


class OfflineReward:
    """The exact reward of offline-world episodes (see the module docstring).

    Args:
        world: the loaded world the episodes run in.
        text_coef: α, the weight of the text score (clamped to [0, 1]).
        min_references / max_references: allowed count of references (hard zero outside); `max_references` is the
            env's `max_answer_refs`.
        criteria: thresholds of the search judgement.
    """

    def __init__(self, world: world_lib.World, *, text_coef: float = 0.0,
                 min_references: int = combine.MIN_REFERENCES,
                 max_references: int = config_lib.EnvConfig.max_answer_refs,
                 criteria: sim_rewards.Criteria | None = None):
        if not 0 <= min_references <= max_references:
            raise ValueError(f"need 0 <= min_references <= max_references, got {min_references}, {max_references}")
        self.world = world
        self.alpha = combine.clamp_alpha(text_coef)
        self.min_references, self.max_references = min_references, max_references
        self.criteria = criteria or sim_rewards.Criteria()

    @classmethod
    def from_env(cls, env: tool_env.ToolEnv, world: world_lib.World) -> "OfflineReward":
        """The reward `env`'s settings ask for: its `[rewards]` table and its `max_answer_refs`."""
        settings = env.rewards
        return cls(world, text_coef=settings.get("text_coef", 0.0),
                   min_references=settings.get("min_references", combine.MIN_REFERENCES),
                   max_references=env.config.max_answer_refs,
                   criteria=sim_rewards.Criteria.from_settings(settings))

    def score(self, state: tool_env.EnvState) -> core.Score:
        """The reward of the finished episode in `state`.

        Raises:
            ValueError: the task has no offline-world ground truth, or names entities the world lacks.
        """
        task, answer = state.task, state.answer
        judged = sim_rewards.score(self.world, task, answer, state.images, criteria=self.criteria)
        image_reward = IMAGE_WEIGHTS[0] * float(judged.search_pass) + IMAGE_WEIGHTS[1] * judged.crop_iou
        breakdown = {"kind": "sim", "alpha": self.alpha, "image_reward": image_reward,
                     "text_reward": judged.text_score,
                     "image_weights": {"search_pass": IMAGE_WEIGHTS[0], "crop_iou": IMAGE_WEIGHTS[1]},
                     "min_references": self.min_references, "max_references": self.max_references,
                     **_judgement(judged)}
        zero = combine.hard_zero(question=task.prompt, has_ground_truth=task.ground_truth is not None,
                                 termination=state.termination, answer=answer, known_img_ids=state.images,
                                 alpha=self.alpha, min_references=self.min_references,
                                 max_references=self.max_references)
        if zero is not None:
            return core.Score(reward=0.0, reason=zero.detail, zero_reason=zero.zero_reason, breakdown=breakdown)
        combined = combine.combine(image_reward, judged.text_score, self.alpha)
        return core.Score(reward=combined.reward, reason=_why_reduced(judged, self.alpha) if combined.reward < 1
                          else None, breakdown=breakdown)

    async def ascore(self, state: tool_env.EnvState) -> core.Score:
        """`score` for async callers (it does no I/O and takes about a millisecond)."""
        return self.score(state)
