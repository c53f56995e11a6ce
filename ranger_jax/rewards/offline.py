"""The offline world's RL reward: the hard-zero rules, then the exact sim score — no generator, no judge.

    hard_zero(termination, answer, image ids, valid reference count)  → 0 with its reason, or
    R = sim.rewards.score(world, task, answer, images).reward          (0.6·search pass + 0.2·crop IoU + 0.2·text)

The same hard-zero rules as the live reward (`combine.hard_zero`, with the environment's
`min_references`/`max_references`) keep the two worlds' failure semantics equal: a `repeated_response` or
`context_exceeded` episode earns 0 even if it had an answer. The sim parts (search pass, crop IoU, text score,
per-reference checks, reason) are always kept in `RewardBreakdown.components["sim"]`, also when a rule zeroed
the reward. For the viewer, the OFFLINE compositor (`clients.compositor`) "generates" an image from the
answer's references when no rule fired; its failure is recorded, it never changes the exact reward.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from ranger_jax.clients import compositor
from ranger_jax.clients import images as images_lib
from ranger_jax.env import core
from ranger_jax.env.sim import rewards as sim_rewards
from ranger_jax.env.sim import world as world_lib
from ranger_jax.rewards import combine

_CRITERIA_KEYS = {"coverage_min": "coverage_min", "share_min": "share_min", "rival_max": "rival_max",
                  "max_ref_images": "max_references"}


def criteria_from_settings(settings: Mapping[str, Any]) -> sim_rewards.Criteria:
    """`sim.rewards.Criteria` from an environment's `[rewards]` table (missing keys keep their defaults)."""
    return sim_rewards.Criteria(**{field: settings[key] for key, field in _CRITERIA_KEYS.items() if key in settings})


def _sim_components(score: sim_rewards.SimScore) -> dict[str, Any]:
    return {"search_pass": score.search_pass, "crop_iou": score.crop_iou, "text_score": score.text_score,
            "reward": score.reward, "reason": score.reason, "weights": list(sim_rewards.REWARD_WEIGHTS),
            "key_attributes_present": list(score.key_attributes_present),
            "key_attributes_missing": list(score.key_attributes_missing),
            "sibling_attributes_mentioned": list(score.sibling_attributes_mentioned),
            "references": [dataclasses.asdict(check) for check in score.references]}


class OfflineReward:
    """Scores offline-world episodes exactly (see the module docstring).

    Args:
        world: the loaded world the episodes run in (`sim.load_world`).
        criteria: thresholds of the search judgement; `max_references` is also how many references reach the
            compositor.
        min_references / max_references: allowed count of valid local references (hard zero outside).
        generator: makes the viewer's image (None: the offline compositor).
        generate: run the generator at all (off: no image, e.g. for speed).
        seed: generator seed pinned for every episode.
    """

    def __init__(self, world: world_lib.World, *, criteria: sim_rewards.Criteria | None = None,
                 min_references: int = combine.MIN_REFERENCES, max_references: int = combine.MAX_REFERENCES,
                 generator: images_lib.Generator | None = None, generate: bool = True, seed: int = 0):
        if not 0 <= min_references <= max_references:
            raise ValueError(f"need 0 <= min_references <= max_references, got {min_references}, {max_references}")
        self.world = world
        self.criteria = criteria or sim_rewards.Criteria()
        self.min_references, self.max_references, self.seed = min_references, max_references, seed
        if generator is None and generate:
            generator = compositor.CompositorGenerator(max_references=self.criteria.max_references)
        self.generator = generator if generate else None

    @classmethod
    def from_settings(cls, world: world_lib.World, settings: Mapping[str, Any], *,
                      generator: images_lib.Generator | None = None, generate: bool = True,
                      seed: int = 0) -> "OfflineReward":
        """An OfflineReward from an environment's `[rewards]` table (`ToolEnv.rewards`); see the class for the rest."""
        return cls(world, criteria=criteria_from_settings(settings),
                   min_references=settings.get("min_references", combine.MIN_REFERENCES),
                   max_references=settings.get("max_references", combine.MAX_REFERENCES),
                   generator=generator, generate=generate, seed=seed)

    def breakdown(self, task: core.Task, *, answer: core.Answer | None, termination: str | None,
                  images: Mapping[str, core.ImageRecord]) -> combine.RewardBreakdown:
        """The reward of one episode (no generation).

        Raises:
            ValueError: the task has no offline-world ground truth, or names entities the world lacks.
        """
        score = sim_rewards.score(self.world, task, answer, images, criteria=self.criteria)
        components = {"sim": _sim_components(score)}
        valid = [img_id for img_id, record in images.items() if os.path.isfile(record.path)]
        zero = combine.hard_zero(question=task.prompt, has_ground_truth=task.ground_truth is not None,
                                 termination=termination, answer=answer, known_img_ids=images, valid_img_ids=valid,
                                 min_references=self.min_references, max_references=self.max_references)
        if zero is not None:
            return dataclasses.replace(zero, components=components)
        return combine.RewardBreakdown(reward=score.reward, components=components)

    async def ascore(self, task: core.Task, *, answer: core.Answer | None, termination: str | None,
                     images: Mapping[str, core.ImageRecord]
                     ) -> tuple[combine.RewardBreakdown, images_lib.GenerationResult | None]:
        """(reward breakdown, the compositor's result or None when a hard-zero rule fired or generation is off)."""
        breakdown = self.breakdown(task, answer=answer, termination=termination, images=images)
        if breakdown.zero_reason is not None or answer is None or self.generator is None:
            return breakdown, None
        paths = [images[ref.img_id].path for ref in answer.reference_images
                 if ref.img_id in images and os.path.isfile(images[ref.img_id].path)]
        generation = await self.generator.agenerate(answer.gen_prompt, paths[:self.criteria.max_references],
                                                    seed=self.seed)
        return breakdown, generation
