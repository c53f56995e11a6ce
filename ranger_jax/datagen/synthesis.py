"""News-driven prompt synthesis, as Savanna builds its benchmark: headlines → requests → confusion filter.

Stages (each resumable, with its own ledger under `<run>/stages/`):

1. `news`: every meta query of every subcategory, for every day of the window, restricted to that one day.
2. `headlines` (in memory): the unique headlines, in query order (a link found twice is counted once).
3. `extract`: the writer turns each headline into a text-oriented request (or drops it: off topic, no target).
4. `dedupe` (in memory): near-duplicate requests and repeated targets removed (`dedupe.Deduper`).
5. `confusion`: the image search for each request, labelled; kept only when crowded (`confusion.CrowdRule`).
6. `extract_image`: for each text-oriented request dropped as too easy, the writer proposes a target seen in the
   news photo instead (when `image_fallback`), de-duplicated against everything kept so far,
7. `confusion_image`: and filtered the same way.

The kept prompts, each with its date, domain, subcategory, source headline and URL, the reason it was kept and the
filter's evidence, are written to `<run>/prompts.jsonl`. A `Toolkit` supplies the three services: live (Serper news,
LLM writer, VLM-judged filter) or offline (the world's news, the template writer, the exact filter).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import Any

from ranger_jax.datagen import confusion, dedupe, extract, ledger, news, records, stages, taxonomy

PROMPTS_FILE = "prompts.jsonl"
STAGE_DIR = "stages"


@dataclasses.dataclass(frozen=True, kw_only=True)
class NewsConfig:
    """What the news-driven synthesis searches and how it filters."""

    end: dt.date  # the last day of the news window (the day requests are asked on)
    num_days: int = 7  # days of news, ending with `end`
    headlines_per_query: int = 10  # news results read per meta query and day
    rule: confusion.CrowdRule = confusion.CrowdRule()
    dedupe_threshold: float = 0.7  # word-shingle Jaccard at which two requests are near-duplicates
    image_fallback: bool = True  # propose image-oriented targets for requests that were too easy
    concurrency: int = 8  # items in flight per stage

    def __post_init__(self):
        news.news_days(self.end, self.num_days)  # checks num_days
        if not 1 <= self.headlines_per_query <= 20:
            raise ValueError(f"headlines_per_query must be in 1..20, got {self.headlines_per_query}")


@dataclasses.dataclass(frozen=True)
class Toolkit:
    """The services a synthesis run uses: a `news.NewsSource`, a request writer and a confusion filter."""

    source: Any
    writer: Any
    confusion: Any


def queries(config: NewsConfig, subcategories: tuple[taxonomy.Subcategory, ...]
            ) -> list[tuple[dt.date, taxonomy.Subcategory, str]]:
    """Every (day, subcategory, meta query) of the run, newest day first."""
    return [(day, sub, q) for day in news.news_days(config.end, config.num_days) for sub in subcategories
            for q in sub.meta_queries]


def _query_key(day: dt.date, sub: taxonomy.Subcategory, query: str) -> str:
    return f"{day.isoformat()}|{sub.name}|{query}"


def plan(config: NewsConfig, subcategories: tuple[taxonomy.Subcategory, ...], *, offline: bool,
         stage_dir: Path | None = None) -> dict[str, Any]:
    """The calls the synthesis still has to make, per stage and service: exact for the news searches (and for
    request writing once every search is done), upper bounds after that. Items an earlier run finished (read from
    the ledgers in `stage_dir`) are not counted."""
    def done(name: str) -> ledger.Ledger | None:
        path = stage_dir / f"{name}.jsonl" if stage_dir is not None else None
        return ledger.Ledger(path) if path is not None and path.is_file() else None

    specs = queries(config, subcategories)
    news_ledger = done("news")
    finished = [news_ledger.get(_query_key(*s)) for s in specs] if news_ledger else [None] * len(specs)
    news_todo = sum(e is None for e in finished)
    links = {r["link"] for e in finished if e is not None for r in e.record["items"]}
    headlines = len(links) + news_todo * config.headlines_per_query
    extract_ledger, filter_ledger = done("extract"), done("confusion")
    image_ledger, image_filter_ledger = done("extract_image"), done("confusion_image")

    def count(book: ledger.Ledger | None, status: str | None = None) -> int:
        return 0 if book is None else sum(1 for e in book.entries() if status is None or e.status == status)

    extract_todo = max(0, headlines - count(extract_ledger))
    filter_todo = max(0, count(extract_ledger, "kept") + extract_todo - count(filter_ledger))
    image_todo = 0 if not config.image_fallback else max(
        0, count(filter_ledger, "dropped") + filter_todo - count(image_ledger))
    image_filter_todo = max(0, count(image_ledger, "kept") + image_todo - count(image_filter_ledger))
    search, writer = ("world", "template") if offline else ("serper", "llm")
    bound = "" if news_todo == 0 else " at most"

    def filtering(todo: int) -> dict[str, int]:
        out = {f"{search} image searches at most": todo}
        if not offline:
            out.update({"judge calls at most": todo, "image downloads at most": todo * config.rule.top_k})
        return out

    return {"news": {f"{search} news searches": news_todo},
            "extract": {f"{writer} calls{bound}": extract_todo},
            "confusion": filtering(filter_todo),
            "extract_image": {f"{writer} calls at most": image_todo,
                              **({} if offline else {"image downloads at most": image_todo})},
            "confusion_image": filtering(image_filter_todo)}


def _keep_reason(prompt: records.Prompt, evidence: dict[str, Any]) -> str:
    head = "image-oriented target (the named one was too easy); " if prompt.mode == "image" else ""
    return (f"{head}crowded: {evidence['confusable']} confusable vs {evidence['target']} clean target results in "
            f"the top {evidence['results']}")


async def synthesize(run_dir: str | Path, config: NewsConfig, subcategories: tuple[taxonomy.Subcategory, ...],
                     toolkit: Toolkit, report: stages.Report, *, progress: bool = True) -> list[records.Prompt]:
    """Runs the stages of the module docstring; returns the kept prompts (also written to `prompts.jsonl`)."""
    run_dir = Path(run_dir)
    stage_dir = run_dir / STAGE_DIR
    specs = queries(config, subcategories)

    news_ledger = ledger.Ledger(stage_dir / "news.jsonl")

    async def fetch(spec: tuple[dt.date, taxonomy.Subcategory, str]) -> stages.Outcome:
        day, sub, query = spec
        rows = await toolkit.source.rows(query, day, num=config.headlines_per_query, stage="news")
        items = [news.NewsItem.from_row(r, published=day, query=query, domain=sub.domain, subcategory=sub.name)
                 for r in rows]
        items = [i for i in items if i.link and i.title]
        return ("kept" if items else "dropped", "headlines" if items else "no_headlines",
                {"items": [i.to_record() for i in items]})

    stats = await stages.run_stage("news", news_ledger, [(_query_key(*s), s) for s in specs], fetch,
                                   concurrency=config.concurrency, progress=progress)
    report.add_ledger("news", news_ledger, stats)

    headlines = _headlines(news_ledger, specs, report)
    by_link = {item.link: item for item in headlines}

    extract_ledger = ledger.Ledger(stage_dir / "extract.jsonl")

    async def write(item: news.NewsItem) -> stages.Outcome:
        result = await toolkit.writer.text_request(item)
        if isinstance(result, extract.Drop):
            return "dropped", result.reason, {"detail": result.detail}
        return "kept", "written", {"prompt": result.to_record()}

    stats = await stages.run_stage("extract", extract_ledger, [(i.link, i) for i in headlines], write,
                                   concurrency=config.concurrency, progress=progress)
    report.add_ledger("extract", extract_ledger, stats)
    candidates = [records.Prompt.from_record(e.record["prompt"]) for i in headlines
                  if (e := extract_ledger.get(i.link)) is not None and e.status == "kept"]

    deduper = dedupe.Deduper(config.dedupe_threshold)
    unique = _dedupe(deduper, candidates, report, "dedupe")
    kept = await _filter(stage_dir / "confusion.jsonl", "confusion", unique, toolkit, config, report, progress)

    if config.image_fallback:
        filtered = ledger.Ledger(stage_dir / "confusion.jsonl")
        rejected = [p for p in unique if (e := filtered.get(p.id)) is not None and e.status == "dropped"]
        image_ledger = ledger.Ledger(stage_dir / "extract_image.jsonl")

        async def write_image(prompt: records.Prompt) -> stages.Outcome:
            result = await toolkit.writer.image_request(by_link[prompt.source_url], prompt)
            if isinstance(result, extract.Drop):
                return "dropped", result.reason, {"detail": result.detail}
            return "kept", "written", {"prompt": result.to_record()}

        stats = await stages.run_stage("extract_image", image_ledger, [(p.id, p) for p in rejected], write_image,
                                       concurrency=config.concurrency, progress=progress)
        report.add_ledger("extract_image", image_ledger, stats)
        image_candidates = [records.Prompt.from_record(e.record["prompt"]) for p in rejected
                            if (e := image_ledger.get(p.id)) is not None and e.status == "kept"]
        unique_images = _dedupe(deduper, image_candidates, report, "dedupe_image")
        kept += await _filter(stage_dir / "confusion_image.jsonl", "confusion_image", unique_images, toolkit, config,
                              report, progress)

    ledger.write_jsonl(run_dir / PROMPTS_FILE, [p.to_record() for p in kept])
    return kept


def _headlines(news_ledger: ledger.Ledger, specs: list[tuple[dt.date, taxonomy.Subcategory, str]],
               report: stages.Report) -> list[news.NewsItem]:
    """The unique headlines in query order; a headline found again by another subcategory's query lists that
    subcategory in `also` (the writer decides which one it belongs to)."""
    first: dict[str, news.NewsItem] = {}
    also: dict[str, list[str]] = {}
    repeated = 0
    for spec in specs:
        entry = news_ledger.get(_query_key(*spec))
        for record in entry.record["items"] if entry is not None else ():
            item = news.NewsItem.from_record(record)
            if item.link not in first:
                first[item.link], also[item.link] = item, []
                continue
            repeated += 1
            if item.subcategory != first[item.link].subcategory and item.subcategory not in also[item.link]:
                also[item.link].append(item.subcategory)
    headlines = [dataclasses.replace(item, also=tuple(also[link])) for link, item in first.items()]
    report.add_counts("headlines", {"unique": len(headlines)}, {"duplicate_link": repeated} if repeated else {})
    return headlines


def _dedupe(deduper: dedupe.Deduper, prompts: list[records.Prompt], report: stages.Report,
            stage: str) -> list[records.Prompt]:
    unique, dropped = [], {}
    for prompt in prompts:
        duplicate = deduper.offer(prompt.id, prompt.prompt, prompt.target)
        if duplicate is None:
            unique.append(prompt)
        else:
            dropped[duplicate[0]] = dropped.get(duplicate[0], 0) + 1
    report.add_counts(stage, {"unique": len(unique)}, dropped)
    return unique


async def _filter(path: Path, stage: str, prompts: list[records.Prompt], toolkit: Toolkit, config: NewsConfig,
                  report: stages.Report, progress: bool) -> list[records.Prompt]:
    filter_ledger = ledger.Ledger(path)

    async def judge(prompt: records.Prompt) -> stages.Outcome:
        kept, reason, evidence = await toolkit.confusion.judge(prompt, stage=stage)
        return ("kept" if kept else "dropped"), reason, {"evidence": evidence}

    stats = await stages.run_stage(stage, filter_ledger, [(p.id, p) for p in prompts], judge,
                                   concurrency=config.concurrency, progress=progress)
    report.add_ledger(stage, filter_ledger, stats)
    kept = []
    for prompt in prompts:
        entry = filter_ledger.get(prompt.id)
        if entry is not None and entry.status == "kept":
            evidence = entry.record["evidence"]
            kept.append(dataclasses.replace(prompt, keep_reason=_keep_reason(prompt, evidence), evidence=evidence))
    return kept
