"""Category-driven prompt synthesis, as Gen-Searcher builds its training prompts.

Two sources, both ending in `records.Prompt`s de-duplicated with `dedupe.Deduper` (stage ledgers under
`<run>/stages/`, kept prompts in `<run>/category_prompts.jsonl`):

- `category`: for each of Gen-Searcher's 20 categories, `calls_per_category` requests to an LLM for
  `prompts_per_call` multi-hop, search-intensive prompts (`datagen/prompts/category.md`: the subject is reached
  through a chain of facts that one search cannot give). Each call names its batch number, so calls differ (and
  replay from the chat cache exactly).
- `qa`: information-seeking question / answer pairs (Gen-Searcher converts deep-research QA sets, mostly news)
  turned by the LLM into a prompt asking for a grounded depiction of what the question is about, without the answer
  (`datagen/prompts/qa_to_prompt.md`).

`TemplateCategoryWriter` is the offline stand-in: its multi-hop prompts ask for the edition a series released after
a named earlier one (two hops: find the series' releases, then the one that followed), over the world's
subcategories mapped onto Gen-Searcher's categories (`WORLD_CATEGORIES`, ours); `world_questions` makes the
matching question / answer pairs. Each carries the world's `target_id`, so the exact ground truth follows.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ranger_jax.datagen import dedupe, extract, ledger, records, stages, taxonomy
from ranger_jax.env.sim import catalog
from ranger_jax.env.sim import pages as sim_pages
from ranger_jax.env.sim import world as world_lib
from ranger_jax.rewards import judge

PROMPTS_FILE = "category_prompts.jsonl"
CATEGORY_SCHEMA = {
    "type": "object",
    "properties": {"prompts": {"type": "array", "items": {
        "type": "object", "properties": {"prompt": {"type": "string"}, "answer": {"type": "string"},
                                         "hops": {"type": "array", "items": {"type": "string"}}},
        "required": ["prompt", "answer", "hops"], "additionalProperties": False}}},
    "required": ["prompts"], "additionalProperties": False,
}
QA_SCHEMA = {"type": "object", "properties": {"usable": {"type": "boolean"}, "prompt": {"type": "string"},
                                               "reason": {"type": "string"}},
             "required": ["usable", "prompt", "reason"], "additionalProperties": False}
# The offline world's subcategories under Gen-Searcher's categories (our mapping; the world has no others).
WORLD_CATEGORIES = {
    "anime key visuals": "Anime", "album covers": "Art", "film posters": "Film", "video game covers": "Game",
    "team kits": "Sports", "match balls": "Sports", "racing helmets": "Sports", "sneakers": "Industry",
    "handbags": "Industry", "hoodies": "Culture", "smartphones": "Industry", "cars": "Engineering",
    "watches": "Industry", "festival posters": "Posters", "postage stamps": "History", "book covers": "Art",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class CategoryConfig:
    """How many category prompts are asked for."""

    today: dt.date  # the day the prompts are asked on
    categories: tuple[str, ...] = taxonomy.GEN_SEARCHER_CATEGORIES
    calls_per_category: int = 2
    prompts_per_call: int = 5
    dedupe_threshold: float = 0.7
    concurrency: int = 8

    def __post_init__(self):
        for name in ("calls_per_category", "prompts_per_call", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CategoryConfig.{name} must be a positive int, got {value!r}")


def _validate_prompts(obj: Any) -> list[dict[str, Any]]:
    if not isinstance(obj, Mapping) or not isinstance(obj.get("prompts"), list):
        raise ValueError(f"category writer output must be an object with a 'prompts' list, got {str(obj)[:120]!r}")
    out = []
    for item in obj["prompts"]:
        if isinstance(item, Mapping) and isinstance(item.get("prompt"), str) and item["prompt"].strip():
            out.append({"prompt": item["prompt"].strip(), "answer": str(item.get("answer") or ""),
                        "hops": [str(h) for h in item.get("hops") or []]})
    if not out:
        raise ValueError("category writer returned no usable prompt")
    return out


def _validate_qa(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, Mapping) or not isinstance(obj.get("usable"), bool):
        raise ValueError(f"QA converter output must be an object with a boolean 'usable', got {str(obj)[:120]!r}")
    if obj["usable"] and not (isinstance(obj.get("prompt"), str) and obj["prompt"].strip()):
        raise ValueError("QA converter said usable but gave no prompt")
    return {"usable": obj["usable"], "prompt": str(obj.get("prompt") or "").strip(),
            "reason": str(obj.get("reason") or "")}


def _category_prompt(category: str, text: str, answer: str, hops: Sequence[str], today: dt.date, *,
                     mode: str = "category", source: str = "", target_id: str | None = None) -> records.Prompt:
    return records.Prompt(id=records.prompt_id(mode, category, text), prompt=text, target=answer, mode=mode,
                          date=today.isoformat(), today=today.isoformat(), category=category, source_headline=source,
                          target_id=target_id, evidence={"hops": list(hops)})


class LLMCategoryWriter:
    """Category prompts and QA conversions written by an OpenAI-compatible model.

    Args:
        client: the writer's chat client for the category stage (`services.RecordingChat`).
        today: the day the prompts are asked on.
        qa_client: the client QA conversions go through (the qa stage's; default `client`).
    """

    def __init__(self, client: Any, *, today: dt.date, qa_client: Any = None,
                 max_attempts: int = judge.DEFAULT_MAX_ATTEMPTS):
        self.today = today
        self.categories = judge.VLMJudge(client, rubric=records.instructions("category"),
                                         schema_name="category_prompts", schema=CATEGORY_SCHEMA,
                                         validate=_validate_prompts, max_tokens=4096, max_attempts=max_attempts)
        self.qa = judge.VLMJudge(qa_client or client, rubric=records.instructions("qa_to_prompt"),
                                 schema_name="qa_prompt", schema=QA_SCHEMA, validate=_validate_qa, max_tokens=1024,
                                 max_attempts=max_attempts)

    async def write(self, category: str, batch: int, count: int) -> list[records.Prompt]:
        """`count` prompts for `category` (batch number `batch`). Raises judge.JudgeError."""
        text = f"Category: {category}\nBatch: {batch + 1}\nWrite {count} prompts."
        verdict = await self.categories.ajudge(text)
        return [_category_prompt(category, p["prompt"], p["answer"], p["hops"], self.today)
                for p in verdict.value[:count]]

    async def convert(self, row: Mapping[str, Any]) -> records.Prompt | extract.Drop:
        """The image prompt of one QA row (`question`, `answer`, optional `category`), or a Drop."""
        verdict = await self.qa.ajudge(f"Question: {row['question']}\nAnswer: {row['answer']}")
        if not verdict.value["usable"]:
            return extract.Drop("unusable_question", verdict.value["reason"])
        category = str(row.get("category") or "news")
        return _category_prompt(category, verdict.value["prompt"], str(row["answer"]), [str(row["question"])],
                                self.today, mode="qa", source=str(row["question"]))


def _pairs(the_world: world_lib.World) -> list[tuple[world_lib.Entity, world_lib.Entity]]:
    """(earlier, next) editions of the same series and variant, by release date; stable order."""
    lines: dict[tuple[str, str], list[world_lib.Entity]] = {}
    for e in the_world.entities.values():
        if getattr(e, "status", "release") == "release":
            lines.setdefault((e.family, e.variant, getattr(e, "tag", "")), []).append(e)
    out = []
    for key in sorted(lines):
        line = sorted(lines[key], key=lambda e: (e.released, e.id))
        out.extend(zip(line, line[1:]))
    return out


def world_questions(the_world: world_lib.World) -> list[dict[str, Any]]:
    """Question / answer pairs about the world: which edition followed a named one (ids stable)."""
    return [{"id": f"q_{newer.id}", "question": f"Which {newer.variant} {newer.noun} did {newer.family} release after "
                                                f"the {sim_pages.full_name(older)}?",
             "answer": sim_pages.full_name(newer), "category": WORLD_CATEGORIES.get(newer.subcategory, "Culture"),
             "target_id": newer.id} for older, newer in _pairs(the_world)]


class TemplateCategoryWriter:
    """The offline stand-in (see the module docstring); deterministic.

    Args:
        the_world: the offline world.
        today: the day the prompts are asked on (default the world's `today`).
    """

    def __init__(self, the_world: world_lib.World, *, today: dt.date | None = None):
        self.world, self.today = the_world, today or the_world.today
        self._contexts = {sc.name: sc.contexts for sc in catalog.SUBCATEGORIES}

    def _text(self, older: world_lib.Entity, newer: world_lib.Entity, key: str) -> str:
        rng = random.Random(int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:16], 16))
        context = rng.choice(self._contexts.get(newer.subcategory, (extract.DEFAULT_CONTEXT,)))
        return (f"{rng.choice(extract.OPENERS)} the {newer.variant} {newer.noun} that {newer.family} released after "
                f"its {older.edition} edition, {context}.")

    async def write(self, category: str, batch: int, count: int) -> list[records.Prompt]:
        """Up to `count` multi-hop prompts for `category` (its batch `batch` of the world's pairs)."""
        pairs = [(o, n) for o, n in _pairs(self.world) if WORLD_CATEGORIES.get(n.subcategory) == category]
        chosen = pairs[batch * count:(batch + 1) * count]
        return [_category_prompt(category, self._text(o, n, n.id), sim_pages.full_name(n),
                                 [f"the {sim_pages.full_name(o)}", "the edition its series released next"],
                                 self.today, target_id=n.id) for o, n in chosen]

    async def convert(self, row: Mapping[str, Any]) -> records.Prompt | extract.Drop:
        """The image prompt of a `world_questions` row, or a Drop (`unknown_target`)."""
        newer = self.world.entities.get(str(row.get("target_id")))
        older = next((o for o, n in _pairs(self.world) if newer is not None and n.id == newer.id), None)
        if newer is None or older is None:
            return extract.Drop("unknown_target", f"row {row.get('id')!r} names no release of the world")
        return _category_prompt(str(row.get("category") or "Culture"), self._text(older, newer, f"qa{newer.id}"),
                                str(row["answer"]), [str(row["question"])], self.today, mode="qa",
                                source=str(row["question"]), target_id=newer.id)


def plan(config: CategoryConfig, num_questions: int = 0, *, offline: bool = False,
         stage_dir: Path | None = None) -> dict[str, Any]:
    """The calls category synthesis still has to make (batches and questions an earlier run finished excluded)."""
    def finished(name: str) -> int:
        path = stage_dir / f"{name}.jsonl" if stage_dir is not None else None
        return len(ledger.Ledger(path)) if path is not None and path.is_file() else 0

    writer = "template" if offline else "llm"
    batches = [f"{c}|{b}" for c in config.categories for b in range(config.calls_per_category)]
    done = ledger.Ledger(stage_dir / "category.jsonl") if stage_dir is not None and \
        (stage_dir / "category.jsonl").is_file() else None
    return {"category": {f"{writer} calls": sum(1 for k in batches if done is None or not done.done(k))},
            "qa": {f"{writer} calls at most": max(0, num_questions - finished("qa"))}}


async def synthesize(run_dir: str | Path, config: CategoryConfig, writer: Any, report: stages.Report, *,
                     questions: Sequence[Mapping[str, Any]] = (), progress: bool = True) -> list[records.Prompt]:
    """Runs both sources (module docstring); returns the kept prompts (also in `category_prompts.jsonl`)."""
    run_dir = Path(run_dir)
    batches = [(f"{c}|{b}", (c, b)) for c in config.categories for b in range(config.calls_per_category)]
    category_ledger = ledger.Ledger(run_dir / "stages" / "category.jsonl")

    async def write(spec: tuple[str, int]) -> stages.Outcome:
        written = await writer.write(spec[0], spec[1], config.prompts_per_call)
        return ("kept" if written else "dropped", "written" if written else "no_prompts",
                {"prompts": [p.to_record() for p in written]})

    stats = await stages.run_stage("category", category_ledger, batches, write, concurrency=config.concurrency,
                                   progress=progress)
    report.add_ledger("category", category_ledger, stats)
    candidates = [records.Prompt.from_record(r) for key, _ in batches
                  if (e := category_ledger.get(key)) is not None for r in e.record["prompts"]]

    qa_ledger = ledger.Ledger(run_dir / "stages" / "qa.jsonl")

    async def convert(row: Mapping[str, Any]) -> stages.Outcome:
        result = await writer.convert(row)
        if isinstance(result, extract.Drop):
            return "dropped", result.reason, {"detail": result.detail}
        return "kept", "converted", {"prompt": result.to_record()}

    if questions:
        stats = await stages.run_stage("qa", qa_ledger, [(str(r["id"]), r) for r in questions], convert,
                                       concurrency=config.concurrency, progress=progress)
        report.add_ledger("qa", qa_ledger, stats)
        candidates += [records.Prompt.from_record(e.record["prompt"]) for r in questions
                       if (e := qa_ledger.get(str(r["id"]))) is not None and e.status == "kept"]

    deduper, kept, dropped = dedupe.Deduper(config.dedupe_threshold), [], {}
    for prompt in candidates:
        duplicate = deduper.offer(prompt.id, prompt.prompt, prompt.target)
        if duplicate is None:
            kept.append(dataclasses.replace(prompt, keep_reason=f"{prompt.mode} prompt, no near-duplicate"))
        else:
            dropped[duplicate[0]] = dropped.get(duplicate[0], 0) + 1
    report.add_counts("category_dedupe", {"unique": len(kept)}, dropped)
    ledger.write_jsonl(run_dir / PROMPTS_FILE, [p.to_record() for p in kept])
    return kept
