"""The remote services of a live data-generation run: one spec each, and clients whose every call is recorded.

A run names its services in a TOML file, one table per role:

    [llm]          # writes requests from headlines and prompts from categories (OpenAI-compatible chat)
    url = "https://api.openai.com/v1"
    model = "gpt-4.1"
    api_key_env = "OPENAI_API_KEY"
    max_concurrency = 8
    max_retries = 4
    price = {per_million_input_tokens = 2.0, per_million_output_tokens = 8.0}

    [judge]        # VLM judge: confusion filter, search judge, quality scores (OpenAI-compatible chat)
    [teacher]      # the frontier model playing the teacher (OpenAI-compatible chat)
    [serper]       # url = "https://google.serper.dev", api_key_env = "SERPER_API_KEY", price = {per_request = 0.001}
    [generator]    # kind = "sglang" (images API) or "gen_searcher" (Gen-Searcher's /generate); url = one or a list

Each service gets its own concurrency limit and retry count (`max_concurrency`, `max_retries`) and its own key,
read from the environment variable `api_key_env` names. `Services` builds the production clients
(`clients.chat.ChatClient`, `env.backends.serper.SerperClient`, `clients.images` generators) and hands each stage a
wrapper that records every call in the run's `calls.Recorder` (request, response or error, latency, tokens, cost).
"""

from __future__ import annotations

import dataclasses
import os
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ranger_jax.clients import chat, http, media
from ranger_jax.clients import images as images_lib
from ranger_jax.datagen import calls
from ranger_jax.env.backends import base, serper, urlguard, web

ROLES = ("llm", "judge", "teacher", "serper", "generator")
GENERATOR_KINDS = ("sglang", "gen_searcher")
_KEYS = ("url", "model", "api_key_env", "kind", "max_concurrency", "max_retries", "price", "timeout_s")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServiceSpec:
    """One service of a run (see the module docstring).

    Attributes:
        role: one of ROLES.
        url: base URL (a list for several generator services).
        model: model name (chat services).
        api_key_env: environment variable holding its key (None: no key).
        kind: generators only: "sglang" or "gen_searcher".
        max_concurrency: requests in flight at once.
        max_retries: retries after the first try (transport errors, 408, 429, 5xx).
        price: what it charges.
        timeout_s: per-request timeout (None: the client's default).
    """

    role: str
    url: str | tuple[str, ...]
    model: str | None = None
    api_key_env: str | None = None
    kind: str | None = None
    max_concurrency: int = 8
    max_retries: int = http.DEFAULT_MAX_RETRIES
    price: calls.Price = calls.Price()
    timeout_s: float | None = None

    def __post_init__(self):
        where = f"service [{self.role}]"
        if self.role not in ROLES:
            raise ValueError(f"{where}: unknown role; known roles: {list(ROLES)}")
        urls = (self.url,) if isinstance(self.url, str) else tuple(self.url)
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"{where}: url must be an http(s) URL (or a list of them), got {self.url!r}")
        if self.role in ("llm", "judge", "teacher") and not self.model:
            raise ValueError(f"{where}: a chat service needs a model name")
        if self.role == "generator" and (self.kind or "sglang") not in GENERATOR_KINDS:
            raise ValueError(f"{where}: kind must be one of {list(GENERATOR_KINDS)}, got {self.kind!r}")
        for name in ("max_concurrency", "max_retries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "max_concurrency" else 0):
                raise ValueError(f"{where}: {name} must be an integer >= {1 if name == 'max_concurrency' else 0}, "
                                 f"got {value!r}")

    def key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The service's key from the variable `api_key_env` names (None when it names none).

        Raises:
            ValueError: the named variable is not set.
        """
        if not self.api_key_env:
            return None
        value = (os.environ if environ is None else environ).get(self.api_key_env)
        if not value:
            raise ValueError(f"service [{self.role}]: ${self.api_key_env} is not set (api_key_env names it)")
        return value


def parse_services(tables: Mapping[str, Any], where: str = "services") -> dict[str, ServiceSpec]:
    """Service specs from TOML-shaped tables {role: {url, model, …}}.

    Raises:
        ValueError: an unknown role or key, or a bad value (naming the role and the key).
    """
    out = {}
    for role, table in tables.items():
        if role not in ROLES:
            raise ValueError(f"{where}: unknown service [{role}]; known: {list(ROLES)}")
        if not isinstance(table, Mapping):
            raise ValueError(f"{where}: [{role}] must be a table")
        unknown = sorted(set(table) - set(_KEYS))
        if unknown:
            raise ValueError(f"{where}: [{role}] has unknown keys {unknown}; known: {list(_KEYS)}")
        options = dict(table)
        if "url" not in options:
            raise ValueError(f"{where}: [{role}] needs a url")
        if isinstance(options["url"], list):
            options["url"] = tuple(options["url"])
        options["price"] = calls.Price(**dict(options.get("price") or {}))
        out[role] = ServiceSpec(role=role, **options)
    return out


def load_services(path: str | os.PathLike) -> dict[str, ServiceSpec]:
    """The service specs of a TOML file (see the module docstring).

    Raises:
        FileNotFoundError: no such file. ValueError: as `parse_services`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"services file {path} does not exist")
    return parse_services(tomllib.loads(path.read_text("utf-8")), where=str(path))


class RecordingChat:
    """A `ChatClient` whose calls are recorded under one stage; it stands in wherever a ChatClient is used
    (judges, the harness policy), as it has the same `acomplete`, `url` and `aclose`."""

    def __init__(self, client: chat.ChatClient, recorder: calls.Recorder, *, service: str, stage: str):
        self.client, self.recorder, self.service, self.stage = client, recorder, service, stage

    @property
    def url(self) -> str:
        """The endpoint of the underlying client."""
        return self.client.url

    async def acomplete(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> chat.ChatResult:
        """`ChatClient.acomplete`, recorded (request, response or error, latency, usage)."""
        started = time.monotonic()
        request = {"model": self.client.model, "messages": list(messages), **options}
        try:
            result = await self.client.acomplete(messages, **options)
        except http.ClientError as err:
            self.recorder.record(stage=self.stage, service=self.service, endpoint=self.url, request=request,
                                 error=str(err), latency_s=time.monotonic() - started)
            raise
        self.recorder.record(stage=self.stage, service=self.service, endpoint=self.url, request=request,
                             response={"content": result.content, "finish_reason": result.finish_reason,
                                       "tool_calls": [dataclasses.asdict(c) for c in result.tool_calls]},
                             latency_s=time.monotonic() - started, usage=result.usage)
        return result

    def complete(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> chat.ChatResult:
        """Sync twin of `acomplete` (run on the client's own loop), for callers such as the sync judges."""
        return self.client.session.run_sync(self.acomplete(messages, **options))

    async def aclose(self) -> None:
        """Closes the underlying client."""
        await self.client.aclose()


class RecordingSerper:
    """Serper's `/news` and `/images` for one stage, recorded."""

    def __init__(self, client: serper.SerperClient, recorder: calls.Recorder, *, stage: str):
        self.client, self.recorder, self.stage = client, recorder, stage

    async def news_rows(self, query: str, *, num: int, tbs: str | None) -> list[dict[str, Any]]:
        """The raw `news[]` rows for `query` (recorded). Raises base.BackendError."""
        return await self._call("news", self.client.news_rows, query, num, tbs)

    async def images(self, query: str, *, num: int, tbs: str | None = None) -> list[base.ImageHit]:
        """Image results for `query` (recorded). Raises base.BackendError."""
        return await self._call("images", self.client.images, query, num, tbs)

    async def _call(self, endpoint: str, method, query: str, num: int, tbs: str | None):
        started, request = time.monotonic(), {"q": query, "num": num, "tbs": tbs}
        url = self.client.session.url(endpoint)
        try:
            result = await method(query, num=num, tbs=tbs)
        except base.BackendError as err:
            self.recorder.record(stage=self.stage, service="serper", endpoint=url, request=request, error=str(err),
                                 latency_s=time.monotonic() - started)
            raise
        shown = [r if isinstance(r, dict) else dataclasses.asdict(r) for r in result]
        self.recorder.record(stage=self.stage, service="serper", endpoint=url, request=request, response=shown,
                             latency_s=time.monotonic() - started)
        return result


class RecordingGenerator:
    """An image generator for one stage, recorded (the result's request facts, its error or image digest)."""

    def __init__(self, generator: images_lib.Generator, recorder: calls.Recorder, *, stage: str):
        self.generator, self.recorder, self.stage = generator, recorder, stage

    async def agenerate(self, prompt: str, references: Sequence[media.ImageLike] = (), *, seed: int | None = None,
                        size: str | tuple[int, int] | None = None) -> images_lib.GenerationResult:
        """`Generator.agenerate`, recorded; never raises for a failed generation."""
        result = await self.generator.agenerate(prompt, references, seed=seed, size=size)
        self.recorder.record(stage=self.stage, service="generator",
                             endpoint=str(result.request.get("endpoint", type(self.generator).__name__)),
                             request={"prompt": prompt, "num_references": len(references), "seed": seed,
                                      **dict(result.request)},
                             response={"ok": result.ok, "image": result.image}, error=result.error,
                             latency_s=result.latency_s)
        return result


class RecordingFetcher:
    """Image downloads for one stage through the URL-guarded `web.WebFetcher`, recorded (URL, size and digest)."""

    def __init__(self, fetcher: web.WebFetcher, recorder: calls.Recorder, *, stage: str):
        self.fetcher, self.recorder, self.stage = fetcher, recorder, stage

    async def image(self, url: str, page_url: str | None = None) -> bytes:
        """The image bytes at `url`. Raises base.BackendError (refused URL, failed or oversized download)."""
        started = time.monotonic()
        try:
            fetched = await self.fetcher.fetch_image(url, page_url=page_url)
        except base.BackendError as err:
            self.recorder.record(stage=self.stage, service="web", endpoint=url, request={"url": url},
                                 error=str(err), latency_s=time.monotonic() - started)
            raise
        self.recorder.record(stage=self.stage, service="web", endpoint=url, request={"url": url},
                             response={"bytes": fetched.data, "content_type": fetched.content_type},
                             latency_s=time.monotonic() - started)
        return fetched.data


class RecordingBackend:
    """A search/fetch backend (`env.backends.base.Backend`) whose calls are recorded: what a teacher's tools search
    and download is accounted like every other call. Attributes it does not wrap (the offline world, `today`, the
    object finder) are the wrapped backend's.

    Args:
        backend: the backend to wrap.
        recorder: where calls are recorded.
        stage: the stage they belong to.
        search_service / fetch_service: the service names searches and fetches are recorded under.
    """

    def __init__(self, backend: base.Backend, recorder: calls.Recorder, *, stage: str, search_service: str,
                 fetch_service: str):
        self.backend, self.recorder, self.stage = backend, recorder, stage
        self.search_service, self.fetch_service = search_service, fetch_service

    async def _call(self, service: str, endpoint: str, request: dict[str, Any], call, shown):
        started = time.monotonic()
        try:
            result = await call()
        except base.BackendError as err:
            self.recorder.record(stage=self.stage, service=service, endpoint=endpoint, request=request, error=str(err),
                                 latency_s=time.monotonic() - started)
            raise
        self.recorder.record(stage=self.stage, service=service, endpoint=endpoint, request=request,
                             response=shown(result), latency_s=time.monotonic() - started)
        return result

    @staticmethod
    def _rows(hits: Sequence[Any]) -> list[dict[str, Any]]:
        return [dataclasses.asdict(h) for h in hits]

    async def text_search(self, query: str, *, top_k: int, tbs: str | None = None) -> list[base.TextHit]:
        """The wrapped backend's text search, recorded."""
        return await self._call(self.search_service, "search", {"q": query, "top_k": top_k, "tbs": tbs},
                                lambda: self.backend.text_search(query, top_k=top_k, tbs=tbs), self._rows)

    async def image_search(self, query: str, *, top_k: int, tbs: str | None = None) -> list[base.ImageHit]:
        """The wrapped backend's image search, recorded."""
        return await self._call(self.search_service, "images", {"q": query, "top_k": top_k, "tbs": tbs},
                                lambda: self.backend.image_search(query, top_k=top_k, tbs=tbs), self._rows)

    async def fetch_page(self, url: str) -> base.Page:
        """The wrapped backend's page fetch, recorded (the page's title and length)."""
        return await self._call(self.fetch_service, url, {"url": url}, lambda: self.backend.fetch_page(url),
                                lambda page: {"title": page.title, "chars": len(page.text)})

    async def fetch_image(self, url: str, *, page_url: str | None = None) -> base.FetchedImage:
        """The wrapped backend's image download, recorded (bytes by digest)."""
        return await self._call(self.fetch_service, url, {"url": url},
                                lambda: self.backend.fetch_image(url, page_url=page_url),
                                lambda image: {"bytes": image.data, "content_type": image.content_type})

    async def aclose(self) -> None:
        """Closes the wrapped backend."""
        await self.backend.aclose()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.backend, name)
        if name == "news_search" and callable(value):  # the live backend's news tool, recorded too
            async def news_search(query: str, *, top_k: int, tbs: str | None = None) -> list[base.TextHit]:
                return await self._call(self.search_service, "news", {"q": query, "top_k": top_k, "tbs": tbs},
                                        lambda: value(query, top_k=top_k, tbs=tbs), self._rows)
            return news_search
        return value


class Services:
    """The clients of a run's services (built on first use), handed out per stage with recording.

    Args:
        specs: the run's services by role.
        recorder: where calls are recorded.
        cache_dir: replay cache of the chat and Serper clients (None: none).
        environ: where keys are read (default `os.environ`).
        allow_hosts: `host:port` entries the URL guard lets downloads reach (tests' loopback servers only).
    """

    def __init__(self, specs: Mapping[str, ServiceSpec], recorder: calls.Recorder, *,
                 cache_dir: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None,
                 allow_hosts: Sequence[str] = ()):
        self.specs, self.recorder, self.cache_dir, self.environ = dict(specs), recorder, cache_dir, environ
        self.allow_hosts = tuple(allow_hosts)
        self._clients: dict[str, Any] = {}

    def spec(self, role: str) -> ServiceSpec:
        """The spec of `role`.

        Raises:
            ValueError: the run names no such service.
        """
        if role not in self.specs:
            raise ValueError(f"this stage needs the [{role}] service; the services file names {sorted(self.specs)}")
        return self.specs[role]

    def _client(self, role: str) -> Any:
        if role in self._clients:
            return self._clients[role]
        spec = self.spec(role)
        key = spec.key(self.environ)
        timeout = {"timeout": spec.timeout_s} if spec.timeout_s else {}
        cache = None if self.cache_dir is None else Path(self.cache_dir) / role
        if role == "serper":
            client = serper.SerperClient(key, base_url=str(spec.url), cache_dir=cache,
                                         max_concurrency=spec.max_concurrency, max_retries=spec.max_retries, **timeout)
        elif role == "generator":
            urls = spec.url if isinstance(spec.url, tuple) else (spec.url,)
            if (spec.kind or "sglang") == "gen_searcher":
                client = images_lib.GenSearcherGenerator(list(urls), max_concurrency=spec.max_concurrency,
                                                          max_retries=spec.max_retries, **timeout)
            else:
                client = images_lib.SGLangImageGenerator(urls[0], model=spec.model, api_key=key,
                                                         max_concurrency=spec.max_concurrency,
                                                         max_retries=spec.max_retries, **timeout)
        else:
            client = chat.ChatClient(str(spec.url), model=str(spec.model), api_key=key, cache_dir=cache,
                                     max_concurrency=spec.max_concurrency, max_retries=spec.max_retries, **timeout)
        self._clients[role] = client
        return client

    def chat(self, role: str, stage: str) -> RecordingChat:
        """The chat service `role` (llm, judge, teacher), recorded under `stage`."""
        if role not in ("llm", "judge", "teacher"):
            raise ValueError(f"[{role}] is not a chat service (llm, judge, teacher are)")
        return RecordingChat(self._client(role), self.recorder, service=role, stage=stage)

    def serper(self, stage: str) -> RecordingSerper:
        """Serper, recorded under `stage`."""
        return RecordingSerper(self._client("serper"), self.recorder, stage=stage)

    def generator(self, stage: str) -> RecordingGenerator:
        """The image generator, recorded under `stage`."""
        return RecordingGenerator(self._client("generator"), self.recorder, stage=stage)

    def fetcher(self, stage: str) -> RecordingFetcher:
        """Guarded image downloads (for the judges), recorded under `stage`."""
        if "web" not in self._clients:
            cache = None if self.cache_dir is None else Path(self.cache_dir) / "web"
            self._clients["web"] = web.WebFetcher(urlguard.UrlGuard(self.allow_hosts), cache_dir=cache)
        return RecordingFetcher(self._clients["web"], self.recorder, stage=stage)

    async def aclose(self) -> None:
        """Closes every client that was built."""
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()
