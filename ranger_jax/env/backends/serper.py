"""Serper.dev client: Google web, image and news search (`organic`, `images` and `news` result rows).

`POST {base_url}/{search|images|news}` with `X-API-KEY`; responses are cached on disk by request body so a run
replays exactly, and an HTTP 200 carrying `message`/`error` without results counts as an error.
"""

from __future__ import annotations

import html
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

import httpx

from ranger_jax.clients import cache as cache_lib
from ranger_jax.clients import http
from ranger_jax.env.backends import base

log = logging.getLogger(__name__)

SERPER_BASE_URL = "https://google.serper.dev"
API_KEY_ENV = "SERPER_API_KEY"
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
DEFAULT_MAX_CONCURRENCY = 8  # requests in flight per event loop; Serper rate-limits bursts
MAX_NUM = 20
_RESULT_KEY = {"search": "organic", "images": "images", "news": "news"}
_TAG = re.compile(r"</?b>", re.IGNORECASE)


def clean(text: Any) -> str:
    """Serper title/snippet text without `<b>` tags and HTML entities."""
    return html.unescape(_TAG.sub("", str(text or ""))).strip()


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value)


def _str(value: Any) -> str | None:
    """A non-empty string field of a result row, else None (rows come from the network: any JSON can appear)."""
    return value.strip() if isinstance(value, str) and value.strip() else None


class SerperClient:
    """Async Serper client shared by many episodes.

    Args:
        api_key: the Serper key; None reads the environment variable `api_key_env`. A missing key is reported at
            search time.
        api_key_env: the environment variable holding the key (default `SERPER_API_KEY`).
        base_url: service root (tests point it at a loopback server).
        cache_dir: response cache folder (None: no cache).
        max_concurrency: requests in flight per event loop.
        timeout: per-request timeout.
        max_retries: retries of 429/5xx/transport errors.
        gl, hl: country and language sent with every query, when set.
    """

    def __init__(self, api_key: str | None = None, *, api_key_env: str = API_KEY_ENV, base_url: str = SERPER_BASE_URL,
                 cache_dir: str | Path | None = None, max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
                 timeout: float | httpx.Timeout = DEFAULT_TIMEOUT, max_retries: int = http.DEFAULT_MAX_RETRIES,
                 gl: str | None = None, hl: str | None = None):
        self.api_key_env = api_key_env
        self.api_key = api_key if api_key is not None else os.environ.get(api_key_env)
        self.session = http.Session(base_url, timeout=timeout, max_retries=max_retries,
                                    max_concurrency=max_concurrency)
        self.cache = cache_lib.JsonCache(cache_dir, "serper")
        self.gl, self.hl = gl, hl

    async def _post(self, endpoint: str, query: str, num: int, tbs: str | None) -> list[dict[str, Any]]:
        body: dict[str, Any] = {"q": query, "num": num}
        for key, value in (("tbs", tbs), ("gl", self.gl), ("hl", self.hl)):
            if value:
                body[key] = value
        key = {"endpoint": endpoint, "body": body}
        result_key = _RESULT_KEY[endpoint]
        if (cached := self.cache.get(key)) is not None:
            return cached.get(result_key) or []
        if not self.api_key:
            raise base.SearchUnavailable(f"web search is unavailable: no Serper API key (set {self.api_key_env})")
        url = self.session.url(endpoint)
        try:
            response = await self.session.arequest("POST", endpoint, json=body, headers={"X-API-KEY": self.api_key})
            data = http.json_body(response)
        except http.RateLimited as err:
            raise base.BackendError(f"Serper rate limit: HTTP 429 from {url} persisted after retries") from err
        except http.StatusError as err:
            message = http.error_message(err.body)[:300]
            if err.status in (401, 403):
                raise base.SearchUnavailable(f"Serper rejected the API key (HTTP {err.status} from {url}: "
                                             f"{message})") from err
            raise base.BackendError(f"Serper error: HTTP {err.status} from {url}: {message}") from err
        except http.ClientError as err:
            raise base.BackendError(f"Serper unreachable: {err}") from err
        if not isinstance(data, dict):
            raise base.BackendError(f"Serper answered {url} with a {type(data).__name__}, not an object")
        if result_key not in data and ("message" in data or "error" in data):
            message = data.get("message") or data.get("error")
            raise base.BackendError(f"Serper error from {url}: {message}")
        if not isinstance(data.get(result_key, []), list):
            raise base.BackendError(f"Serper answered {url} with a malformed {result_key!r} field")
        self.cache.put(key, data)
        return data.get(result_key) or []

    async def search(self, query: str, *, num: int = 10, tbs: str | None = None) -> list[base.TextHit]:
        """Web results (`organic`), `<b>` tags stripped.

        Raises:
            SearchUnavailable: no key, or the key was rejected.
            BackendError: rate limit, HTTP or transport failure, or an error body.
        """
        rows = await self._post("search", query, min(max(num, 1), MAX_NUM), tbs)
        return [base.TextHit(title=clean(r.get("title")), url=_str(r.get("link")), snippet=clean(r.get("snippet")),
                             date=_str(r.get("date")), position=_int(r.get("position")) or i + 1)
                for i, r in enumerate(rows) if isinstance(r, dict) and _str(r.get("link"))]

    async def news(self, query: str, *, num: int = 10, tbs: str | None = None) -> list[base.TextHit]:
        """News results; `date` is Serper's relative text ("3 days ago")."""
        rows = await self._post("news", query, min(max(num, 1), MAX_NUM), tbs)
        return [base.TextHit(title=clean(r.get("title")), url=_str(r.get("link")),
                             snippet=clean(r.get("snippet")) + (f" — {clean(r['source'])}" if _str(r.get("source"))
                                                                else ""),
                             date=_str(r.get("date")), position=_int(r.get("position")) or i + 1)
                for i, r in enumerate(rows) if isinstance(r, dict) and _str(r.get("link"))]

    async def news_rows(self, query: str, *, num: int = 10, tbs: str | None = None) -> list[dict[str, Any]]:
        """The `news[]` rows as Serper sent them (`title`, `link`, `snippet`, `date`, `source`, `imageUrl`,
        `position`), rows without a link left out: what a news-driven data pipeline reads."""
        rows = await self._post("news", query, min(max(num, 1), MAX_NUM), tbs)
        return [r for r in rows if isinstance(r, dict) and _str(r.get("link"))]

    async def images(self, query: str, *, num: int = 10, tbs: str | None = None) -> list[base.ImageHit]:
        """Image results (`images`): image URL, holding page, size."""
        rows = await self._post("images", query, min(max(num, 1), MAX_NUM), tbs)
        return [base.ImageHit(title=clean(r.get("title")), image_url=_str(r.get("imageUrl")),
                              page_url=_str(r.get("link")),
                              source=_str(r.get("source")) or _str(r.get("domain")), width=_int(r.get("imageWidth")),
                              height=_int(r.get("imageHeight")), position=_int(r.get("position")) or i + 1)
                for i, r in enumerate(rows) if isinstance(r, dict) and _str(r.get("imageUrl"))]

    async def aclose(self) -> None:
        """Closes the HTTP session."""
        await self.session.aclose()
