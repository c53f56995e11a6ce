"""The records that travel between data-generation stages: a proposed prompt and the instructions the models get.

A `Prompt` is what synthesis produces and every later stage reads: the request text, what it asks for, and the
metadata the published datasets carry — the date, domain / subcategory (or Gen-Searcher category), the source
headline and URL, how it was made (`mode`), and the reason it was kept. Offline prompts also carry the world's
`target_id`, from which the exact ground truth is built.

The instructions sent to the LLM and the judges live in `datagen/prompts/<name>.md` (package data), written in our
own words; `instructions(name)` reads one.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PROMPTS_DIR = Path(__file__).parent / "prompts"
INSTRUCTIONS = ("request_text", "request_image", "confusion", "category", "qa_to_prompt", "quality")
MODES = ("text", "image", "category", "qa")


def instructions(name: str) -> str:
    """The text of a packaged instruction file.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if name not in INSTRUCTIONS:
        raise ValueError(f"unknown instructions {name!r}; known: {list(INSTRUCTIONS)}")
    return (PROMPTS_DIR / f"{name}.md").read_text("utf-8")


def prompt_id(*parts: str) -> str:
    """A stable id from the parts that define a prompt (source, target, mode): `p` + 12 hex digits."""
    return "p" + hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:12]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prompt:
    """One synthesised prompt (see the module docstring).

    Attributes:
        id: stable id (`prompt_id`).
        prompt: the request a user would type.
        target: what it asks for, in words (a name, or a description for image-oriented targets).
        mode: "text" (named in a headline), "image" (seen in a news photo), "category" (Gen-Searcher category) or
            "qa" (an information-seeking question turned into a prompt).
        date: when its source was published (YYYY-MM-DD).
        today: the date the request is asked on (the system prompt's date).
        domain, subcategory: Savanna's domain and subcategory ("" for category prompts).
        category: the category K-Score groups by (Gen-Searcher's, or the subcategory for news prompts).
        source_headline, source_url: the headline and page it came from ("" when none).
        keep_reason: why it survived the filters (set by the filter that kept it).
        target_id: offline only: the world entity it asks for.
        evidence: what the filters measured (e.g. confusion counts), JSON.
    """

    id: str
    prompt: str
    target: str
    mode: str
    date: str
    today: str
    domain: str = ""
    subcategory: str = ""
    category: str = ""
    source_headline: str = ""
    source_url: str = ""
    keep_reason: str = ""
    target_id: str | None = None
    evidence: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"prompt {self.id}: mode must be one of {MODES}, got {self.mode!r}")
        if not self.prompt.strip():
            raise ValueError(f"prompt {self.id}: the request text is empty")

    def to_record(self) -> dict[str, Any]:
        """The prompt as a JSON record."""
        return {**dataclasses.asdict(self), "evidence": dict(self.evidence)}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Prompt:
        """The inverse of `to_record`."""
        return cls(**dict(record))

    def meta(self) -> dict[str, Any]:
        """The `meta` object of a published task row: KnowGen's `category` plus everything that says where the
        prompt came from and why it was kept."""
        return {"category": self.category, "domain": self.domain, "subcategory": self.subcategory, "date": self.date,
                "mode": self.mode, "target": self.target, "source_headline": self.source_headline,
                "source_url": self.source_url, "keep_reason": self.keep_reason, "evidence": dict(self.evidence)}
