"""The 5-level text reward R_text of Gen-Searcher's RL stage.

The judge sees the task prompt, the GT image, and the agent's answer rendered as TEXT: its `gen_prompt` and
its `reference_images` (img_id, title, note, page_url). Reference pixels are not shown. It answers "would a
perfect generator produce the GT from this?" with a score snapped to {0, 0.25, 0.5, 0.75, 1}.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from ranger_jax.clients import chat, media
from ranger_jax.env import core
from ranger_jax.rewards import judge, kscore

LEVELS = (0.0, 0.25, 0.5, 0.75, 1.0)
REFERENCE_FIELDS = ("title", "page_url", "url")  # what `render_answer` copies from the image facts

SCHEMA = {
    "type": "object",
    "properties": {"rationale": {"type": "string"}, "score": {"type": "number", "enum": list(LEVELS)}},
    "required": ["rationale", "score"],
    "additionalProperties": False,
}


def snap(score: float) -> float:
    """`score` clipped to [0, 1] and moved to the nearest level (a tie goes to the lower level)."""
    clipped = min(1.0, max(0.0, float(score)))
    return min(LEVELS, key=lambda level: (abs(level - clipped), level))


@dataclasses.dataclass(frozen=True)
class TextReward:
    """A judged text reward: `score` is snapped; `raw_score` is what the judge wrote (clipped)."""

    score: float
    raw_score: float
    rationale: str


def parse_judge_output(obj: Any) -> TextReward:
    """A `TextReward` from the judge's `{"rationale", "score"}`.

    Raises:
        ValueError: not an object, or `score` missing / not a number.
    """
    if not isinstance(obj, Mapping):
        raise ValueError(f"text reward judge output must be a JSON object, got {type(obj).__name__}")
    if "score" not in obj:
        raise ValueError(f"text reward judge output lacks 'score'; got keys {sorted(obj)}")
    raw = kscore.parse_score(obj["score"], "score")
    rationale = obj.get("rationale", "")
    return TextReward(score=snap(raw), raw_score=raw, rationale=rationale if isinstance(rationale, str) else str(rationale))


def render_answer(answer: core.Answer, image_facts: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The answer as the JSON text the judge reads: gen_prompt plus references with id, title, note, page_url.

    Args:
        answer: the parsed answer.
        image_facts: img_id → facts (`title`, `page_url`, `url`), e.g. from the episode's ImageRecords.
    """
    facts = image_facts or {}
    references = []
    for ref in answer.reference_images:
        entry: dict[str, Any] = {"img_id": ref.img_id}
        entry.update({k: facts.get(ref.img_id, {}).get(k) for k in REFERENCE_FIELDS
                      if facts.get(ref.img_id, {}).get(k)})
        entry["note"] = ref.note
        references.append(entry)
    return json.dumps({"gen_prompt": answer.gen_prompt, "reference_images": references}, ensure_ascii=False, indent=1)


def image_facts(records: Mapping[str, core.ImageRecord]) -> dict[str, dict[str, Any]]:
    """`render_answer`'s image facts from an episode's img_id → ImageRecord map."""
    return {img_id: {"title": r.title, "page_url": r.page_url, "url": r.url} for img_id, r in records.items()}


def request_text(prompt: str, answer: core.Answer, facts: Mapping[str, Mapping[str, Any]] | None) -> str:
    """The judge's user text: the request, a note that the image is the GT, the rendered answer."""
    return (f"User request: {prompt}\n\nThe image shown is the ground-truth (GT) image.\n\n"
            f"Agent answer:\n{render_answer(answer, facts)}")


class TextRewardJudge:
    """R_text judge: (task prompt, GT image, answer as text) → snapped score.

    Args:
        client: chat client of the judge model (Gen-Searcher: gpt-4.1).
        prompt_path: a rubric file to use instead of the packaged `text_reward` rubric.
        max_attempts: calls before giving up on unusable replies.
    """

    def __init__(self, client: chat.ChatClient, *, prompt_path: str | os.PathLike | None = None,
                 max_attempts: int = judge.DEFAULT_MAX_ATTEMPTS):
        self.judge = judge.VLMJudge(client, rubric=judge.load_rubric(prompt_path or "text_reward"),
                                    schema_name="text_reward", schema=SCHEMA, validate=parse_judge_output,
                                    max_attempts=max_attempts)

    def score(self, prompt: str, ground_truth: media.ImageLike, answer: core.Answer,
              image_facts: Mapping[str, Mapping[str, Any]] | None = None) -> judge.Verdict[TextReward]:
        """Judges one answer. Raises judge.JudgeError."""
        return self.judge.judge(request_text(prompt, answer, image_facts), [ground_truth])

    async def ascore(self, prompt: str, ground_truth: media.ImageLike, answer: core.Answer,
                     image_facts: Mapping[str, Mapping[str, Any]] | None = None) -> judge.Verdict[TextReward]:
        """The async `score`: judges one answer; raises judge.JudgeError."""
        return await self.judge.ajudge(request_text(prompt, answer, image_facts), [ground_truth])
