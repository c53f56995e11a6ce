"""The contract every search/fetch backend implements (live Serper web, offline corpus).

Backends are async (many episodes share one backend in a rollout); results are plain frozen dataclasses.
A backend raises `BackendError` (or a subclass) with a message fit to show the policy; the tool layer turns
it into an observation.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Protocol, runtime_checkable


class BackendError(Exception):
    """A search or fetch failed in a way the policy should be told about."""


class SearchUnavailable(BackendError):
    """The search service cannot be used (e.g. no API key configured)."""


@dataclasses.dataclass(frozen=True)
class TextHit:
    title: str
    url: str
    snippet: str
    date: str | None = None  # ISO YYYY-MM-DD when known, else the service's text
    position: int = 0  # 1-based rank


@dataclasses.dataclass(frozen=True)
class ImageHit:
    title: str
    image_url: str
    page_url: str | None = None
    source: str | None = None  # site name or domain
    width: int | None = None
    height: int | None = None
    position: int = 0


@dataclasses.dataclass(frozen=True)
class Page:
    url: str  # final URL after redirects
    title: str
    text: str  # main text, markdown or plain
    date: str | None = None


@dataclasses.dataclass(frozen=True)
class FetchedImage:
    url: str
    data: bytes  # encoded image bytes as served
    content_type: str | None = None
    page_url: str | None = None


@runtime_checkable
class Backend(Protocol):
    """Search and fetch for the tools. `tbs` is Google's date filter syntax (see `parse_tbs`)."""

    async def text_search(self, query: str, *, top_k: int, tbs: str | None = None) -> list[TextHit]: ...

    async def image_search(self, query: str, *, top_k: int, tbs: str | None = None) -> list[ImageHit]: ...

    async def fetch_page(self, url: str) -> Page: ...

    async def fetch_image(self, url: str, *, page_url: str | None = None) -> FetchedImage: ...

    async def aclose(self) -> None: ...


_QDR_DAYS = {"h": 1 / 24, "d": 1, "w": 7, "m": 31, "y": 366}
_CDR = re.compile(r"^cdr:1,cd_min:(\d{1,2})/(\d{1,2})/(\d{4}),cd_max:(\d{1,2})/(\d{1,2})/(\d{4})$")
_QDR = re.compile(r"^qdr:([hdwmy])(\d*)$")


def parse_tbs(tbs: str, today: dt.date) -> tuple[dt.date, dt.date]:
    """Inclusive (start, end) dates of a Serper/Google `tbs` filter relative to `today`.

    Accepts `qdr:h|d|w|m|y` with an optional count (`qdr:m6`) and
    `cdr:1,cd_min:MM/DD/YYYY,cd_max:MM/DD/YYYY` (US date order, as Google expects).

    Raises:
        ValueError: naming the `tbs` value when it is neither form.
    """
    text = tbs.strip()
    if m := _QDR.match(text):
        unit, count = m.group(1), int(m.group(2) or 1)
        days = max(1, int(round(_QDR_DAYS[unit] * count)))
        return today - dt.timedelta(days=days), today
    if m := _CDR.match(text):
        mm0, dd0, yy0, mm1, dd1, yy1 = (int(g) for g in m.groups())
        try:
            return dt.date(yy0, mm0, dd0), dt.date(yy1, mm1, dd1)
        except ValueError as err:
            raise ValueError(f"tbs {tbs!r} has an impossible date: {err}") from err
    raise ValueError(
        f"tbs {tbs!r} is not a date filter; use 'qdr:d|w|m|y' or 'cdr:1,cd_min:MM/DD/YYYY,cd_max:MM/DD/YYYY'"
    )
