"""Savanna-style live judges: search pass/fail and generation (identity tier + context criteria).

UNOFFICIAL reimplementation. The Ranger paper defines these judges but publishes neither code nor prompts;
the rubrics here are ours, following the paper's description, and the
numbers they give are not comparable to the paper's. In the offline world use the sim's exact rewards.

Generation score (our choice, documented because the paper's combination is not public):
`score = IDENTITY_TIERS[tier] × (fraction of context criteria satisfied)` (× 1 when there are none), and
`passed` = tier "exact" with every criterion satisfied (the all-or-nothing style of Mind-Bench).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ranger_jax.clients import chat, media
from ranger_jax.rewards import judge, kscore

IDENTITY_TIERS = {"exact": 1.0, "partial": 0.5, "wrong": 0.0}

SEARCH_SCHEMA = {
    "type": "object",
    "properties": {"rationale": {"type": "string"}, "passed": {"type": "boolean"},
                   "matching_reference": {"type": "string"}},
    "required": ["rationale", "passed", "matching_reference"],
    "additionalProperties": False,
}
GENERATION_SCHEMA = {
    "type": "object",
    "properties": {
        "rationale": {"type": "string"},
        "identity_tier": {"type": "string", "enum": list(IDENTITY_TIERS)},
        "context": {"type": "array", "items": {
            "type": "object",
            "properties": {"criterion": {"type": "string"}, "satisfied": {"type": "boolean"}},
            "required": ["criterion", "satisfied"], "additionalProperties": False}},
    },
    "required": ["rationale", "identity_tier", "context"],
    "additionalProperties": False,
}


@dataclasses.dataclass(frozen=True)
class SearchVerdict:
    """The search judge's verdict: pass or fail, the reference that matched, and why."""

    passed: bool
    matching_reference: str
    rationale: str


def parse_search_output(obj: Any) -> SearchVerdict:
    """A `SearchVerdict` from `{"rationale", "passed", "matching_reference"}`. Raises ValueError if malformed."""
    if not isinstance(obj, Mapping) or "passed" not in obj:
        raise ValueError(f"search judge output must be an object with 'passed', got {str(obj)[:120]!r}")
    return SearchVerdict(passed=kscore.parse_flag(obj["passed"], "passed"),
                         matching_reference=str(obj.get("matching_reference") or ""),
                         rationale=str(obj.get("rationale", "")))


@dataclasses.dataclass(frozen=True)
class GenerationVerdict:
    """Identity tier, per-criterion context results (in the order asked), and the combined numbers."""

    identity_tier: str
    context: tuple[tuple[str, bool], ...]
    rationale: str

    @property
    def score(self) -> float:
        """The identity tier's weight times the fraction of context criteria satisfied."""
        satisfied = [ok for _, ok in self.context]
        fraction = sum(satisfied) / len(satisfied) if satisfied else 1.0
        return IDENTITY_TIERS[self.identity_tier] * fraction

    @property
    def passed(self) -> bool:
        """Whether the identity is exact and every context criterion is satisfied."""
        return self.identity_tier == "exact" and all(ok for _, ok in self.context)


def parse_generation_output(obj: Any, criteria: Sequence[str] = ()) -> GenerationVerdict:
    """A `GenerationVerdict`; with `criteria` given, results are matched in order, missing ones count as not
    satisfied and extras are dropped.

    Raises:
        ValueError: not an object, or an identity tier outside IDENTITY_TIERS (the message lists them).
    """
    if not isinstance(obj, Mapping):
        raise ValueError(f"generation judge output must be a JSON object, got {type(obj).__name__}")
    tier = str(obj.get("identity_tier", "")).strip().lower()
    if tier not in IDENTITY_TIERS:
        raise ValueError(f"identity_tier {obj.get('identity_tier')!r} is not one of {list(IDENTITY_TIERS)}")
    raw = obj.get("context") or []
    if not isinstance(raw, list):
        raise ValueError(f"context must be a list, got {type(raw).__name__}")
    judged = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or "satisfied" not in item:
            raise ValueError(f"context[{i}] must be an object with 'satisfied', got {str(item)[:80]!r}")
        judged.append((str(item.get("criterion", "")), kscore.parse_flag(item["satisfied"], f"context[{i}].satisfied")))
    if criteria:
        judged = [(c, judged[i][1] if i < len(judged) else False) for i, c in enumerate(criteria)]
    return GenerationVerdict(identity_tier=tier, context=tuple(judged), rationale=str(obj.get("rationale", "")))


def _labelled(text: str, labels: Sequence[str]) -> str:
    lines = [text, "", "Images, in order:"] + [f"{i + 1}. {label}" for i, label in enumerate(labels)]
    return "\n".join(lines)


class SearchJudge:
    """Pass/fail: does a selected reference show the exact target (not a sibling), visibly enough?

    Args:
        client: chat client of the judge model.
        prompt_path: a rubric file to use instead of the packaged `savanna_search` rubric.
    """

    def __init__(self, client: chat.ChatClient, *, prompt_path: str | os.PathLike | None = None,
                 max_attempts: int = judge.DEFAULT_MAX_ATTEMPTS):
        self.judge = judge.VLMJudge(client, rubric=judge.load_rubric(prompt_path or "savanna_search"),
                                    schema_name="savanna_search", schema=SEARCH_SCHEMA, validate=parse_search_output,
                                    max_attempts=max_attempts)

    @staticmethod
    def _inputs(prompt: str, target: str, references: Mapping[str, media.ImageLike], answer_text: str,
                ground_truth: Sequence[media.ImageLike]) -> tuple[str, list[media.ImageLike]]:
        if not references:
            raise ValueError("the search judge needs at least one selected reference image")
        labels = [f"ground-truth image {i + 1} of the target" for i in range(len(ground_truth))]
        labels += [f"selected reference {img_id}" for img_id in references]
        text = f"User request: {prompt}\n\nTrue target: {target}\n\nSearcher's answer:\n{answer_text}"
        return _labelled(text, labels), [*ground_truth, *references.values()]

    def judge_search(self, prompt: str, target: str, references: Mapping[str, media.ImageLike], *,
                     answer_text: str = "", ground_truth: Sequence[media.ImageLike] = ()) -> judge.Verdict[SearchVerdict]:
        """Judges one search outcome; `references` maps img_id → the selected image. Raises judge.JudgeError."""
        return self.judge.judge(*self._inputs(prompt, target, references, answer_text, ground_truth))

    async def ajudge_search(self, prompt: str, target: str, references: Mapping[str, media.ImageLike], *,
                            answer_text: str = "", ground_truth: Sequence[media.ImageLike] = ()
                            ) -> judge.Verdict[SearchVerdict]:
        """The async `judge_search`. Raises judge.JudgeError."""
        return await self.judge.ajudge(*self._inputs(prompt, target, references, answer_text, ground_truth))


class GenerationJudge:
    """Identity tier + context criteria of a generated image (see the module docstring for the score).

    Args:
        client: chat client of the judge model.
        prompt_path: a rubric file to use instead of the packaged `savanna_generation` rubric.
    """

    def __init__(self, client: chat.ChatClient, *, prompt_path: str | os.PathLike | None = None,
                 max_attempts: int = judge.DEFAULT_MAX_ATTEMPTS):
        self.rubric = judge.load_rubric(prompt_path or "savanna_generation")
        self.client, self.max_attempts = client, max_attempts

    def _judge(self, criteria: Sequence[str]) -> judge.VLMJudge[GenerationVerdict]:
        return judge.VLMJudge(self.client, rubric=self.rubric, schema_name="savanna_generation",
                              schema=GENERATION_SCHEMA, validate=lambda obj: parse_generation_output(obj, criteria),
                              max_attempts=self.max_attempts)

    @staticmethod
    def _inputs(prompt: str, target: str, generated: media.ImageLike, criteria: Sequence[str],
                ground_truth: Sequence[media.ImageLike]) -> tuple[str, list[media.ImageLike]]:
        text = f"User request: {prompt}\n\nTrue target: {target}\n\nContext criteria:\n"
        text += "\n".join(f"- {c}" for c in criteria) if criteria else "(none given; derive them from the request)"
        labels = [f"ground-truth image {i + 1} of the target" for i in range(len(ground_truth))] + ["generated image"]
        return _labelled(text, labels), [*ground_truth, generated]

    def judge_generation(self, prompt: str, target: str, generated: media.ImageLike, *,
                         criteria: Sequence[str] = (),
                         ground_truth: Sequence[media.ImageLike] = ()) -> judge.Verdict[GenerationVerdict]:
        """Judges one generated image. Raises judge.JudgeError."""
        return self._judge(criteria).judge(*self._inputs(prompt, target, generated, criteria, ground_truth))

    async def ajudge_generation(self, prompt: str, target: str, generated: media.ImageLike, *,
                                criteria: Sequence[str] = (), ground_truth: Sequence[media.ImageLike] = ()
                                ) -> judge.Verdict[GenerationVerdict]:
        """The async `judge_generation`. Raises judge.JudgeError."""
        return await self._judge(criteria).ajudge(*self._inputs(prompt, target, generated, criteria, ground_truth))
