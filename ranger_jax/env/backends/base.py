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
    """One text search result (web or news)."""

    title: str
    url: str
    snippet: str
    date: str | None = None  # ISO YYYY-MM-DD when known, else the service's text
    position: int = 0  # 1-based rank


@dataclasses.dataclass(frozen=True)
class ImageHit:
    """One image search result: the image URL and the page it appears on."""

    title: str
    image_url: str
    page_url: str | None = None
    source: str | None = None  # site name or domain
    width: int | None = None
    height: int | None = None
    position: int = 0


@dataclasses.dataclass(frozen=True)
class Page:
    """A fetched page reduced to its main text."""

    url: str  # final URL after redirects
    title: str
    text: str  # main text, markdown or plain
    date: str | None = None


@dataclasses.dataclass(frozen=True)
class FetchedImage:
    """Image bytes a backend fetched.

    Attributes:
        url: where they came from.
        data: the encoded image bytes as served.
        content_type: the served media type, when known.
        page_url: the page that holds the image, when known.
        trusted_file: set only by a backend that generated the image itself (the offline world): a local file
            holding exactly `data`, an RGB PNG whose SHA-256 matched the backend's record of what it built. The
            image store then checks only the header and refers to that file, decoding pixels when first needed.
            Downloads from the web never set it.
    """

    url: str
    data: bytes
    content_type: str | None = None
    page_url: str | None = None
    trusted_file: str | None = None


@runtime_checkable
class Backend(Protocol):
    """Search and fetch for the tools. `tbs` is Google's date filter syntax (see `parse_tbs`)."""

    async def text_search(self, query: str, *, top_k: int, tbs: str | None = None) -> list[TextHit]:
        """Up to `top_k` web results for `query`, optionally date-filtered by `tbs`."""

    async def image_search(self, query: str, *, top_k: int, tbs: str | None = None) -> list[ImageHit]:
        """Up to `top_k` image results for `query`, optionally date-filtered by `tbs`."""

    async def fetch_page(self, url: str) -> Page:
        """The main text of the page at `url`; raises BackendError when it cannot be read."""

    async def fetch_image(self, url: str, *, page_url: str | None = None) -> FetchedImage:
        """The image at `url` (found on `page_url`, when known); raises BackendError on failure."""

    async def aclose(self) -> None:
        """Closes the backend's connections and files."""


_QDR_DAYS = {"h": 1 / 24, "d": 1, "w": 7, "m": 31, "y": 366}
_CDR = re.compile(r"^cdr:1,cd_min:(\d{1,2})/(\d{1,2})/(\d{4}),cd_max:(\d{1,2})/(\d{1,2})/(\d{4})$", re.ASCII)
_QDR = re.compile(r"^qdr:([hdwmy])([0-9]{0,4})$", re.ASCII)  # at most qdr:y9999


def parse_tbs(tbs: str, today: dt.date) -> tuple[dt.date, dt.date]:
    """Inclusive (start, end) dates of a Serper/Google `tbs` filter relative to `today`.

    Accepts `qdr:h|d|w|m|y` with an optional count of up to 4 digits (`qdr:m6`) and
    `cdr:1,cd_min:MM/DD/YYYY,cd_max:MM/DD/YYYY` (US date order, as Google expects).

    Raises:
        ValueError: naming the `tbs` value when it is neither form.
    """
    text = tbs.strip()
    if m := _QDR.match(text):
        unit, count = m.group(1), int(m.group(2) or 1)
        days = max(1, int(round(_QDR_DAYS[unit] * count)))
        try:
            return today - dt.timedelta(days=days), today
        except OverflowError:  # reaches before year 1: everything up to today
            return dt.date.min, today
    if m := _CDR.match(text):
        mm0, dd0, yy0, mm1, dd1, yy1 = (int(g) for g in m.groups())
        try:
            start, end = dt.date(yy0, mm0, dd0), dt.date(yy1, mm1, dd1)
        except ValueError as err:
            raise ValueError(f"tbs {tbs!r} has an impossible date: {err}") from err
        if start > end:
            raise ValueError(f"tbs {tbs!r} starts ({start}) after it ends ({end}); cd_min must not be after cd_max")
        return start, end
    raise ValueError(
        f"tbs {tbs!r} is not a date filter; use 'qdr:d|w|m|y' or 'cdr:1,cd_min:MM/DD/YYYY,cd_max:MM/DD/YYYY'"
    )
