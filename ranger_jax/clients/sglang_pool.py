"""Several SGLang policy servers as one client, or one URL (a server, or SGLang's router in front of replicas).

    client = sglang_pool.connect("http://10.0.0.9:30000")                          # the router: one SGLangClient
    client = sglang_pool.connect(["http://10.0.0.5:30001", "http://10.0.0.6:30001"])  # replicas: an SGLangPool

`SGLangPool` sends each `/generate` to one server: every turn of an episode goes where its first turn went (the
request id up to `#`, as `SGLangPolicy` names turns `<episode>#<turn>`), so the server's prefix cache holds the
episode's history; a new episode goes to the server with the fewest requests in flight. Control calls fan out:
`update_weights_from_disk` and `health` reach every server, `get_server_info` / `get_model_info` ask the first.
The router does the same balancing by itself (`cache_aware`), which is why one URL needs no pool.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
from collections.abc import Sequence
from typing import Any

import httpx

from ranger_jax.clients import sglang

MAX_STICKY_EPISODES = 100_000  # episode -> server entries kept (oldest forgotten first)


def split_urls(urls: str | Sequence[str]) -> list[str]:
    """A list of server URLs from a list or a comma-separated string (blanks dropped)."""
    parts = urls.split(",") if isinstance(urls, str) else list(urls)
    return [u.strip() for u in parts if u and u.strip()]


class SGLangPool:
    """SGLang servers behind one `SGLangClient`-like interface (see the module docstring).

    Args:
        urls: the servers' root URLs.
        api_key, timeout, max_retries: as `SGLangClient`.
        max_concurrency: requests in flight per server.
    """

    def __init__(self, urls: Sequence[str], *, api_key: str | None = None,
                 timeout: float | httpx.Timeout = sglang.DEFAULT_TIMEOUT, max_retries: int = sglang.DEFAULT_MAX_RETRIES,
                 max_concurrency: int = sglang.DEFAULT_MAX_CONCURRENCY):
        self.urls = split_urls(urls)
        if not self.urls:
            raise ValueError("SGLangPool needs at least one server URL")
        self.clients = [sglang.SGLangClient(u, api_key=api_key, timeout=timeout, max_retries=max_retries,
                                            max_concurrency=max_concurrency) for u in self.urls]
        self.in_flight = [0] * len(self.clients)
        self.sent = [0] * len(self.clients)  # requests each server was given
        self._episodes: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._order = itertools.count()
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        """The servers, comma-separated (for messages)."""
        return ",".join(self.urls)

    def _acquire(self, rid: str | None) -> int:
        episode = (rid or "").split("#")[0] or None
        with self._lock:
            index = self._episodes.get(episode) if episode else None
            if index is None:
                tie = next(self._order)
                n = len(self.clients)
                index = min(range(n), key=lambda i: (self.in_flight[i], (i - tie) % n))
                if episode:
                    self._episodes[episode] = index
                    if len(self._episodes) > MAX_STICKY_EPISODES:
                        self._episodes.popitem(last=False)
            else:
                self._episodes.move_to_end(episode)
            self.in_flight[index] += 1
            self.sent[index] += 1
            return index

    def _release(self, index: int) -> None:
        with self._lock:
            self.in_flight[index] -= 1

    async def agenerate(self, input_ids: Any = None, *, rid: str | None = None, **kwargs: Any) -> sglang.GenerateResult:
        """`SGLangClient.agenerate` on the episode's server (same arguments)."""
        index = self._acquire(rid)
        try:
            return await self.clients[index].agenerate(input_ids, rid=rid, **kwargs)
        finally:
            self._release(index)

    def generate(self, input_ids: Any = None, *, rid: str | None = None, **kwargs: Any) -> sglang.GenerateResult:
        """Sync twin of `agenerate`."""
        index = self._acquire(rid)
        try:
            return self.clients[index].generate(input_ids, rid=rid, **kwargs)
        finally:
            self._release(index)

    async def aget_server_info(self) -> sglang.ServerInfo:
        """The first server's launch arguments (replicas are started alike)."""
        return await self.clients[0].aget_server_info()

    async def aget_model_info(self) -> sglang.ModelInfo:
        """The first server's model facts."""
        return await self.clients[0].aget_model_info()

    async def ahealth(self) -> bool:
        """True when every server answers `/health` with 200."""
        return all(await asyncio.gather(*(c.ahealth() for c in self.clients)))

    def health(self) -> bool:
        """Sync twin of `ahealth`."""
        return all(c.health() for c in self.clients)

    async def aupdate_weights_from_disk(self, model_path: str, **kwargs: Any) -> list[sglang.WeightUpdate]:
        """`update_weights_from_disk` on every server at once (same arguments); one answer per server."""
        return list(await asyncio.gather(*(c.aupdate_weights_from_disk(model_path, **kwargs) for c in self.clients)))

    def update_weights_from_disk(self, model_path: str, **kwargs: Any) -> list[sglang.WeightUpdate]:
        """Sync twin of `aupdate_weights_from_disk` (one server after the other)."""
        return [c.update_weights_from_disk(model_path, **kwargs) for c in self.clients]

    def close(self) -> None:
        """Closes every server's sync connection."""
        for client in self.clients:
            client.close()

    async def aclose(self) -> None:
        """Closes every server's connections."""
        for client in self.clients:
            await client.aclose()

    def __enter__(self) -> SGLangPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> SGLangPool:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def connect(urls: str | Sequence[str], **kwargs: Any) -> sglang.SGLangClient | SGLangPool:
    """One client for `urls`: an `SGLangClient` for one URL (a server or the router), an `SGLangPool` for several
    (a list, or a comma-separated string). Keyword arguments go to the client."""
    found = split_urls(urls)
    if not found:
        raise ValueError(f"no SGLang server URL in {urls!r}")
    if len(found) == 1:
        return sglang.SGLangClient(found[0], **kwargs)
    return SGLangPool(found, **kwargs)
