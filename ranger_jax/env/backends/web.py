"""Fetching pages and images from the open web: HTML to text (trafilatura), Jina reader, image bytes, replay cache.

Every request goes through `transport.GuardedTransport` (URL guard on every redirect hop, pinned addresses, capped
bodies). Above it the shared retry loop (`clients.http.arequest_with_retries`) retries 429/5xx/transport errors,
and `asyncio.timeout` bounds the whole fetch, slow bodies included. Pages, image bytes and permanent failures are
cached on disk so a run replays exactly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import re
import threading
import urllib.parse
import weakref
from collections.abc import Callable
from pathlib import Path

import httpx
import trafilatura

from ranger_jax import fileio
from ranger_jax.clients import cache as cache_lib
from ranger_jax.clients import http
from ranger_jax.env.backends import base, transport, urlguard

log = logging.getLogger(__name__)

DEFAULT_FETCH_TIMEOUT_S = 20.0
DEFAULT_MAX_PAGE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_IMAGE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_REDIRECTS = transport.DEFAULT_MAX_REDIRECTS
DEFAULT_FETCH_MAX_RETRIES = 2
DEFAULT_USER_AGENT = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0 Safari/537.36"
)
_REQUEST_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
_HTML_TYPES = ("text/html", "application/xhtml+xml")
_TEXT_TYPES = ("text/plain", "text/markdown", "application/json", "text/csv", "application/xml", "text/xml")


class _LoopClients:
    """One guarded `httpx.AsyncClient` and semaphore per running event loop (a client belongs to its loop)."""

    def __init__(self, make_client: Callable[[], httpx.AsyncClient], max_concurrency: int):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1; got {max_concurrency}")
        self._make_client = make_client
        self.max_concurrency = max_concurrency
        self._by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        with self._lock:
            pair = self._by_loop.get(loop)
            if pair is None or pair[0].is_closed:
                pair = (self._make_client(), asyncio.Semaphore(self.max_concurrency))
                self._by_loop[loop] = pair
            return pair

    async def aclose(self) -> None:
        """Closes the running loop's client (the clients of other loops go with their loops)."""
        with self._lock:
            pair = self._by_loop.pop(asyncio.get_running_loop(), None)
        if pair is not None:
            await pair[0].aclose()


def _media_type(response: httpx.Response) -> str:
    return response.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()


def _html_title(html: str) -> str:
    m = re.search(r"<title[^>]*>(.*?)</title>", html, re.IGNORECASE | re.DOTALL)
    return re.sub(r"\s+", " ", m.group(1)).strip() if m else ""


def html_to_page(html: str, url: str) -> base.Page:
    """Main text (markdown), title and date of an HTML document, via trafilatura."""
    text = trafilatura.extract(
        html, url=url, output_format="markdown", include_tables=True, include_links=False, favor_recall=True
    )
    if not text:  # tiny or unusual pages: fall back to all visible text
        text = trafilatura.html2txt(html) or ""
    meta = trafilatura.extract_metadata(html, default_url=url)
    title = (meta.title if meta is not None and meta.title else "") or _html_title(html)
    date = meta.date if meta is not None else None
    return base.Page(url=url, title=title, text=text.strip(), date=date)


def jina_to_page(body: str, url: str) -> base.Page:
    """A Jina reader text response (`Title:`, `URL Source:`, `Markdown Content:` header) as a Page."""
    title = ""
    if m := re.match(r"\s*Title:\s*(.*)", body):
        title = m.group(1).strip()
    date = m.group(1).strip() if (m := re.search(r"^Published Time:\s*(.*)$", body, re.MULTILINE)) else None
    _, marker, content = body.partition("Markdown Content:")
    return base.Page(url=url, title=title, text=(content if marker else body).strip(), date=date)


class WebFetcher:
    """Fetches pages (as text) and images (as bytes) from the open web, guarded and capped.

    Args:
        guard: the URL guard applied to every URL and redirect hop.
        timeout_s: wall-clock limit of one fetch, retries and slow bodies included.
        max_page_bytes: decoded page bytes read; longer pages are cut there.
        max_image_bytes: decoded image bytes allowed; larger images are refused.
        min_image_bytes: smaller images are refused (tracking pixels, icons).
        max_redirects: redirect hops followed.
        max_retries: retries of 429/5xx/transport errors per fetch.
        max_concurrency: fetches in flight per event loop.
        user_agent: the User-Agent header sent.
        jina_base_url: when set, pages are read through the Jina reader at `<jina_base_url>/<url>`.
        jina_api_key: Bearer token for the Jina reader.
        cache_dir: when set, pages and image bytes are cached there so runs replay exactly.
    """

    def __init__(
        self,
        guard: urlguard.UrlGuard,
        *,
        timeout_s: float = DEFAULT_FETCH_TIMEOUT_S,
        max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES,
        max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
        min_image_bytes: int = 0,
        max_redirects: int = DEFAULT_MAX_REDIRECTS,
        max_retries: int = DEFAULT_FETCH_MAX_RETRIES,
        max_concurrency: int = 16,
        user_agent: str = DEFAULT_USER_AGENT,
        jina_base_url: str | None = None,
        jina_api_key: str | None = None,
        cache_dir: str | Path | None = None,
    ):
        self.guard = guard
        self.timeout_s = timeout_s
        self.max_page_bytes = max_page_bytes
        self.max_image_bytes = max_image_bytes
        self.min_image_bytes = min_image_bytes
        self.max_retries = max_retries
        self.user_agent = user_agent
        self.jina_base_url = jina_base_url.rstrip("/") if jina_base_url else None
        self._web = _LoopClients(
            lambda: httpx.AsyncClient(
                transport=transport.GuardedTransport(guard, max_redirects=max_redirects),
                timeout=_REQUEST_TIMEOUT, follow_redirects=False, trust_env=False,
            ),
            max_concurrency,
        )
        self._jina = (http.Session(jina_base_url, timeout=_REQUEST_TIMEOUT, max_retries=max_retries,
                                   max_concurrency=max_concurrency,
                                   headers={"Authorization": f"Bearer {jina_api_key}"} if jina_api_key else None)
                      if jina_base_url else None)
        self._page_cache = cache_lib.JsonCache(cache_dir, "web_page")
        self._image_cache = cache_lib.JsonCache(cache_dir, "web_image")
        self._blob_dir = Path(cache_dir) / "blobs" if cache_dir is not None else None

    async def _get(self, url: str, headers: dict[str, str], limit: int, cut: bool) -> httpx.Response:
        client, semaphore = self._web.get()
        try:
            async with semaphore, asyncio.timeout(self.timeout_s):
                return await http.arequest_with_retries(
                    client, "GET", url, headers=headers, max_retries=self.max_retries,
                    extensions={transport.BODY_LIMIT: (limit, cut)},
                )
        except TimeoutError as err:
            raise base.BackendError(f"fetching {url} timed out after {self.timeout_s:g} s") from err
        except http.StatusError as err:
            kind = base.BackendError if http.is_retryable_status(err.status) else transport.PermanentFetchError
            raise kind(f"HTTP {err.status} from {err.url}") from err
        except http.ClientError as err:
            raise base.BackendError(str(err)) from err
        except httpx.InvalidURL as err:
            raise urlguard.UrlRefused(url, f"malformed URL ({err})") from err
        except httpx.HTTPError as err:
            raise base.BackendError(f"fetching {url} failed: {type(err).__name__}: {err}") from err

    async def fetch_page(self, url: str) -> base.Page:
        """The page at `url` as text: through Jina when configured, else HTML → markdown via trafilatura.

        Raises:
            UrlRefused: the URL or a redirect hop is not allowed.
            BackendError: HTTP errors, timeouts, unsupported content.
        """
        self.guard.check_syntax(url)  # refuse forbidden spellings before httpx even parses them
        key = {"url": url, "jina": self.jina_base_url is not None}
        if (hit := self._page_cache.get(key)) is not None:
            if "error" in hit:
                raise transport.PermanentFetchError(hit["error"])
            return base.Page(**hit)
        try:
            page = await (self._read_with_jina(url) if self._jina is not None else self._read_directly(url))
        except transport.PermanentFetchError as err:
            self._page_cache.put(key, {"error": str(err)})
            raise
        self._page_cache.put(key, dataclasses.asdict(page))
        return page

    async def _read_directly(self, url: str) -> base.Page:
        headers = {"User-Agent": self.user_agent, "Accept-Encoding": "gzip, deflate",
                   "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5"}
        response = await self._get(url, headers, self.max_page_bytes, True)
        # extraction of a multi-megabyte page takes seconds of CPU: off the event loop the other episodes share
        page = await asyncio.to_thread(self._page_from, response, url)
        if response.extensions[transport.BODY_INFO].truncated:
            page = dataclasses.replace(page, text=page.text + f"\n\n[page cut at {self.max_page_bytes} bytes]")
        return page

    async def _read_with_jina(self, url: str) -> base.Page:
        await self.guard.resolve(url)  # Jina fetches from its side, but the policy still may not name these hosts
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self._jina.arequest("GET", url, headers={"X-Return-Format": "markdown"})
        except TimeoutError as err:
            raise base.BackendError(f"reading {url} through {self.jina_base_url} timed out after "
                                    f"{self.timeout_s:g} s") from err
        except http.ClientError as err:
            raise base.BackendError(f"Jina reader failed for {url}: {err}") from err
        text = response.text
        if len(text) > self.max_page_bytes:
            text = text[: self.max_page_bytes] + f"\n\n[page cut at {self.max_page_bytes} characters]"
        return jina_to_page(text, url)

    def _page_from(self, response: httpx.Response, url: str) -> base.Page:
        final_url = response.extensions[transport.BODY_INFO].final_url
        media = _media_type(response)
        if media in _HTML_TYPES or (not media and response.text.lstrip()[:1] == "<"):
            return html_to_page(response.text, final_url)
        if media in _TEXT_TYPES or media.startswith("text/"):
            return base.Page(url=final_url, title="", text=response.text.strip())
        if media.startswith("image/"):
            raise transport.PermanentFetchError(f"{url} is an image ({media}), not a page")
        raise transport.PermanentFetchError(f"{url} has content-type {media or '(none)'!r}, which cannot be read as "
                                            "text")

    async def fetch_image(self, url: str, *, page_url: str | None = None) -> base.FetchedImage:
        """The encoded bytes of the image at `url` (content type image/*, size within limits).

        Raises:
            UrlRefused: the URL or a redirect hop is not allowed.
            BackendError: HTTP errors, timeouts, wrong content type, too large or too small.
        """
        self.guard.check_syntax(url)
        key = {"url": url}
        if (hit := self._image_cache.get(key)) is not None and self._blob_dir is not None:
            if "error" in hit:
                raise transport.PermanentFetchError(hit["error"])
            blob = self._blob_dir / hit["sha256"][:2] / hit["sha256"]
            if blob.exists():
                return base.FetchedImage(url=url, data=blob.read_bytes(), content_type=hit["content_type"],
                                         page_url=page_url)
        try:
            data, media = await self._download(url, page_url)
        except transport.PermanentFetchError as err:
            self._image_cache.put(key, {"error": str(err)})
            raise
        if self._blob_dir is not None:
            sha = hashlib.sha256(data).hexdigest()
            blob = self._blob_dir / sha[:2] / sha
            if not blob.exists():
                fileio.write_atomic(blob, data)
            self._image_cache.put(key, {"sha256": sha, "content_type": media})
        return base.FetchedImage(url=url, data=data, content_type=media, page_url=page_url)

    async def _download(self, url: str, page_url: str | None) -> tuple[bytes, str]:
        referer = page_url or "{0.scheme}://{0.netloc}/".format(urllib.parse.urlsplit(url))
        headers = {"User-Agent": self.user_agent, "Referer": referer, "Accept": "image/*,*/*;q=0.5",
                   "Accept-Encoding": "gzip, deflate"}
        response = await self._get(url, headers, self.max_image_bytes, False)
        media = _media_type(response)
        if not media.startswith("image/"):
            raise transport.PermanentFetchError(f"{url} is not an image (content-type {media or '(none)'!r})")
        if media == "image/svg+xml":
            raise transport.PermanentFetchError(f"{url} is an SVG drawing, which is not supported")
        if len(response.content) < self.min_image_bytes:
            raise transport.PermanentFetchError(f"{url} is too small to be a picture ({len(response.content)} bytes < "
                                      f"{self.min_image_bytes})")
        return response.content, media

    async def aclose(self) -> None:
        """Closes the web session and the Jina reader session, if any."""
        await self._web.aclose()
        if self._jina is not None:
            await self._jina.aclose()
