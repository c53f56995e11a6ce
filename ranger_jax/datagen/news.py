"""News retrieval for prompt synthesis: a meta query inside a one-day window, live from Serper `/news` or from the
offline world's dated pages, both giving Serper-shaped rows.

A query is restricted to one day with Google's custom date range (`day_window`: `cdr:1,cd_min:M/D/Y,cd_max:M/D/Y`,
US date order — ISO dates make the filter fail silently), so every headline it returns was published that day; a
`NewsItem` keeps the day as `published` (Serper's own `date` is relative text such as "3 hours ago").

`WorldNews` serves the same shape from an offline world: the world's text search, limited to pages published that
day, keeping the pages whose headline names a release (its full name, e.g. "First look: the Zorvan FC 2026 Home
kit"). Each row carries what the world knows and the web would not say: `release_ids`, the releases the headline
names (first the one it names first). The offline request writer and the exact confusion filter read it; nothing
that stands in for the web does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Mapping
from typing import Any, Protocol

from ranger_jax.datagen import calls
from ranger_jax.env.backends import offline
from ranger_jax.env.sim import pages as sim_pages
from ranger_jax.env.sim import world as world_lib


def day_window(day: dt.date) -> str:
    """The `tbs` filter of exactly one day: `cdr:1,cd_min:M/D/YYYY,cd_max:M/D/YYYY`."""
    stamp = f"{day.month}/{day.day}/{day.year}"
    return f"cdr:1,cd_min:{stamp},cd_max:{stamp}"


def news_days(end: dt.date, num_days: int) -> list[dt.date]:
    """The `num_days` days ending with `end`, newest first.

    Raises:
        ValueError: `num_days` < 1.
    """
    if isinstance(num_days, bool) or not isinstance(num_days, int) or num_days < 1:
        raise ValueError(f"num_days must be a positive int, got {num_days!r}")
    return [end - dt.timedelta(days=i) for i in range(num_days)]


@dataclasses.dataclass(frozen=True)
class NewsItem:
    """One headline found by a meta query.

    Attributes:
        title, link, snippet, source, image_url, date_text, position: Serper's row (`imageUrl`, `date`).
        published: the day the query was restricted to (YYYY-MM-DD).
        query, domain, subcategory: the meta query that found it and its subcategory.
        release_ids: offline only: the world's releases the headline names (empty for live news).
        also: other subcategories whose meta queries found the same headline (a headline is read once).
    """

    title: str
    link: str
    snippet: str
    source: str
    image_url: str | None
    date_text: str
    position: int
    published: str
    query: str
    domain: str
    subcategory: str
    release_ids: tuple[str, ...] = ()
    also: tuple[str, ...] = ()

    @property
    def subcategories(self) -> tuple[str, ...]:
        """Every subcategory that found it: its own first."""
        return (self.subcategory, *self.also)

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, published: dt.date, query: str, domain: str,
                 subcategory: str) -> NewsItem:
        """A NewsItem from a Serper `news[]` row (missing text fields become "")."""
        def text(key: str) -> str:
            value = row.get(key)
            return value.strip() if isinstance(value, str) else ""

        position = row.get("position")
        return cls(title=text("title"), link=text("link"), snippet=text("snippet"), source=text("source"),
                   image_url=text("imageUrl") or None, date_text=text("date"),
                   position=position if isinstance(position, int) and not isinstance(position, bool) else 0,
                   published=published.isoformat(), query=query, domain=domain, subcategory=subcategory,
                   release_ids=tuple(row.get("release_ids") or ()))

    def to_record(self) -> dict[str, Any]:
        """The item as a JSON record."""
        return {**dataclasses.asdict(self), "release_ids": list(self.release_ids), "also": list(self.also)}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> NewsItem:
        """The inverse of `to_record`."""
        return cls(**{**record, "release_ids": tuple(record.get("release_ids") or ()),
                      "also": tuple(record.get("also") or ())})


class NewsSource(Protocol):
    """Serper-shaped news rows for a query restricted to one day."""

    async def rows(self, query: str, day: dt.date, *, num: int, stage: str) -> list[dict[str, Any]]:
        """Up to `num` `news[]` rows published on `day` (recorded under `stage`)."""


class SerperNews:
    """Live news: Serper `/news` with the one-day window.

    Args:
        serper: a `services.RecordingSerper` (or anything with `news_rows(query, num=, tbs=)`).
    """

    def __init__(self, serper: Any):
        self.serper = serper

    async def rows(self, query: str, day: dt.date, *, num: int, stage: str) -> list[dict[str, Any]]:
        """Serper's rows for `query` on `day`. Raises base.BackendError."""
        return await self.serper.news_rows(query, num=num, tbs=day_window(day))


def _relative(day: dt.date, today: dt.date) -> str:
    days = (today - day).days
    return "today" if days <= 0 else "1 day ago" if days == 1 else f"{days} days ago"


def release_names(the_world: world_lib.World) -> list[tuple[str, str]]:
    """(full name, entity id) of every release of the world (leaks and fan mock-ups are no releases), longest
    name first so that a name is never matched inside a longer one."""
    named = [(sim_pages.full_name(e), e.id) for e in the_world.entities.values()
             if getattr(e, "status", "release") == "release"]
    return sorted(named, key=lambda pair: (-len(pair[0]), pair[1]))


def named_releases(title: str, names: list[tuple[str, str]]) -> tuple[str, ...]:
    """Ids of the releases `title` names, in the order it names them (each span counted once)."""
    found, taken = [], []
    for name, entity_id in names:
        start = title.find(name)
        while start >= 0:
            end = start + len(name)
            if not any(s < end and start < e for s, e in taken):
                taken.append((start, end))
                found.append((start, entity_id))
                break
            start = title.find(name, start + 1)
    return tuple(entity_id for _, entity_id in sorted(found))


class WorldNews:
    """Offline news: the world's pages of one day whose headline names a release (see the module docstring).

    Args:
        backend: the world's `OfflineBackend` (its text search ranks the pages).
        recorder: where the searches are recorded (service "world").
    """

    def __init__(self, backend: offline.OfflineBackend, recorder: calls.Recorder):
        self.backend, self.recorder = backend, recorder
        self.world = backend.world
        self._names = release_names(self.world)

    async def rows(self, query: str, day: dt.date, *, num: int, stage: str) -> list[dict[str, Any]]:
        """Serper-shaped rows (plus `release_ids`) of the day's pages that name a release, best match first."""
        started = time.monotonic()
        tbs = day_window(day)
        hits = await self.backend.text_search(query, top_k=min(num, offline.MAX_TOP_K), tbs=tbs)
        rows = []
        for hit in hits:
            page = self.world.pages[hit.url]
            releases = named_releases(page.title, self._names)
            if getattr(page, "error", None) or not releases:
                continue
            row = {"title": page.title, "link": page.url, "snippet": hit.snippet,
                   "date": _relative(day, self.world.today), "source": page.url.split("/")[2],
                   "position": len(rows) + 1, "release_ids": list(releases)}
            if page.image_urls:
                row["imageUrl"] = page.image_urls[0]
            rows.append(row)
        self.recorder.record(stage=stage, service="world", endpoint="news", request={"q": query, "num": num,
                                                                                      "tbs": tbs},
                             response=rows, latency_s=time.monotonic() - started)
        return rows
