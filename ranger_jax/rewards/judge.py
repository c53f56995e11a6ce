"""VLM judges over an OpenAI-compatible chat endpoint: rubric loading, the judging loop, the K-Score judge.

A judge sends a system rubric and one user turn (text first, then the images as data URLs — the order
Gen-Searcher's evaluation scripts use) and asks for JSON: `json_schema` first, with the ChatClient's
fallbacks to `json_object` and plain text; the reply is parsed leniently and validated. An unusable reply is
retried with a different `seed` per attempt, so a cached run replays exactly. Transport errors are retried
by the client. Whatever still fails becomes a `JudgeError`.

Rubrics live in `rewards/rubrics/<name>.md`, written in our own words after the published criteria
(KnowGen K-Score, Gen-Searcher text reward; the Savanna judges are unofficial reimplementations). Any judge
takes `prompt_path=` to use a user's own rubric file instead.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from ranger_jax.clients import chat, http, media
from ranger_jax.rewards import kscore

RUBRICS_DIR = Path(__file__).parent / "rubrics"
RUBRICS = ("kscore", "text_reward", "savanna_search", "savanna_generation")
DEFAULT_MAX_TOKENS = 8192  # KnowGen judge setting
DEFAULT_MAX_ATTEMPTS = 3
IMAGE_MAX_SIDE = 4096  # KnowGen: longest side ≤ 4096, JPEG q100, alpha on white
IMAGE_QUALITY = 100

T = TypeVar("T")


class JudgeError(Exception):
    """The judge gave no usable verdict after all attempts (the message says why; `__cause__` has the last error)."""


def load_rubric(name_or_path: str | os.PathLike) -> str:
    """The text of a packaged rubric (`"kscore"`, …) or of a user's prompt file.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: neither a known rubric name nor a path, or an empty file (the message lists known names).
    """
    text_name = str(name_or_path)
    if text_name in RUBRICS:
        return (RUBRICS_DIR / f"{text_name}.md").read_text("utf-8")
    path = Path(name_or_path)
    if not (path.suffix or os.sep in text_name or "/" in text_name):
        raise ValueError(f"unknown rubric {text_name!r}; known: {RUBRICS}, or pass a path to a prompt file")
    if not path.is_file():
        raise FileNotFoundError(f"rubric file {path} does not exist")
    text = path.read_text("utf-8")
    if not text.strip():
        raise ValueError(f"rubric file {path} is empty")
    return text


@dataclasses.dataclass(frozen=True)
class Verdict(Generic[T]):
    """A validated judge answer.

    Attributes:
        value: what the validator made of the JSON.
        raw: the reply text it came from.
        attempts: calls it took (1 = first try).
        usage: token counts of the successful call.
    """

    value: T
    raw: str
    attempts: int
    usage: Mapping[str, int]


class VLMJudge(Generic[T]):
    """One rubric, one output schema, one validator, over a `ChatClient`.

    Args:
        client: the judge model's chat client (its cache makes runs replayable).
        rubric: the system prompt text (see `load_rubric`).
        schema_name / schema: the JSON schema of the answer (sent as `json_schema`, strict).
        validate: turns the parsed JSON into `T`; raises ValueError when it is unusable (→ retry).
        max_tokens / temperature: judge sampling (KnowGen: 8192, 0.0).
        max_attempts: calls before giving up on unusable replies.
    """

    def __init__(self, client: chat.ChatClient, *, rubric: str, schema_name: str, schema: Mapping[str, Any],
                 validate: Callable[[Any], T], max_tokens: int = DEFAULT_MAX_TOKENS, temperature: float = 0.0,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.client, self.rubric, self.validate = client, rubric, validate
        self.response_format = chat.json_schema_format(schema_name, schema)
        self.max_tokens, self.temperature, self.max_attempts = max_tokens, temperature, max_attempts

    def messages(self, text: str, images: Sequence[media.ImageLike]) -> list[dict[str, Any]]:
        """The chat messages of one judgement: the rubric, then the text and the images."""
        parts = [chat.text_part(text)]
        parts += [chat.image_part(image, max_side=IMAGE_MAX_SIDE, quality=IMAGE_QUALITY) for image in images]
        return [{"role": "system", "content": self.rubric}, {"role": "user", "content": parts}]

    def _extra(self, attempt: int) -> dict[str, Any] | None:
        return {"seed": attempt} if attempt else None  # a new seed per retry keeps cached replays exact

    def _check(self, result: chat.ChatResult, attempt: int) -> Verdict[T]:
        value = self.validate(result.json())
        return Verdict(value=value, raw=result.content, attempts=attempt + 1, usage=dict(result.usage))

    def judge(self, text: str, images: Sequence[media.ImageLike] = ()) -> Verdict[T]:
        """Asks the judge about `text` and `images`.

        Raises:
            JudgeError: no usable verdict after `max_attempts` calls, or the endpoint failed for good.
        """
        messages = self.messages(text, images)
        last: Exception | None = None
        for attempt in range(self.max_attempts):
            try:
                result = self.client.complete(messages, temperature=self.temperature, max_tokens=self.max_tokens,
                                              response_format=self.response_format, extra=self._extra(attempt))
                return self._check(result, attempt)
            except ValueError as err:
                last = err
            except http.ClientError as err:
                raise JudgeError(f"judge endpoint {self.client.url} failed: {err}") from err
        raise JudgeError(f"no usable verdict from {self.client.url} after {self.max_attempts} attempts: {last}") from last

    async def ajudge(self, text: str, images: Sequence[media.ImageLike] = ()) -> Verdict[T]:
        """Async twin of `judge`."""
        messages = self.messages(text, images)
        last: Exception | None = None
        for attempt in range(self.max_attempts):
            try:
                result = await self.client.acomplete(messages, temperature=self.temperature,
                                                     max_tokens=self.max_tokens, response_format=self.response_format,
                                                     extra=self._extra(attempt))
                return self._check(result, attempt)
            except ValueError as err:
                last = err
            except http.ClientError as err:
                raise JudgeError(f"judge endpoint {self.client.url} failed: {err}") from err
        raise JudgeError(f"no usable verdict from {self.client.url} after {self.max_attempts} attempts: {last}") from last


def _score_schema(values: Sequence[float]) -> dict[str, Any]:
    return {"type": "number", "enum": list(values)}


KSCORE_SCHEMA = {
    "type": "object",
    "properties": {"rationale": {"type": "string"},
                   **{k: _score_schema((0, 0.5, 1)) for k in kscore.DIMENSIONS},
                   "text_accuracy_na": {"type": "boolean"}},
    "required": ["rationale", *kscore.DIMENSIONS, "text_accuracy_na"],
    "additionalProperties": False,
}


def kscore_request_text(prompt: str, sample_id: str | None = None) -> str:
    """The user-turn text of a K-Score judgement (the ORIGINAL task prompt, not the agent's gen_prompt)."""
    head = f"Sample ID: {sample_id}\n" if sample_id is not None else ""
    return (f"{head}Request: {prompt}\n\nImage 1 is the generated image to grade. "
            "Image 2 is the ground-truth reference.")


class KScoreJudge:
    """KnowGen's K-Score judge: (request, generated image, GT image) → `KScore`.

    Args:
        client: chat client of the judge model (KnowGen: gpt-4.1).
        prompt_path: a rubric file to use instead of the packaged `kscore` rubric.
        max_attempts: calls before giving up on unusable replies.
    """

    def __init__(self, client: chat.ChatClient, *, prompt_path: str | os.PathLike | None = None,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS):
        self.judge = VLMJudge(client, rubric=load_rubric(prompt_path or "kscore"), schema_name="kscore",
                              schema=KSCORE_SCHEMA, validate=kscore.parse_judge_output, max_attempts=max_attempts)

    def score(self, prompt: str, generated: media.ImageLike, ground_truth: media.ImageLike, *,
              sample_id: str | None = None) -> Verdict[kscore.KScore]:
        """Judges one sample. Raises JudgeError (→ `eval_success: false`)."""
        return self.judge.judge(kscore_request_text(prompt, sample_id), [generated, ground_truth])

    async def ascore(self, prompt: str, generated: media.ImageLike, ground_truth: media.ImageLike, *,
                     sample_id: str | None = None) -> Verdict[kscore.KScore]:
        """The async `score`: judges one sample; raises JudgeError."""
        return await self.judge.ajudge(kscore_request_text(prompt, sample_id), [generated, ground_truth])
