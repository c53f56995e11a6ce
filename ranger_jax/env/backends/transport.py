"""The guarded httpx transport: URL guard on every redirect hop, pinned addresses, capped and self-decoded bodies.

`GuardedTransport` follows redirects itself so the guard checks every hop before it is contacted, connects to the
address the guard checked (keeping the Host header and TLS server name), so a second DNS answer cannot be
rebound to an internal address, and decodes gzip/deflate bodies in bounded pieces while counting decoded bytes,
so neither a huge body nor a decompression bomb is ever held in memory.
"""

from __future__ import annotations

import dataclasses
import logging
import urllib.parse
import zlib
from collections.abc import AsyncIterator, Iterator

import httpx

from ranger_jax.env.backends import base, urlguard

log = logging.getLogger(__name__)

DEFAULT_MAX_REDIRECTS = 5
BODY_LIMIT = "ranger_body_limit"  # request extension: (max decoded bytes, cut instead of refusing)
BODY_INFO = "ranger_body_info"  # response extension: BodyInfo
_REDIRECT_STATUS = frozenset({301, 302, 303, 307, 308})
_PIECE_BYTES = 64 * 1024


class PermanentFetchError(base.BackendError):
    """A fetch failure that repeating the request would not fix (4xx, wrong content type, too large); cached."""


class BodyTooLarge(PermanentFetchError):
    """A response body over the byte limit (known from Content-Length or found while reading)."""

    def __init__(self, url: str, limit: int, size: int | None = None):
        self.url, self.limit, self.size = url, limit, size
        got = f"{size} bytes" if size is not None else f"more than {limit} bytes"
        super().__init__(f"{url} is too large: {got} (limit {limit} bytes)")


@dataclasses.dataclass
class BodyInfo:
    """What the transport learnt about a body: the URL it came from and whether it was cut."""

    final_url: str
    truncated: bool = False


class _CappedStream(httpx.AsyncByteStream):
    """Decodes gzip/deflate itself and stops at `limit` decoded bytes (cutting or raising)."""

    def __init__(self, inner: httpx.AsyncByteStream, url: str, encoding: str, limit: int, cut: bool, info: BodyInfo):
        self._inner, self._url, self._limit, self._cut, self._info = inner, url, limit, cut, info
        if encoding in ("", "identity"):
            self._decoder = None
        elif encoding in ("gzip", "x-gzip"):
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._decoder = zlib.decompressobj()
        else:
            raise base.BackendError(f"{url} uses unsupported content-encoding {encoding!r}")

    def _pieces(self, chunk: bytes) -> Iterator[bytes]:
        """Decoded pieces of `chunk`, each at most `_PIECE_BYTES` long, so a bomb never inflates in one go."""
        if self._decoder is None:
            yield chunk
            return
        data = chunk
        while data:
            try:
                out = self._decoder.decompress(data, _PIECE_BYTES)
            except zlib.error as err:
                raise base.BackendError(f"{self._url} sent a corrupt compressed body ({err})") from err
            if out:
                yield out
            data = self._decoder.unconsumed_tail

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self._inner:
            for piece in self._pieces(chunk):
                if total + len(piece) > self._limit:
                    if not self._cut:
                        raise BodyTooLarge(self._url, self._limit)
                    self._info.truncated = True
                    if self._limit > total:
                        yield piece[: self._limit - total]
                    return
                total += len(piece)
                yield piece

    async def aclose(self) -> None:
        await self._inner.aclose()


def pinned_request(request: httpx.Request, target: urlguard.Target) -> httpx.Request:
    """`request` sent to the checked address, keeping the Host header and TLS server name of the original host.

    The URL is rewritten whenever httpx's own reading of the host differs from the checked address, so a URL that
    two parsers read differently still connects only where the guard looked.
    """
    if target.address is None or request.url.host == target.address:
        return request
    headers = httpx.Headers(request.headers)
    headers["Host"] = request.url.netloc.decode("ascii")
    extensions = {**request.extensions, "sni_hostname": target.host}
    return httpx.Request(
        request.method, request.url.copy_with(host=target.address), headers=headers,
        stream=request.stream, extensions=extensions,
    )


def _next_hop(request: httpx.Request, location: str) -> tuple[str, httpx.Headers]:
    url = urllib.parse.urljoin(str(request.url), location.strip())
    headers = httpx.Headers(request.headers)
    headers.pop("Host", None)
    if urllib.parse.urlsplit(url).netloc != request.url.netloc.decode("ascii"):
        headers.pop("Authorization", None)
        headers.pop("Cookie", None)
    return url, headers


class GuardedTransport(httpx.AsyncBaseTransport):
    """Checks every hop with the guard, follows redirects itself and caps decoded body bytes.

    A request may carry the extension `ranger_body_limit = (max_bytes, cut)`; without it the body is not capped.
    The response carries `ranger_body_info` with the final URL and whether the body was cut.
    """

    def __init__(self, guard: urlguard.UrlGuard, *, max_redirects: int = DEFAULT_MAX_REDIRECTS):
        self.guard = guard
        self.max_redirects = max_redirects
        # no keep-alive: a pinned connection (by IP) must never carry another host's request over the first SNI
        self._inner = httpx.AsyncHTTPTransport(trust_env=False, limits=httpx.Limits(max_keepalive_connections=0))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Sends `request`, following redirects itself so every hop is checked and pinned."""
        url = str(request.url)
        for hop in range(self.max_redirects + 1):
            target = await self.guard.resolve(url)
            response = await self._inner.handle_async_request(pinned_request(request, target))
            location = response.headers.get("Location")
            if response.status_code not in _REDIRECT_STATUS or not location:
                return self._capped(response, request, url)
            await response.aclose()
            try:
                url, headers = _next_hop(request, location)
            except ValueError as err:
                raise urlguard.UrlRefused(location, f"malformed redirect from {url} ({err})") from err
            await self.guard.resolve(url)  # refuse before building a request httpx might not even parse
            request = httpx.Request("GET", url, headers=headers, extensions=request.extensions)
            log.debug("redirect %d to %s", hop + 1, url)
        raise base.BackendError(f"too many redirects (> {self.max_redirects}) ending at {url}")

    def _capped(self, response: httpx.Response, request: httpx.Request, url: str) -> httpx.Response:
        limit, cut = request.extensions.get(BODY_LIMIT, (None, False))
        info = BodyInfo(final_url=url)
        if limit is None:
            response.extensions = {**response.extensions, BODY_INFO: info}
            return response
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        length = response.headers.get("Content-Length")
        if not cut and encoding in ("", "identity") and length and length.isdigit() and int(length) > limit:
            raise BodyTooLarge(url, limit, int(length))
        headers = [(k, v) for k, v in response.headers.raw if k.lower() not in (b"content-encoding", b"content-length")]
        stream = _CappedStream(response.stream, url, encoding, limit, cut, info)
        return httpx.Response(
            response.status_code, headers=headers, stream=stream, extensions={**response.extensions, BODY_INFO: info}
        )

    async def aclose(self) -> None:
        """Closes the inner transport."""
        await self._inner.aclose()
