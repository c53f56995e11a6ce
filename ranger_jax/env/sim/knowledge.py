"""What a reader has learned in an episode so far: search hits, pages read, and the release each subject means.

Shared by the scripted experts (`agents.ExpertAgent`, `finder_agent.PixelExpertAgent`): everything here reads
only the episode's observations (tool responses) and the request, never the world's files or the task's ground
truth. Facts come from pages the agent fetched, read with `prose.read_facts` (prose in version-2 worlds, fact
sheets in version 1); pages that hedge (leaks, rumours, fan concepts) and names no page dates are not trusted.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Any

from ranger_jax.env.sim import bm25, prose, requests
from ranger_jax.env.sim.world import Attributes

RECENT_DAYS = 45  # a release this recent counts as "new"
SEEN = "seen"  # in `releases`: the earliest date of a trusted page that names the release
_DATED = re.compile(r"^date: (\d{4}-\d{2}-\d{2})$", re.MULTILINE)
LAUNCH_CUES = re.compile(r"\b(unveils|unveiled|reveals|revealed|official|officially|first look|arrives|vs|"
                         r"what changed|side by side|goes on sale|meet|presented|is here)\b", re.IGNORECASE)
JUNK_CUES = re.compile(r"\b(where to buy|deals|everything we know|updated|gallery|pictures:|repost|leak|leaked|"
                       r"rumour|concept|fan-made|mock-up)\b", re.IGNORECASE)
_TEXT_HIT = re.compile(r"^\d+\. \[(?P<title>[^\]]*)\]\((?P<url>[^)\s]+)\)(?: \((?P<date>[^)]*)\))?"
                       r"(?:\n(?P<snippet>(?!\d+\. \[|--- ).*))?$", re.MULTILINE)
_PAGE = re.compile(r"--- page \[(?P<url>[^\]]+)\] ---\n(?P<body>.*?)\n--- end of page ---", re.DOTALL)
_LINK = re.compile(r"(?<!!)\[(?P<title>[^\]]+)\]\((?P<url>https?://[^)\s]+)\)|(?:More: |\| |^)(?P<title2>[^|\n()]+?) "
                   r"\((?P<url2>https?://[^)\s]+)\)", re.MULTILINE)
_IMAGE_REF = re.compile(r"!\[(?P<alt>[^\]]+)\]\((?P<url>[^)\s]+)\)|\[image: (?P<alt2>[^\]]+)\] (?P<url2>\S+)")


@dataclasses.dataclass(frozen=True)
class Release:
    """A release as the pages state it: its name, family, date and the visible attributes read so far."""

    name: str
    series: str
    released: str
    attributes: Attributes


def hits(turns: list[Any]) -> list[dict[str, str]]:
    """Every text-search hit of the episode, first appearance first: {title, url, date, snippet}."""
    seen, out = set(), []
    for turn in turns:
        if turn.name == "text_search":
            for m in _TEXT_HIT.finditer(turn.response):
                if m["url"] not in seen:
                    seen.add(m["url"])
                    out.append({"title": m["title"], "url": m["url"], "date": m["date"] or "",
                                "snippet": m["snippet"] or ""})
    return out


def links(turns: list[Any]) -> list[dict[str, str]]:
    """Links on the pages the episode read, as hits without date or snippet: {title, url, date, snippet}."""
    seen, out = set(), []
    for text in fetched(turns).values():
        for m in _LINK.finditer(text):
            url, title = m["url"] or m["url2"], (m["title"] or m["title2"] or "").strip()
            if url not in seen and not re.search(r"\.(?:jpg|jpeg|png)$", url):
                seen.add(url)
                out.append({"title": title, "url": url, "date": "", "snippet": ""})
    return out


def fetched(turns: list[Any]) -> dict[str, str]:
    """{url: page text} of every page the episode read (pages that failed to load are left out)."""
    out = {}
    for turn in turns:
        if turn.name == "web_fetch":
            for m in _PAGE.finditer(turn.response):
                if not m["body"].startswith("Could not read the page"):
                    out[m["url"]] = m["body"]
    return out


def asked_urls(turns: list[Any]) -> set[str]:
    """URLs the episode already tried to read (loaded or not)."""
    out = set()
    for turn in turns:
        if turn.name == "web_fetch":
            url = turn.arguments.get("url") or turn.arguments.get("urls") or []
            out.update([url] if isinstance(url, str) else url)
    return out


def family_of(subject: requests.Subject, turns: list[Any], pages: dict[str, str]) -> str | None:
    """The family a subject means: named by the request, or the one pages say its maker stands behind."""
    if subject.family is not None:
        return subject.family
    texts = [*pages.values(), *(f"{h['title']}. {h['snippet']}" for h in hits(turns))]
    for text in texts:
        for maker, family in prose.read_makers(text):
            if maker == subject.maker:
                return family
    return None


def releases(family: str, noun: str, pages: dict[str, str], found: list[dict[str, str]] = ()
             ) -> dict[str, dict[str, str]]:
    """{release name: {field: value}} that trusted pages and search snippets state about `family`'s releases
    (pages first; the first statement wins). A snippet is read as a page of its headline and that one paragraph."""
    out: dict[str, dict[str, str]] = {}
    texts = [*((text, _DATED.search(text)) for text in pages.values()),
             *((f"{h['title']}\n\n{h['snippet'].rstrip('…')}", h["date"]) for h in found)]
    for text, date in texts:
        date = date.group(1) if isinstance(date, re.Match) else date
        for fact in prose.read_facts(text, family, noun):
            if not fact.hedged:
                facts = out.setdefault(fact.name, {})
                facts.setdefault(fact.field, fact.value)
                if date and fact.name in text and (SEEN not in facts or date < facts[SEEN]):
                    facts[SEEN] = date
    return out


def _tokens(text: str) -> set[str]:
    return set(bm25.tokenize(text))


def choose(subject: requests.Subject, known: dict[str, dict[str, str]], today: dt.date
           ) -> tuple[str | None, bool]:
    """(the release name the subject means, whether the evidence settles it).

    A candidate's name holds every word the request names (family, edition, variant, tag) and no special-edition
    tag the request did not ask for. The newest one wins: the highest edition number, then the stated release
    date (else the date of the first trusted page that names it). The evidence is settled when the request gives
    the edition, or asks for something new and the winner's stated release date is recent.
    """
    wanted = {t for w in subject.name_words for t in bm25.tokenize(w)}
    tagged = {t.lower() for t in requests.TAG_WORDS} & wanted
    candidates = []
    for name, facts in known.items():
        tokens = _tokens(name)
        day = facts.get("released") or facts.get(SEEN)
        if day is None or not wanted <= tokens:
            continue
        if not tagged and tokens & {t.lower() for t in requests.TAG_WORDS}:
            continue
        edition = max((int(t) for t in re.findall(r"\b\d+\b", name)), default=0)
        candidates.append((edition, day, name))
    if not candidates:
        return None, False
    _, _, name = max(candidates)
    if subject.recent:
        stated = known[name].get("released")
        return name, stated is not None and (today - dt.date.fromisoformat(stated)).days <= RECENT_DAYS
    return name, any(w.isdigit() for w in subject.name_words)


def release_of(name: str, family: str, facts: dict[str, str]) -> Release | None:
    """The release with the attributes the pages stated ("" for an unknown colour, pattern or emblem, None for an
    unknown trim); None until at least one visible attribute is known. Without a stated release date, its date is
    a month before the first trusted page that names it (a bound for date filters)."""
    if not set(facts) & {"primary", "secondary", "pattern", "emblem", "trim"}:
        return None
    released = facts.get("released") or (dt.date.fromisoformat(facts[SEEN]) - dt.timedelta(days=30)).isoformat()
    return Release(name=name, series=family, released=released,
                   attributes=Attributes(primary=facts.get("primary", ""), secondary=facts.get("secondary", ""),
                                         pattern=facts.get("pattern", ""), emblem=facts.get("emblem", ""),
                                         trim=facts.get("trim")))


def missing_facts(facts: dict[str, str], *, fact_sheet_world: bool) -> list[str]:
    """Fact fields still unknown (a version-1 world states no trim)."""
    fields = prose.FIELDS[:5] if fact_sheet_world else prose.FIELDS
    return [f for f in fields if f not in facts]  # `SEEN` is no field: a stated release date is still missing


def picture_articles(turns: list[Any], name: str) -> list[str]:
    """Titles of trusted pages the episode read that are about release `name` and show pictures."""
    out = []
    for text in fetched(turns).values():
        title = re.match(r"(?:final url: .*\n)?title: (.*)", text)
        if title and name in text and image_refs(text) and not prose.is_hedged(text) and title.group(1) not in out:
            out.append(title.group(1))
    return out


_GENERIC = frozenset("a an the scene with among other items in and of at".split())


def failed_images(turns: list[Any]) -> set[str]:
    """URLs of pictures whose download failed in this episode (image search lists the ones it skipped)."""
    return {m.group(1) for t in turns if t.name == "image_search"
            for m in re.finditer(r"(https?://\S+?): ", t.response.split("result(s) skipped: ", 1)[-1])
            if "result(s) skipped: " in t.response}


def is_junk(hit: dict[str, str]) -> bool:
    """Whether a hit's headline marks keyword stuffing, a gallery, a repost or a rumour (no trusted facts)."""
    return bool(JUNK_CUES.search(hit["title"]))


def picture_queries(turns: list[Any], release_name: str, label_words: set[str], skip: set[str] = frozenset()
                    ) -> list[str]:
    """Words that single out the pictures trusted pages show of a release: for each picture whose alt text names
    the release's family and variant (`label_words`), the alt text's own words (the setting), release words and
    filler left out. Pictures at URLs in `skip` (failed downloads) are left out."""
    out = []
    for text in fetched(turns).values():
        if release_name not in text or prose.is_hedged(text):
            continue
        for url, alt in image_refs(text):
            if url in skip:
                continue
            words = bm25.tokenize(alt)
            if label_words <= set(words):
                rest = " ".join(w for w in words if w not in label_words and w not in _GENERIC)
                if rest and rest not in out:
                    out.append(rest)
    return out


def image_refs(text: str) -> list[tuple[str, str]]:
    """(url, alt text) of the pictures a page shows."""
    return [(m["url"] or m["url2"], m["alt"] or m["alt2"]) for m in _IMAGE_REF.finditer(text)]


_TAG_TOKENS = frozenset(t.lower() for t in requests.TAG_WORDS)


def priority(hit: dict[str, str], words: set[str], recent: bool, name: str | None = None) -> tuple:
    """How promising a search hit is for a subject's facts, best highest: no junk cues (keyword stuffing,
    rumours), the release's exact name when known, no special-edition tag the subject did not ask for, overlap
    with the subject's words, a launch headline, then recency when the request asks for something new."""
    text = f"{hit['title']} {hit['snippet']}"
    launch = any(m.group(0).lower() not in words for m in LAUNCH_CUES.finditer(hit["title"]))
    junk = bool(JUNK_CUES.search(hit["title"]))
    named = name is not None and name in text
    stray_tag = bool((_tokens(hit["title"]) & _TAG_TOKENS) - words)
    overlap = len(words & _tokens(hit["title"])) + 0.5 * len(words & _tokens(text))
    return (not junk, named, not stray_tag, overlap, launch, hit["date"] if recent else "")


@dataclasses.dataclass(frozen=True)
class Finding:
    """What the episode has established about one subject of the request.

    Attributes:
        subject: the subject as the request names it.
        family: its family (named, or found through its maker), None while unknown.
        name: the release the subject means, None while no page names a fitting one.
        sure: the evidence settles that it is this release (recent enough, or the edition was named).
        facts: what trusted pages state about that release (field -> value).
        release: the release with its attributes, once colours and pattern are known.
        missing: fact fields still unknown.
    """

    subject: requests.Subject
    family: str | None
    name: str | None
    sure: bool
    facts: dict[str, str]
    release: Release | None
    missing: tuple[str, ...]


def findings(prompt: str, turns: list[Any], today: dt.date) -> list[Finding]:
    """What the episode has established about each subject of the request `prompt`."""
    pages = fetched(turns)
    sheet_world = any("Fact sheet\nName: " in text for text in pages.values())
    out = []
    for subject in requests.parse_request(prompt):
        family = family_of(subject, turns, pages)
        known = releases(family, subject.noun, pages, hits(turns)) if family and subject.noun else {}
        name, sure = choose(subject, known, today)
        facts = known.get(name, {}) if name else {}
        release = release_of(name, family, facts) if name else None
        out.append(Finding(subject=subject, family=family, name=name, sure=sure, facts=facts, release=release,
                           missing=tuple(missing_facts(facts, fact_sheet_world=sheet_world))))
    return out
