"""Ground-truth images and quality filtering, as Gen-Searcher builds its SFT and RL sets.

For every kept teacher trajectory, the image generator receives the grounded prompt (the answer's `gen_prompt`) and
the references the answer cites (the PNGs the policy saw, in the answer's order) with a pinned seed; the image is
saved as `<run>/groundtruth/images/<task id>.png`. Then a judge scores the sample from six perspectives, each 0, 0.5
or 1 (None when it does not apply): `needs_search` (the prompt really needs a web search), `correctness` (right
subject, real features), `faithfulness` (follows the prompt), `aesthetics`, `text_rendering` and `safety`, and says
whether the search evidence is consistent (references and grounded prompt agree on one subject).

`QualityRule` drops, in this order: `too_long` (the trajectory has more tokens than the SFT cut-off),
`inconsistent_search`, then `low_<perspective>` for the first score under its minimum. The rest are kept (`passed`).

- `JudgeQuality` (live): a VLM judge with the rubric `datagen/prompts/quality.md`, shown the references and the image.
- `ExactQuality` (offline world): `needs_search` = 1 unless the plain image search for the prompt shows the target
  cleanly as its first result; `correctness` = the exact search judgement of the references; `faithfulness` = the
  exact text score of the grounded prompt (key attributes named, sibling-only ones not); `aesthetics` and
  `text_rendering` = None (the offline generator is a collage, nothing to judge); `safety` = 1; consistent when no
  reference shows a sibling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ranger_jax import fileio
from ranger_jax.data import trajectory
from ranger_jax.datagen import confusion, ledger as ledger_lib, records, stages
from ranger_jax.rewards import judge, kscore

DIMENSIONS = ("needs_search", "correctness", "faithfulness", "aesthetics", "text_rendering", "safety")
DEFAULT_MINIMUM = {"needs_search": 0.5, "correctness": 1.0, "faithfulness": 0.5, "aesthetics": 0.5,
                   "text_rendering": 0.5, "safety": 1.0}
SFT_CUTOFF_TOKENS = 32768  # LLaMA-Factory cutoff_len of Gen-Searcher's SFT
IMAGES_DIR = "groundtruth/images"
QUALITY_SCHEMA = {
    "type": "object",
    "properties": {"rationale": {"type": "string"},
                   **{d: {"type": ["number", "null"] if d == "text_rendering" else "number"} for d in DIMENSIONS},
                   "consistent_search": {"type": "boolean"}},
    "required": ["rationale", *DIMENSIONS, "consistent_search"], "additionalProperties": False,
}


@dataclasses.dataclass(frozen=True)
class Quality:
    """A sample's scores by perspective (None: not applicable or not judged), its consistency and the rationale."""

    scores: Mapping[str, float | None]
    consistent: bool
    rationale: str = ""

    def to_record(self) -> dict[str, Any]:
        """JSON."""
        return {"scores": dict(self.scores), "consistent": self.consistent, "rationale": self.rationale}


@dataclasses.dataclass(frozen=True, kw_only=True)
class QualityRule:
    """Which samples are kept (see the module docstring)."""

    minimum: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_MINIMUM))
    max_tokens: int = SFT_CUTOFF_TOKENS
    require_consistent: bool = True

    def __post_init__(self):
        unknown = sorted(set(self.minimum) - set(DIMENSIONS))
        if unknown:
            raise ValueError(f"QualityRule.minimum names unknown perspectives {unknown}; known: {list(DIMENSIONS)}")

    def verdict(self, quality: Quality, num_tokens: int) -> tuple[bool, str]:
        """(kept, reason) of one sample."""
        if num_tokens > self.max_tokens:
            return False, "too_long"
        if self.require_consistent and not quality.consistent:
            return False, "inconsistent_search"
        for dim in DIMENSIONS:
            score = quality.scores.get(dim)
            if score is not None and dim in self.minimum and score < self.minimum[dim]:
                return False, f"low_{dim}"
        return True, "passed"


def cited_references(traj: trajectory.Trajectory) -> list[bytes]:
    """The PNGs of the images the answer cites, in the answer's order (ids the trajectory lacks are skipped)."""
    if traj.answer is None:
        return []
    pictures = {image.img_id: image.png for image in traj.images if image.img_id}
    return [pictures[ref.img_id] for ref in traj.answer.reference_images if ref.img_id in pictures]


def _parse_quality(obj: Any) -> Quality:
    if not isinstance(obj, Mapping):
        raise ValueError(f"quality judge output must be an object, got {type(obj).__name__}")
    scores: dict[str, float | None] = {}
    for dim in DIMENSIONS:
        value = obj.get(dim)
        if value is None and dim == "text_rendering":
            scores[dim] = None
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"quality judge score {dim!r} must be a number, got {value!r}")
        scores[dim] = min(1.0, max(0.0, float(value)))
    return Quality(scores=scores, consistent=kscore.parse_flag(obj.get("consistent_search"), "consistent_search"),
                   rationale=str(obj.get("rationale", "")))


class JudgeQuality:
    """Live quality scores from a VLM judge (see the module docstring).

    Args:
        client: the judge's chat client for the stage (`services.RecordingChat`).
    """

    def __init__(self, client: Any, max_attempts: int = judge.DEFAULT_MAX_ATTEMPTS):
        self.judge = judge.VLMJudge(client, rubric=records.instructions("quality"), schema_name="sample_quality",
                                    schema=QUALITY_SCHEMA, validate=_parse_quality, max_tokens=2048,
                                    max_attempts=max_attempts)

    async def score(self, prompt: records.Prompt, traj: trajectory.Trajectory, image: bytes) -> Quality:
        """The judge's scores. Raises judge.JudgeError."""
        references = cited_references(traj)
        text = (f"User prompt: {prompt.prompt}\nGrounded prompt: {traj.answer.gen_prompt if traj.answer else ''}\n"
                f"{len(references)} reference image(s) follow, then the ground-truth image.")
        return (await self.judge.ajudge(text, [*references, image])).value


class ExactQuality:
    """Offline quality from the exact judgements (see the module docstring).

    Args:
        exact: the run's `confusion.ExactConfusion` (it runs the plain image search for `needs_search`).
    """

    def __init__(self, exact: confusion.ExactConfusion):
        self.exact = exact

    async def score(self, prompt: records.Prompt, traj: trajectory.Trajectory, image: bytes) -> Quality:
        """Exact scores of one offline sample."""
        hits = await self.exact.backend.image_search(prompt.prompt, top_k=1)
        first = ""
        if hits and prompt.target_id is not None:
            first = self.exact.label(self.exact.world.images[hits[0].image_url], prompt.target_id,
                                     self.exact.siblings(prompt.target_id))
        breakdown = dict(traj.reward_breakdown.get("breakdown") or {})
        references = breakdown.get("references") or []
        scores = {"needs_search": 0.0 if first == "target" else 1.0,
                  "correctness": 1.0 if breakdown.get("search_pass") else 0.0,
                  "faithfulness": float(breakdown.get("text_score", 0.0)),
                  "aesthetics": None, "text_rendering": None, "safety": 1.0}
        consistent = not any(ref.get("shown_siblings") for ref in references)
        return Quality(scores=scores, consistent=consistent,
                       rationale=f"exact: first image result is {first or 'missing'}; "
                                 f"{breakdown.get('sim_reason', 'no judgement')}")


async def run_groundtruth(run_dir: str | Path, samples: Sequence[tuple[records.Prompt, trajectory.Trajectory]], *,
                          generator: Any, quality: Any, rule: QualityRule = QualityRule(), seed: int = 0,
                          concurrency: int = 4, report: stages.Report | None = None,
                          progress: bool = True) -> ledger_lib.Ledger:
    """Generates and scores every unfinished sample (module docstring); returns the stage's ledger.

    Args:
        run_dir: the run's folder (`stages/groundtruth.jsonl`, `groundtruth/images/`).
        samples: (prompt, kept teacher trajectory) pairs; the prompt id is the task id.
        generator: `services.RecordingGenerator` (live) or any `clients.images.Generator` (offline: the compositor).
        quality: `JudgeQuality` or `ExactQuality`.
        rule: which samples are kept.
        seed: the generator's pinned seed.
        concurrency: samples in flight.
        report: where the stage's counts go.
        progress: show a progress bar.
    """
    run_dir = Path(run_dir)
    ledger = ledger_lib.Ledger(run_dir / "stages" / "groundtruth.jsonl")

    async def one(sample: tuple[records.Prompt, trajectory.Trajectory]) -> stages.Outcome:
        prompt, traj = sample
        if traj.answer is None:
            return "dropped", "no_answer", {}
        result = await generator.agenerate(traj.answer.gen_prompt, cited_references(traj), seed=seed)
        if not result.ok or result.image is None:
            return "dropped", "generation_failed", {"error": result.error}
        relative = f"{IMAGES_DIR}/{prompt.id}.png"
        fileio.write_atomic(run_dir / relative, result.image)
        scored = await quality.score(prompt, traj, result.image)
        kept, reason = rule.verdict(scored, len(traj.token_ids))
        return ("kept" if kept else "dropped"), reason, {"image": relative, "num_tokens": len(traj.token_ids),
                                                         "generation": dict(result.request), **scored.to_record()}

    stats = await stages.run_stage("groundtruth", ledger, [(p.id, (p, t)) for p, t in samples], one,
                                   concurrency=concurrency, progress=progress)
    if report is not None:
        report.add_ledger("groundtruth", ledger, stats)
    return ledger
