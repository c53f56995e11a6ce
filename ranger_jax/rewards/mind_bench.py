"""Mind-Bench (PicoTrex/Mind-Brush `eval.py`): the checklist judge of one image and the all-checks pass rate.

Per item: a judge (published: gemini-3-pro-preview over an OpenAI-compatible API, temperature 0, JSON output)
reads the item's checklist, the generated image and, when the item has one, the ground-truth reference image
(`World_Knowledge.image`), and answers `{"results": [bool, …]}` in checklist order. Missing entries are padded with
false and extra ones dropped; a reply that cannot be read, or a call that fails, makes every entry false. An item
with an empty checklist is not judged and does not pass.

    passed(item) = all(results) and len(results) > 0
    accuracy     = passed items / items

Temperatures get the published ±3 °C (±5.4 °F) tolerance, stated in the rubric; everything else must be exact.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ranger_jax.clients import chat, http, media
from ranger_jax.rewards import judge, kscore

RUBRIC = judge.RUBRICS_DIR / "mind_bench.md"
MAX_TOKENS = 4096
GENERATED_LABEL = "--- Generated Image (Target) ---"
REFERENCE_LABEL = "--- Reference Image (Ground Truth) ---"


def checklist_text(checklist: Sequence[str]) -> str:
    """The checklist as the judge reads it: a header, then one numbered line per item."""
    return "Checklist to Verify:\n" + "".join(f"{i + 1}. {item}\n" for i, item in enumerate(checklist))


def parse_results(obj: Any, num_checks: int) -> list[bool]:
    """The judge's `results` fitted to the checklist: padded with false, extras dropped.

    Raises:
        ValueError: not an object with a `results` list, or an entry that is not a boolean (true/false, 1/0).
    """
    if not isinstance(obj, Mapping) or not isinstance(obj.get("results", []), list):
        raise ValueError(f"Mind-Bench judge output must be an object with a 'results' list, got {str(obj)[:120]!r}")
    results = [kscore.parse_flag(value, f"results[{i}]") for i, value in enumerate(obj.get("results", []))]
    return (results + [False] * num_checks)[:num_checks]


@dataclasses.dataclass(frozen=True)
class ChecklistVerdict:
    """The per-check results (in checklist order), whether the item passed, the reply, and any error."""

    results: tuple[bool, ...]
    raw: str = ""
    error: str | None = None

    @property
    def passed(self) -> bool:
        """True when the checklist is not empty and every check holds."""
        return bool(self.results) and all(self.results)


class ChecklistJudge:
    """Mind-Bench's judge over an OpenAI-compatible chat endpoint.

    Args:
        client: the judge model's chat client (its own retries cover transport failures).
        prompt_path: a rubric file replacing the packaged `mind_bench.md`.
    """

    def __init__(self, client: chat.ChatClient, *, prompt_path: str | os.PathLike | None = None):
        self.client, self.rubric = client, judge.load_rubric(prompt_path or RUBRIC)

    def messages(self, checklist: Sequence[str], generated: media.ImageLike,
                 reference: media.ImageLike | None = None) -> list[dict[str, Any]]:
        """The rubric, then the checklist, the labelled generated image and the labelled reference (lossless)."""
        parts = [chat.text_part(checklist_text(checklist)), chat.text_part(GENERATED_LABEL),
                 chat.image_part(generated, fmt="PNG", max_side=None)]
        if reference is not None:
            parts += [chat.text_part(REFERENCE_LABEL), chat.image_part(reference, fmt="PNG", max_side=None)]
        return [{"role": "system", "content": self.rubric}, {"role": "user", "content": parts}]

    async def ajudge(self, checklist: Sequence[str], generated: media.ImageLike,
                     reference: media.ImageLike | None = None) -> ChecklistVerdict:
        """Judges one image against its checklist; never raises for the endpoint or the reply (both give all
        false, with the error recorded)."""
        if not checklist:
            return ChecklistVerdict(results=(), error="the item has an empty checklist")
        failed = (False,) * len(checklist)
        try:
            result = await self.client.acomplete(self.messages(checklist, generated, reference), temperature=0.0,
                                                 max_tokens=MAX_TOKENS, response_format={"type": "json_object"})
        except http.ClientError as err:
            return ChecklistVerdict(results=failed, error=f"judge endpoint failed: {err}")
        try:
            return ChecklistVerdict(results=tuple(parse_results(result.json(), len(checklist))), raw=result.content)
        except ValueError as err:
            return ChecklistVerdict(results=failed, raw=result.content, error=f"unreadable judge reply: {err}")


def _type_of(index: int, row: Any) -> tuple[str, bool]:
    if not isinstance(row, Mapping):
        raise ValueError(f"Mind-Bench result row {index} must be an object, got {type(row).__name__}")
    passed = row.get("Eval")
    if not isinstance(passed, bool):
        raise ValueError(f"Mind-Bench result row {index} (ID {row.get('ID')!r}): Eval must be true or false, "
                         f"got {passed!r}")
    return str(row.get("Type", "")), passed


def aggregate(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """All-checks pass rate of result rows (the published `eval.py` rows: `Type`, `ID`, `Eval`, …), one row per
    benchmark item (an item that was never judged carries `Eval: false`).

    Returns:
        `{"overall": {"accuracy", "passed", "count"}, "<Type>": {...}, …}` with types in first-seen order.

    Raises:
        ValueError: a row that is not an object or whose `Eval` is not a boolean (naming the row).
    """
    counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for index, row in enumerate(rows):
        kind, passed = _type_of(index, row)
        for key in ("overall", kind):
            counts[key][0] += passed
            counts[key][1] += 1
    counts.setdefault("overall", [0, 0])
    return {key: {"accuracy": passed / count if count else 0.0, "passed": passed, "count": count}
            for key, (passed, count) in sorted(counts.items(), key=lambda kv: kv[0] != "overall")}
