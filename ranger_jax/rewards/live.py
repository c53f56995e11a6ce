"""The live RL reward of one episode: hard-zero rules → generator → judges → combination.

Gen-Searcher's flow: the answer's first references (valid local files,
in the answer's order) and its `gen_prompt` go to the image generator with a pinned seed; the generated
image is judged against the GT with the K-Score judge on the ORIGINAL question (R_image = per-sample
overall) and, when α > 0, the answer text with the text-reward judge (R_text); then
`combine.combine`. Any rule that fires, a failed generation and a failed judge give a zero whose reason is
recorded. The generation result is returned too, so the trajectory keeps the image or the error.

`JudgeReward` is this reward behind `ToolEnv.score`: it reads a finished `EnvState`, looks up the task's GT image
(`task_ground_truth`) and returns a `core.Score` carrying the generation. The generator needs the references'
pixels, so a live reward is taken while the env's image store exists: a cited reference whose file is gone is an
error, never a silent zero.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ranger_jax.clients import images, media
from ranger_jax.env import core, tool_env
from ranger_jax.rewards import combine, judge, text_reward
from ranger_jax.rewards.judge import KScoreJudge
from ranger_jax.rewards.text_reward import TextRewardJudge


@dataclasses.dataclass(frozen=True)
class Episode:
    """What the reward needs from a finished episode.

    Attributes:
        question: the original task prompt.
        ground_truth: the GT image (None when missing → hard zero).
        answer: the parsed answer, or None.
        termination: the episode's termination label.
        images: img_id → ImageRecord of every image the episode assigned (their `path` must exist to count).
    """

    question: str
    ground_truth: media.ImageLike | None
    answer: core.Answer | None
    termination: str | None
    images: Mapping[str, core.ImageRecord]


class LiveReward:
    """Scores episodes with a generator and judges.

    Args:
        generator: any `clients.images.Generator` (SGLang, Gen-Searcher service, offline compositor).
        image_judge: K-Score judge for R_image (required unless α = 1).
        text_judge: text-reward judge for R_text (required unless α = 0).
        alpha: weight of R_text, clamped to [0, 1] (Gen-Searcher ships 0.5; 0 when unset).
        seed: generator seed pinned for every episode (Gen-Searcher: 0).
        min_references / max_references: allowed count of valid local references (Gen-Searcher: 1 and 4); how
            many of them reach the generator is the generator's own `max_references` (Gen-Searcher: 3).
    """

    def __init__(self, generator: images.Generator, *, image_judge: KScoreJudge | None,
                 text_judge: TextRewardJudge | None, alpha: float = 0.5, seed: int = 0,
                 min_references: int = combine.MIN_REFERENCES, max_references: int = combine.MAX_REFERENCES):
        self.generator, self.image_judge, self.text_judge = generator, image_judge, text_judge
        self.alpha, self.seed = combine.clamp_alpha(alpha), seed
        self.min_references, self.max_references = min_references, max_references

    def _precheck(self, episode: Episode) -> tuple[combine.RewardBreakdown | None, list[str]]:
        valid = [i for i, record in episode.images.items() if os.path.isfile(record.path)]
        zero = combine.hard_zero(question=episode.question, has_ground_truth=episode.ground_truth is not None,
                                 termination=episode.termination, answer=episode.answer,
                                 known_img_ids=episode.images, valid_img_ids=valid, alpha=self.alpha,
                                 min_references=self.min_references, max_references=self.max_references)
        if zero is not None or episode.answer is None:
            return zero, []
        paths = [episode.images[ref.img_id].path for ref in episode.answer.reference_images if ref.img_id in valid]
        missing = [name for name, j, w in (("image_judge", self.image_judge, 1 - self.alpha),
                                           ("text_judge", self.text_judge, self.alpha)) if w > 0 and j is None]
        if missing:
            return combine.zero(combine.NO_JUDGE, f"no {' or '.join(missing)} configured (alpha={self.alpha:g})",
                                alpha=self.alpha), paths
        return None, paths

    async def _judge(self, episode: Episode, generated: bytes) -> combine.RewardBreakdown:
        assert episode.answer is not None and episode.ground_truth is not None
        components: dict[str, Any] = {}

        async def image_reward() -> float | None:
            if self.alpha >= 1.0 or self.image_judge is None:
                return None
            verdict = await self.image_judge.ascore(episode.question, generated, episode.ground_truth)
            components["kscore"] = verdict.value.to_dict()
            return verdict.value.overall

        async def text_score() -> float | None:
            if self.alpha <= 0.0 or self.text_judge is None:
                return None
            facts = text_reward.image_facts(episode.images)
            verdict = await self.text_judge.ascore(episode.question, episode.ground_truth, episode.answer, facts)
            components["text_reward"] = dataclasses.asdict(verdict.value)
            return verdict.value.score

        try:
            r_image, r_text = await asyncio.gather(image_reward(), text_score())
        except judge.JudgeError as err:
            return combine.zero(combine.JUDGE_FAILED, str(err), alpha=self.alpha)
        return combine.combine(r_image, r_text, self.alpha, components=components)

    async def ascore(self, episode: Episode) -> tuple[combine.RewardBreakdown, images.GenerationResult | None]:
        """(reward breakdown, generation result or None when no generation ran)."""
        zero, references = self._precheck(episode)
        if zero is not None:
            return zero, None
        assert episode.answer is not None
        generation = await self.generator.agenerate(episode.answer.gen_prompt, references, seed=self.seed)
        if not generation.ok or generation.image is None:
            return combine.zero(combine.GENERATION_FAILED, f"generation failed: {generation.error}",
                                alpha=self.alpha), generation
        return await self._judge(episode, generation.image), generation

    def score(self, episode: Episode) -> tuple[combine.RewardBreakdown, images.GenerationResult | None]:
        """Sync twin of `ascore` (must not be called from a running event loop)."""
        return asyncio.run(self.ascore(episode))


def task_ground_truth(task: core.Task) -> media.ImageLike | None:
    """The GT image of a task: `ground_truth` itself (path, bytes, image), or its `gt_image` / `gen_image` key, or
    an offline-world task's `image_file` (relative to `metadata["world"]`)."""
    truth = task.ground_truth
    if not isinstance(truth, Mapping):
        return truth
    if truth.get("gt_image", truth.get("gen_image")) is not None:
        return truth.get("gt_image", truth.get("gen_image"))
    world = (task.metadata or {}).get("world")
    if truth.get("image_file") and world:
        return str(Path(world) / truth["image_file"])
    return None


def to_score(breakdown: combine.RewardBreakdown, generation: images.GenerationResult | None) -> core.Score:
    """A judged `RewardBreakdown` (and the generation it judged) as the env's `core.Score`."""
    if breakdown.zero_reason is not None:
        reason = breakdown.detail or breakdown.zero_reason
    elif breakdown.reward < 1:
        parts = [f"{name} {value:.2f}" for name, value in (("image reward", breakdown.image_reward),
                                                           ("text reward", breakdown.text_reward))
                 if value is not None and value < 1]
        reason = "; ".join(parts) or f"reward {breakdown.reward:.2f}"
    else:
        reason = None
    return core.Score(reward=breakdown.reward, reason=reason, zero_reason=breakdown.zero_reason,
                      breakdown={"kind": "judge", **breakdown.to_dict()}, generation=generation)


class JudgeReward:
    """`LiveReward` over finished env states (see the module docstring).

    Args:
        reward: generator + judges + α + reference limits.
        ground_truth: the GT image of a task (default: `task_ground_truth`).
    """

    def __init__(self, reward: LiveReward,
                 ground_truth: Callable[[core.Task], media.ImageLike | None] = task_ground_truth):
        self.reward, self.ground_truth = reward, ground_truth

    async def ascore(self, state: tool_env.EnvState) -> core.Score:
        """The live reward of the finished episode in `state`: generator, then judges.

        Raises:
            ValueError: a reference the answer cites has no file any more (the env was closed), naming it.
        """
        cited = state.answer.reference_images if state.answer is not None else ()
        gone = [ref.img_id for ref in cited if ref.img_id in state.images
                and not os.path.isfile(state.images[ref.img_id].path)]
        if gone:
            raise ValueError(f"task {state.task.id!r}: the files of references {gone} are gone (e.g. "
                             f"{state.images[gone[0]].path}); the generator needs their pixels, so score a live "
                             "reward before ToolEnv.close, or give the env a lasting image_store folder")
        episode = Episode(question=state.task.prompt, ground_truth=self.ground_truth(state.task),
                          answer=state.answer, termination=state.termination, images=state.images)
        breakdown, generation = await self.reward.ascore(episode)
        return to_score(breakdown, generation)
