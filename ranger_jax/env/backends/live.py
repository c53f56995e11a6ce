"""The live web backend: Serper for search, the guarded `WebFetcher` for pages and images.

A backend without a Serper key still runs (pages and images can be read), but every search answers "web search is
unavailable": it warns at construction and says so in `metadata` (which `ToolEnv.metadata` reports), and
`rollout.preflight` stops a live run before it starts.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from pathlib import Path
from typing import Any

from ranger_jax.clients import http
from ranger_jax.env.backends import base, serper, urlguard, web

# Options `env.make("live", ...)` passes to LiveBackend.
LIVE_OPTIONS = (
    "serper_api_key", "serper_api_key_env", "serper_base_url", "gl", "hl", "cache_dir", "max_concurrency", "timeout_s",
    "max_retries", "fetch_timeout_s", "fetch_max_retries", "max_page_bytes", "max_image_bytes", "min_image_bytes",
    "max_redirects", "user_agent", "jina_base_url", "jina_api_key", "allow_hosts",
)


_STRINGS = ("serper_base_url", "user_agent")
_OPTIONAL_STRINGS = ("serper_api_key", "gl", "hl", "jina_base_url", "jina_api_key")
_ENV_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECONDS = ("timeout_s", "fetch_timeout_s")
_COUNTS = {"max_concurrency": 1, "max_retries": 0, "fetch_max_retries": 0, "max_page_bytes": 1, "max_image_bytes": 1,
           "min_image_bytes": 0, "max_redirects": 0}  # option -> smallest value


def check_options(options: dict[str, Any]) -> None:
    """Checks the types and ranges of LiveBackend options.

    Raises:
        ValueError: naming the option, the value and what it must be.
    """
    for name, value in options.items():
        if name in _STRINGS and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"live backend option {name!r} must be a non-empty string; got {value!r}")
        if name in _OPTIONAL_STRINGS and value is not None and not isinstance(value, str):
            raise ValueError(f"live backend option {name!r} must be a string or None; got {value!r}")
        if name == "serper_api_key_env" and (not isinstance(value, str) or not _ENV_VAR.match(value)):
            raise ValueError(f"live backend option 'serper_api_key_env' must name an environment variable (e.g. "
                             f"\"SERPER_API_KEY\", no $); got {value!r}")
        if name == "cache_dir" and value is not None and not isinstance(value, (str, os.PathLike)):
            raise ValueError(f"live backend option 'cache_dir' must be a path or None; got {value!r}")
        if name in _SECONDS and (isinstance(value, bool) or not isinstance(value, (int, float))
                                 or not math.isfinite(value) or value <= 0):
            raise ValueError(f"live backend option {name!r} must be a positive number of seconds; got {value!r}")
        if name in _COUNTS and (isinstance(value, bool) or not isinstance(value, int) or value < _COUNTS[name]):
            raise ValueError(f"live backend option {name!r} must be an integer >= {_COUNTS[name]}; got {value!r}")


class NoSearchKey(UserWarning):
    """A live backend was built without a Serper API key: its searches cannot work."""


class LiveBackend:
    """Search with Serper, read pages and download images from the open web (URL-guarded).

    Args:
        serper_api_key: Serper key; None reads the environment variable `serper_api_key_env`. Without a key the
            backend warns (`NoSearchKey`) and every search is reported to the policy as unavailable.
        serper_api_key_env: the environment variable holding the Serper key (default `SERPER_API_KEY`).
        serper_base_url: Serper service root.
        gl, hl: Serper country and language.
        cache_dir: on-disk cache for search responses, pages and image bytes (None: no cache).
        max_concurrency: requests in flight per event loop, per service.
        timeout_s: Serper per-request timeout.
        max_retries: Serper retries.
        fetch_timeout_s: wall-clock limit of one page or image fetch.
        fetch_max_retries: retries of one page or image fetch.
        max_page_bytes, max_image_bytes, min_image_bytes: byte limits of fetched pages and images.
        max_redirects: redirect hops followed (each one guarded).
        user_agent: User-Agent of page and image requests.
        jina_base_url: read pages through a Jina reader at this root (e.g. `https://r.jina.ai`).
        jina_api_key: Bearer key for the Jina reader.
        allow_hosts: `host:port` entries exempt from the URL guard (tests only); a single string is one entry.

    Raises:
        ValueError: an option of the wrong type or out of range, naming it.
    """

    def __init__(
        self,
        *,
        serper_api_key: str | None = None,
        serper_api_key_env: str = serper.API_KEY_ENV,
        serper_base_url: str = serper.SERPER_BASE_URL,
        gl: str | None = None,
        hl: str | None = None,
        cache_dir: str | Path | None = None,
        max_concurrency: int = serper.DEFAULT_MAX_CONCURRENCY,
        timeout_s: float = 30.0,
        max_retries: int = http.DEFAULT_MAX_RETRIES,
        fetch_timeout_s: float = web.DEFAULT_FETCH_TIMEOUT_S,
        fetch_max_retries: int = web.DEFAULT_FETCH_MAX_RETRIES,
        max_page_bytes: int = web.DEFAULT_MAX_PAGE_BYTES,
        max_image_bytes: int = web.DEFAULT_MAX_IMAGE_BYTES,
        min_image_bytes: int = 0,
        max_redirects: int = web.DEFAULT_MAX_REDIRECTS,
        user_agent: str = web.DEFAULT_USER_AGENT,
        jina_base_url: str | None = None,
        jina_api_key: str | None = None,
        allow_hosts: tuple[str, ...] | list[str] | str = (),
    ):
        check_options({k: v for k, v in locals().items() if k in LIVE_OPTIONS})
        if isinstance(allow_hosts, str):
            allow_hosts = (allow_hosts,)
        if not isinstance(allow_hosts, (list, tuple)):
            raise ValueError(f"live backend option 'allow_hosts' must be a list of 'host:port' strings; "
                             f"got {allow_hosts!r}")
        self.guard = urlguard.UrlGuard(tuple(allow_hosts))
        self.search = serper.SerperClient(
            serper_api_key, api_key_env=serper_api_key_env, base_url=serper_base_url, cache_dir=cache_dir,
            max_concurrency=max_concurrency, timeout=http.as_timeout(timeout_s), max_retries=max_retries, gl=gl, hl=hl,
        )
        self.fetcher = web.WebFetcher(
            self.guard, timeout_s=fetch_timeout_s, max_page_bytes=max_page_bytes, max_image_bytes=max_image_bytes,
            min_image_bytes=min_image_bytes, max_redirects=max_redirects, max_retries=fetch_max_retries,
            max_concurrency=max_concurrency, user_agent=user_agent, jina_base_url=jina_base_url,
            jina_api_key=jina_api_key, cache_dir=cache_dir,
        )
        if not self.search.api_key:
            warnings.warn(self.search_problem, NoSearchKey, stacklevel=2)

    @property
    def search_problem(self) -> str | None:
        """Why search cannot work (no Serper key), or None."""
        if self.search.api_key:
            return None
        return (f"live backend: no Serper API key (${self.search.api_key_env} is not set), so every text_search and "
                "image_search will answer 'web search is unavailable'")

    @property
    def metadata(self) -> dict[str, Any]:
        """What this backend can do, for `ToolEnv.metadata`: the search service, whether it has a key, and its
        problems (empty when none)."""
        problem = self.search_problem
        return {"backend": "live", "search": "serper", "search_url": self.search.session.base_url,
                "search_key_env": self.search.api_key_env, "search_available": problem is None,
                "page_reader": "jina" if self.fetcher.jina_base_url else "direct",
                "problems": [problem] if problem else []}

    async def text_search(self, query: str, *, top_k: int, tbs: str | None = None) -> list[base.TextHit]:
        """Serper web search, cut to `top_k` results."""
        hits = await self.search.search(query, num=10 if top_k <= 10 else serper.MAX_NUM, tbs=tbs)
        return hits[:top_k]

    async def news_search(self, query: str, *, top_k: int, tbs: str | None = None) -> list[base.TextHit]:
        """Serper news search, cut to `top_k` results."""
        hits = await self.search.news(query, num=10 if top_k <= 10 else serper.MAX_NUM, tbs=tbs)
        return hits[:top_k]

    async def image_search(self, query: str, *, top_k: int, tbs: str | None = None) -> list[base.ImageHit]:
        """Serper image search, cut to `top_k` results."""
        hits = await self.search.images(query, num=10 if top_k <= 10 else serper.MAX_NUM, tbs=tbs)
        return hits[:top_k]

    async def fetch_page(self, url: str) -> base.Page:
        """The main text of a web page, fetched through the URL guard."""
        return await self.fetcher.fetch_page(url)

    async def fetch_image(self, url: str, *, page_url: str | None = None) -> base.FetchedImage:
        """Image bytes from the web, fetched through the URL guard."""
        return await self.fetcher.fetch_image(url, page_url=page_url)

    async def aclose(self) -> None:
        """Closes the Serper client and the web fetcher."""
        await self.search.aclose()
        await self.fetcher.aclose()
