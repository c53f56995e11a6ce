"""Image generators behind one interface: SGLang diffusion's images API and the Gen-Searcher `/generate` service.

`generate(prompt, references, *, seed, size)` never raises for a failed generation: it returns a
`GenerationResult` with `ok=False` and the error text, so a rollout records the failure on its trajectory
instead of losing it. Bad arguments are reported the same way. The output is always PNG bytes.

Wire formats: sglang 0.5.23's diffusion server (`/v1/images/generations` takes JSON, `/v1/images/edits` takes
multipart form data with the references as `url` fields) and Gen-Searcher's image-edit service
(`qwen-image-edit/api.py`: one JSON `/generate` with base64 references).

Each generator takes its service's `http.RetryPolicy`. Gen-Searcher's service cannot cancel a request it has
accepted: it queues it until a GPU is free (up to 6000 s, then 503 "All GPUs are busy"), runs it (up to 1800 s, then
504 "Inference timeout", taking that GPU out of rotation while the work goes on), and answers 400 for a reference it
cannot read. So its requests are not idempotent: the client waits longer than the service's own limits, never sends a
request again after a read timeout or a dropped connection (a second copy would queue a second job), retries only
429, 503 (nothing ran) and failures to connect, and records the status, the tries and whether the request may still
be running in the result's `request` facts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import httpx

from ranger_jax import background
from ranger_jax.clients import http, media

DEFAULT_TIMEOUT = httpx.Timeout(1800.0, connect=5.0)  # Gen-Searcher's inference timeout
DEFAULT_MAX_RETRIES = 2
GEN_SEARCHER_GPU_WAIT_S = 6000.0  # the service's GPU_WAIT_TIMEOUT: queued this long, a request gets 503
GEN_SEARCHER_INFER_S = 1800.0  # its INFER_TIMEOUT: inference running longer gets 504
# wait for the service's own verdict: a shorter read timeout abandons a request that will still run
GEN_SEARCHER_TIMEOUT = httpx.Timeout(GEN_SEARCHER_GPU_WAIT_S + GEN_SEARCHER_INFER_S + 60.0, connect=5.0)
GEN_SEARCHER_RETRY = http.RetryPolicy(max_retries=DEFAULT_MAX_RETRIES, retry_status=frozenset({429, 503}),
                                      idempotent=False)
GEN_SEARCHER_STATUS = {  # what the service's error statuses mean (qwen-image-edit/api.py)
    400: "the service could not load a reference image",
    503: "no GPU came free within the service's GPU-wait limit; nothing ran",
    504: "inference outlasted the service's limit; it took that GPU out of rotation and cannot stop the work",
}
DEFAULT_MAX_CONCURRENCY = 20  # Gen-Searcher's GEN_API_CONCURRENCY default
MAX_REFERENCES = 3  # MAX_REF_IMAGES_FOR_QWEN: the reward path sends the first 3 refs
URL_PREFIXES = ("http://", "https://", "data:")
_SIZE = re.compile(r"^([1-9][0-9]*)x([1-9][0-9]*)$")


@dataclasses.dataclass(frozen=True)
class GenerationResult:
    """The outcome of one generation.

    Attributes:
        ok: an image was produced.
        image: the generated image as PNG bytes (None when not ok).
        error: what went wrong (None when ok).
        latency_s: wall time of the call, retries included.
        request: the facts needed to reproduce the call (endpoint, seed, steps, cfg, size, reference count).
    """

    ok: bool
    image: bytes | None
    error: str | None
    latency_s: float
    request: Mapping[str, Any]


@runtime_checkable
class Generator(Protocol):
    """Anything that turns a prompt and reference images into an image."""

    def generate(self, prompt: str, references: Sequence[media.ImageLike] = (), *, seed: int | None = None,
                 size: str | tuple[int, int] | None = None) -> GenerationResult:
        """An image for `prompt` from the references, as PNG bytes in a GenerationResult; never raises."""

    async def agenerate(self, prompt: str, references: Sequence[media.ImageLike] = (), *, seed: int | None = None,
                        size: str | tuple[int, int] | None = None) -> GenerationResult:
        """The async `generate`."""


def parse_size(size: str | tuple[int, int]) -> tuple[int, int]:
    """(width, height) from `"WxH"` or a pair.

    Raises:
        ValueError: not two positive integers (the message quotes the value).
    """
    if isinstance(size, str):
        match = _SIZE.match(size.strip())
        if match is None:
            raise ValueError(f"size must be formatted as positive WIDTHxHEIGHT, got {size!r}")
        return int(match.group(1)), int(match.group(2))
    width, height = size
    if int(width) < 1 or int(height) < 1:
        raise ValueError(f"size must be two positive integers, got {size!r}")
    return int(width), int(height)


def reference_url(reference: media.ImageLike | str) -> str:
    """How a reference travels: `http(s)://` and `data:` URL strings as given, anything else (PIL image,
    encoded bytes, a file path) as a lossless PNG data URL."""
    if isinstance(reference, str) and reference.startswith(URL_PREFIXES):
        return reference
    return media.data_url(reference, fmt="PNG")


def _failure(error: str, start: float, request: Mapping[str, Any]) -> GenerationResult:
    return GenerationResult(ok=False, image=None, error=error, latency_s=time.monotonic() - start, request=request)


def _describe(err: Exception) -> str:
    if isinstance(err, http.StatusError):
        return f"HTTP {err.status} from {err.url}: {http.error_message(err.body)[:500]}"
    return f"{type(err).__name__}: {err}"


def record_failure(err: http.ClientError, facts: dict[str, Any],
                   meanings: Mapping[int, str] | None = None) -> str:
    """The error text of a failed call, with what happened recorded in `facts`: the HTTP `status`, the
    `attempts` made, and for a transport failure whether the request `may_still_run` on the server."""
    text = _describe(err)
    if isinstance(err, (http.StatusError, http.TransportFailed)):
        facts["attempts"] = err.attempts
    if isinstance(err, http.StatusError):
        facts["status"] = err.status
        meaning = (meanings or {}).get(err.status)
        return f"{text} ({meaning})" if meaning else text
    if isinstance(err, http.TransportFailed):
        facts["may_still_run"] = err.may_have_run
        if err.may_have_run:
            return f"{text}; not sent again: the request may still be queued or running on the server"
    return text


def _png_result(payload: str, start: float, request: Mapping[str, Any], url: str) -> GenerationResult:
    """A successful result from a base64 image payload, re-encoded as PNG; a bad payload is a failure."""
    try:
        image = media.png_bytes(media.decode_base64_image(payload))
    except ValueError as err:
        return _failure(f"{url} returned an undecodable image: {err}", start, request)
    return GenerationResult(ok=True, image=image, error=None, latency_s=time.monotonic() - start, request=request)


class SGLangImageGenerator:
    """SGLang diffusion server: `/v1/images/generations` without references, `/v1/images/edits` with them.

    References go to `/edits` as `url` form fields holding PNG data URLs, in order (the server's reference
    order). Seed, steps, cfg and size are pinned per request so rewards are reproducible.

    Args:
        base_url: server root, e.g. `http://127.0.0.1:30010`.
        model: sent as `model` (the server serves one model; informational).
        seed: default seed when `generate` gets none.
        num_inference_steps: denoising steps (Qwen-Image-Edit-Plus default 40).
        true_cfg_scale: Qwen-Image true CFG scale (4.0 in Gen-Searcher).
        guidance_scale: distilled guidance (None: the model default).
        negative_prompt: Qwen-Image's default is a single space.
        size: default `"WxH"`; None lets the server choose.
        max_references: references beyond this count are dropped (recorded in `request`).
        timeout, max_retries, max_concurrency, api_key: transport settings.
        retry: the service's retry policy (replaces `max_retries` when given).
    """

    def __init__(self, base_url: str, *, model: str | None = None, seed: int = 0, num_inference_steps: int = 40,
                 true_cfg_scale: float | None = 4.0, guidance_scale: float | None = None,
                 negative_prompt: str | None = " ", size: str | None = "1024x1024",
                 max_references: int = MAX_REFERENCES, timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
                 max_retries: int = DEFAULT_MAX_RETRIES, max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
                 api_key: str | None = None, retry: http.RetryPolicy | None = None):
        if num_inference_steps < 1:
            raise ValueError(f"num_inference_steps must be >= 1, got {num_inference_steps}")
        if max_references < 1:
            raise ValueError(f"max_references must be >= 1, got {max_references}")
        if size is not None:
            parse_size(size)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.session = http.Session(base_url, timeout=timeout, max_retries=max_retries,
                                    max_concurrency=max_concurrency, headers=headers, retry=retry)
        self.model, self.seed, self.size = model, seed, size
        self.num_inference_steps, self.true_cfg_scale = num_inference_steps, true_cfg_scale
        self.guidance_scale, self.negative_prompt = guidance_scale, negative_prompt
        self.max_references = max_references

    def _fields(self, prompt: str, seed: int | None, size: str | tuple[int, int] | None) -> dict[str, Any]:
        if not prompt.strip():
            raise ValueError("prompt is empty")
        fields: dict[str, Any] = {"prompt": prompt, "n": 1, "response_format": "b64_json", "output_format": "png",
                                  "seed": self.seed if seed is None else int(seed),
                                  "num_inference_steps": self.num_inference_steps}
        chosen = size if size is not None else self.size
        if chosen is not None:
            width, height = parse_size(chosen)
            fields["size"] = f"{width}x{height}"
        optional = {"model": self.model, "true_cfg_scale": self.true_cfg_scale,
                    "guidance_scale": self.guidance_scale, "negative_prompt": self.negative_prompt}
        fields.update({k: v for k, v in optional.items() if v is not None})
        return fields

    def _plan(self, prompt: str, references: Sequence[media.ImageLike], seed: int | None,
              size: str | tuple[int, int] | None) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """(path, httpx request options, request facts) for one generation."""
        fields = self._fields(prompt, seed, size)
        used = list(references)[: self.max_references]
        facts = {**fields, "num_references": len(used), "num_references_given": len(references)}
        if not used:
            facts["endpoint"] = self.session.url("v1/images/generations")
            return "v1/images/generations", {"json": fields}, facts
        urls = [reference_url(ref) for ref in used]
        form = [(k, str(v)) for k, v in fields.items()] + [("url", u) for u in urls]
        facts["endpoint"] = self.session.url("v1/images/edits")
        # httpx sends multipart/form-data when `files` is given; the urls ride as repeated text fields
        return "v1/images/edits", {"files": [(k, (None, v)) for k, v in form]}, facts

    def _read(self, response: httpx.Response, start: float, facts: Mapping[str, Any]) -> GenerationResult:
        url = str(response.request.url)
        try:
            body = http.json_body(response)
        except http.ResponseFormatError as err:
            return _failure(str(err), start, facts)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            return _failure(f"{url} returned no data[0] in {str(body)[:200]!r}", start, facts)
        payload = data[0].get("b64_json")
        if not isinstance(payload, str) or not payload:
            return _failure(f"{url} returned data[0] without b64_json (url={data[0].get('url')!r})", start, facts)
        return _png_result(payload, start, facts, url)

    async def agenerate(self, prompt: str, references: Sequence[media.ImageLike] = (), *, seed: int | None = None,
                        size: str | tuple[int, int] | None = None) -> GenerationResult:
        """Generates one image; failures come back as `ok=False` results (see module docstring)."""
        start = time.monotonic()
        try:
            path, options, facts = self._plan(prompt, references, seed, size)
        except (ValueError, FileNotFoundError) as err:
            return _failure(f"bad generation request: {err}", start, {"prompt": prompt})
        try:
            response = await self.session.arequest("POST", path, **options)
        except http.ClientError as err:
            return _failure(record_failure(err, facts), start, facts)
        return self._read(response, start, facts)

    def generate(self, prompt: str, references: Sequence[media.ImageLike] = (), *, seed: int | None = None,
                 size: str | tuple[int, int] | None = None) -> GenerationResult:
        """Sync twin of `agenerate`."""
        return self.session.run_sync(self.agenerate(prompt, references, seed=seed, size=size))

    def close(self) -> None:
        """Closes the connection of sync calls (async ones close with `aclose` from their loop)."""
        self.session.close()

    async def aclose(self) -> None:
        """Closes the current loop's connection and the one of sync calls."""
        await self.session.aclose()


class GenSearcherGenerator:
    """Gen-Searcher's Qwen-Image-Edit service: `POST {url}/generate` with `image_urls` data URLs.

    Several service URLs share the load: a call goes to the URL with the fewest requests in flight (ties in
    round-robin order), at most `max_per_url` at once per URL and `max_concurrency` overall. The contract
    has no size field and needs at least one reference image.

    Args:
        base_urls: one service root or several (Gen-Searcher's `QWEN_EDIT_APP_URL` list).
        seed, num_inference_steps, true_cfg_scale, guidance_scale, negative_prompt: pinned per request
            (Gen-Searcher: 0, 40, 4.0, 1.0, " ").
        max_references: first N references are sent (3 in Gen-Searcher).
        max_concurrency / max_per_url: global and per-URL in-flight limits (20 and 8 in Gen-Searcher).
        timeout: per request; the default outlasts the service's GPU wait plus its inference limit, so its own
            503/504 arrive instead of a client timeout that would leave the job running.
        retry: the service's retry policy (default `GEN_SEARCHER_RETRY`: not idempotent, retries 429 and 503).
        max_retries: shorthand that changes only the policy's retry count.
    """

    def __init__(self, base_urls: str | Sequence[str], *, seed: int = 0, num_inference_steps: int = 40,
                 true_cfg_scale: float = 4.0, guidance_scale: float = 1.0, negative_prompt: str = " ",
                 max_references: int = MAX_REFERENCES, max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
                 max_per_url: int = 8, timeout: float | httpx.Timeout = GEN_SEARCHER_TIMEOUT,
                 retry: http.RetryPolicy = GEN_SEARCHER_RETRY, max_retries: int | None = None):
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("GenSearcherGenerator needs at least one base URL")
        if max_per_url < 1 or max_concurrency < 1:
            raise ValueError(f"max_per_url and max_concurrency must be >= 1, got {max_per_url}, {max_concurrency}")
        self.retry = retry if max_retries is None else dataclasses.replace(retry, max_retries=max_retries)
        self.sessions = [http.Session(u, timeout=timeout, max_concurrency=max_per_url, retry=self.retry)
                         for u in urls]
        self.seed, self.num_inference_steps, self.true_cfg_scale = seed, num_inference_steps, true_cfg_scale
        self.guidance_scale, self.negative_prompt, self.max_references = guidance_scale, negative_prompt, max_references
        self.max_concurrency = min(max_concurrency, max_per_url * len(urls))
        self._in_flight = [0] * len(urls)
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._background = background.BackgroundLoop("GenSearcherGenerator")
        self._loop_slots: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Semaphore]] = {}

    def _body(self, prompt: str, references: Sequence[media.ImageLike], seed: int | None,
              size: str | tuple[int, int] | None) -> tuple[dict[str, Any], dict[str, Any]]:
        if size is not None:
            raise ValueError("the Gen-Searcher /generate contract has no size field; pass size=None")
        if not prompt.strip():
            raise ValueError("prompt is empty")
        used = list(references)[: self.max_references]
        if not used:
            raise ValueError("the Gen-Searcher edit service needs at least one reference image, got 0")
        body = {"image_urls": [reference_url(r) for r in used], "prompt": prompt,
                "seed": self.seed if seed is None else int(seed), "true_cfg_scale": self.true_cfg_scale,
                "negative_prompt": self.negative_prompt, "num_inference_steps": self.num_inference_steps,
                "guidance_scale": self.guidance_scale, "num_images_per_prompt": 1}
        facts = {k: v for k, v in body.items() if k != "image_urls"}
        facts.update(num_references=len(used), num_references_given=len(references))
        return body, facts

    def _acquire_url(self) -> int:
        with self._lock:
            tie_break = next(self._order)
            n = len(self.sessions)
            index = min(range(n), key=lambda i: (self._in_flight[i], (i - tie_break) % n))
            self._in_flight[index] += 1
            return index

    def _release_url(self, index: int) -> None:
        with self._lock:
            self._in_flight[index] -= 1

    def _read(self, response: httpx.Response, start: float, facts: dict[str, Any]) -> GenerationResult:
        url = str(response.request.url)
        try:
            body = http.json_body(response)
        except http.ResponseFormatError as err:
            return _failure(str(err), start, facts)
        if not isinstance(body, dict) or "success" not in body:
            return _failure(f"{url} answered without 'success': {str(body)[:200]!r}", start, facts)
        if body["success"] is not True:
            return _failure(f"{url} reported failure: {body.get('message', '<no message>')}", start, facts)
        if not isinstance(body.get("image"), str):
            return _failure(f"{url} reported success without an 'image' string", start, facts)
        return _png_result(body["image"], start, facts, url)

    def _async_slots(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        entry = self._loop_slots.get(id(loop))
        if entry is None or entry[0] is not loop:
            entry = (loop, asyncio.Semaphore(self.max_concurrency))
            self._loop_slots = {k: v for k, v in self._loop_slots.items() if not v[0].is_closed()}
            self._loop_slots[id(loop)] = entry
        return entry[1]

    async def agenerate(self, prompt: str, references: Sequence[media.ImageLike] = (), *, seed: int | None = None,
                        size: str | tuple[int, int] | None = None) -> GenerationResult:
        """Generates one image; failures come back as `ok=False` results."""
        start = time.monotonic()
        try:
            body, facts = self._body(prompt, references, seed, size)
        except (ValueError, FileNotFoundError) as err:
            return _failure(f"bad generation request: {err}", start, {"prompt": prompt})
        async with self._async_slots():
            index = self._acquire_url()
            facts["endpoint"] = self.sessions[index].url("generate")
            try:
                response = await self.sessions[index].arequest("POST", "generate", json=body)
            except http.ClientError as err:
                return _failure(record_failure(err, facts, GEN_SEARCHER_STATUS), start, facts)
            finally:
                self._release_url(index)
        return self._read(response, start, facts)

    def generate(self, prompt: str, references: Sequence[media.ImageLike] = (), *, seed: int | None = None,
                 size: str | tuple[int, int] | None = None) -> GenerationResult:
        """Sync twin of `agenerate`, run on the generator's background loop."""
        return self._background.run(self.agenerate(prompt, references, seed=seed, size=size))

    def close(self) -> None:
        """Closes the connections of sync calls and stops their loop (async ones close with `aclose` from their
        loop)."""
        self._background.close(self.aclose)
        for session in self.sessions:
            session.close()

    async def aclose(self) -> None:
        """Closes the current loop's connections and those of sync calls."""
        for session in self.sessions:
            await session.aclose()
