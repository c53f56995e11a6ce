"""WISE (PKU-YuanGroup/WISE): the judge of one generated image and WiScore, per prompt and per benchmark.

This is the scoring of the paper's WiScore (the repository's `WISE_legacy/`; later versions of its scripts retry
unreadable replies and score a re-numbered "verified" prompt set with a binary score).

Per prompt (`gpt_eval.py`): a GPT-4o-class judge at temperature 0 reads the prompt, its explanation and the image
and writes three integer scores 0–2, read by the published regular expression

    \\*{0,2}(Consistency|Realism|Aesthetic Quality)\\*{0,2}\\s*[::]?\\s*(\\d)      (case-insensitive)

A score the reply does not contain, and every score of a call that failed for good, is recorded as `FAILED` (999),
as the published script records it. Then

    WiScore = (0.7·Consistency + 0.2·Realism + 0.1·Aesthetic Quality) / 2          in [0, 1]

Benchmark (`Calculate.py`): each prompt counts in the category its `prompt_id` falls in (`CATEGORY_RANGES`:
CULTURE 1–400, TIME 401–567, SPACE 568–700, BIOLOGY 701–800, PHYSICS 801–900, CHEMISTRY 901–1000; other ids are
skipped with a warning); a category's WiScore is the mean over its prompts, and

    overall = 0.4·CULTURE + 0.167·TIME + 0.133·SPACE + 0.1·BIOLOGY + 0.1·PHYSICS + 0.1·CHEMISTRY

is given only when every prompt id expected is scored and every category has prompts. A 999 makes the scores file
unusable (the published per-category scripts refuse it): rows with 999 are left out of the means and the run is
marked invalid, with no overall. A prompt without an image is not judged (its row is absent), so the run is
incomplete.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from ranger_jax.clients import chat, http, media
from ranger_jax.rewards import judge

log = logging.getLogger(__name__)

FAILED = 999  # the published placeholder of a score that could not be read
SCORE_KEYS = ("consistency", "realism", "aesthetic_quality")
WEIGHTS = {"consistency": 0.7, "realism": 0.2, "aesthetic_quality": 0.1}
SCORE_PATTERN = re.compile(r"\*{0,2}(Consistency|Realism|Aesthetic Quality)\*{0,2}\s*[::]?\s*(\d)", re.IGNORECASE)
CATEGORY_RANGES = {"CULTURE": (1, 400), "TIME": (401, 567), "SPACE": (568, 700), "BIOLOGY": (701, 800),
                   "PHYSICS": (801, 900), "CHEMISTRY": (901, 1000)}
CATEGORIES = tuple(CATEGORY_RANGES)
OVERALL_WEIGHTS = {"CULTURE": 0.4, "TIME": 0.167, "SPACE": 0.133, "BIOLOGY": 0.1, "PHYSICS": 0.1, "CHEMISTRY": 0.1}
MAX_TOKENS = 2000  # gpt_eval.py
SYSTEM_PROMPT = ("You are an expert auditor of generated images. Grade each image strictly by the protocol you are "
                 "given.")
RUBRIC = judge.RUBRICS_DIR / "wise.md"


def extract_scores(text: str) -> dict[str, float]:
    """The three scores of a judge reply, `FAILED` for any the reply lacks (a later mention wins, as published)."""
    scores: dict[str, float] = {key: FAILED for key in SCORE_KEYS}
    for name, digit in SCORE_PATTERN.findall(text):
        scores[name.lower().replace(" ", "_")] = float(digit)
    return scores


def wiscore(consistency: float, realism: float, aesthetic_quality: float) -> float:
    """(0.7·C + 0.2·R + 0.1·A) / 2."""
    return (WEIGHTS["consistency"] * consistency + WEIGHTS["realism"] * realism
            + WEIGHTS["aesthetic_quality"] * aesthetic_quality) / 2


def category_of(prompt_id: int) -> str | None:
    """The WISE category of a prompt id (`CATEGORY_RANGES`), or None outside them."""
    for name, (low, high) in CATEGORY_RANGES.items():
        if low <= prompt_id <= high:
            return name
    return None


def load_template(prompt_path: str | os.PathLike | None = None) -> str:
    """The judge's user text with `{prompt}` and `{explanation}` slots: the packaged one, or a user's file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a file without both slots.
    """
    text = judge.load_rubric(prompt_path or RUBRIC)
    missing = [slot for slot in ("{prompt}", "{explanation}") if slot not in text]
    if missing:
        raise ValueError(f"WISE judge template {prompt_path or RUBRIC} lacks the slots {missing}")
    return text


@dataclasses.dataclass(frozen=True)
class WiseVerdict:
    """One judged image: the three scores (`FAILED` where unreadable), the reply, and why it failed if it did."""

    consistency: float
    realism: float
    aesthetic_quality: float
    evaluation: str
    error: str | None = None

    @property
    def failed(self) -> bool:
        """Whether any score is `FAILED` (the published scorer then refuses the file)."""
        return FAILED in (self.consistency, self.realism, self.aesthetic_quality)

    @property
    def wiscore(self) -> float | None:
        """The prompt's WiScore, None when a score is missing."""
        return None if self.failed else wiscore(self.consistency, self.realism, self.aesthetic_quality)


class WiseJudge:
    """The WISE judge over an OpenAI-compatible chat endpoint (the published one is gpt-4o-2024-05-13).

    Args:
        client: the judge model's chat client (its own retries cover transport failures).
        prompt_path: a template file (with `{prompt}` and `{explanation}`) replacing the packaged rubric.
    """

    def __init__(self, client: chat.ChatClient, *, prompt_path: str | os.PathLike | None = None):
        self.client, self.template = client, load_template(prompt_path)

    def messages(self, prompt: str, explanation: str, image: media.ImageLike) -> list[dict[str, Any]]:
        """The system line, then the protocol with the prompt and explanation, then the image (lossless PNG)."""
        text = self.template.replace("{prompt}", prompt).replace("{explanation}", explanation)
        return [{"role": "system", "content": [chat.text_part(SYSTEM_PROMPT)]},
                {"role": "user", "content": [chat.text_part(text),
                                             chat.image_part(image, fmt="PNG", max_side=None)]}]

    async def ajudge(self, prompt: str, explanation: str, image: media.ImageLike) -> WiseVerdict:
        """Judges one image; never raises for the endpoint: a failed call gives `FAILED` scores and its error."""
        try:
            result = await self.client.acomplete(self.messages(prompt, explanation, image), temperature=0.0,
                                                 max_tokens=MAX_TOKENS)
        except http.ClientError as err:
            return WiseVerdict(FAILED, FAILED, FAILED, evaluation="", error=f"judge endpoint failed: {err}")
        scores = extract_scores(result.content)
        missing = [key for key in SCORE_KEYS if scores[key] == FAILED]
        error = f"the reply has no {', '.join(missing)} score" if missing else None
        return WiseVerdict(**scores, evaluation=result.content, error=error)


def _check_row(index: int, row: Any) -> tuple[int, list[float]]:
    if not isinstance(row, Mapping):
        raise ValueError(f"WISE score row {index} must be an object, got {type(row).__name__}")
    prompt_id = row.get("prompt_id")
    if isinstance(prompt_id, bool) or not isinstance(prompt_id, int):
        raise ValueError(f"WISE score row {index}: prompt_id must be an integer, got {prompt_id!r}")
    values = []
    for key in SCORE_KEYS:
        value = row.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"WISE score row {index} (prompt_id {prompt_id}): {key} must be a number, got {value!r}")
        values.append(float(value))
    return prompt_id, values


def aggregate(rows: Iterable[Mapping[str, Any]], *, expected_ids: Collection[int] | None = None) -> dict[str, Any]:
    """WiScore of a benchmark run from its score rows (the published `*_scores.jsonl` rows).

    Args:
        rows: `{"prompt_id", "consistency", "realism", "aesthetic_quality", …}`, one per judged prompt.
        expected_ids: the prompt ids of the benchmark files evaluated (None: the ids of `rows`).

    Returns:
        `{category: {"wiscore", "count"}}` for each category with valid rows, `"overall"`: `{"wiscore", "count"}`
        (wiscore None unless valid, complete and covering all six categories), `"valid"` (no 999),
        `"complete"` (every expected id scored), `"missing_ids"` and `"failed_ids"` (rows with a 999).

    Raises:
        ValueError: a row that is not an object, or an id or score that is not a number (naming the row).
    """
    per_category: dict[str, list[float]] = {name: [] for name in CATEGORIES}
    seen, failed = set(), []
    for index, row in enumerate(rows):
        prompt_id, values = _check_row(index, row)
        seen.add(prompt_id)
        if FAILED in values:
            failed.append(prompt_id)
            continue
        category = category_of(prompt_id)
        if category is None:
            log.warning("WISE prompt_id %d is outside every category; skipped", prompt_id)
            continue
        per_category[category].append(wiscore(*values))
    missing = sorted(set(expected_ids if expected_ids is not None else seen) - seen)
    summary: dict[str, Any] = {name: {"wiscore": sum(v) / len(v), "count": len(v)}
                               for name, v in per_category.items() if v}
    valid, complete = not failed, not missing
    overall = None
    if valid and complete and all(per_category.values()):
        overall = sum(OVERALL_WEIGHTS[name] * summary[name]["wiscore"] for name in CATEGORIES)
    summary["overall"] = {"wiscore": overall, "count": sum(len(v) for v in per_category.values())}
    summary.update(valid=valid, complete=complete, missing_ids=missing, failed_ids=sorted(failed))
    return summary
