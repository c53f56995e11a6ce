"""Client for the SGLang LLM server's native API: token-in/token-out `/generate` and the control endpoints.

Wire format: sglang 0.5.23's native HTTP API; the contract itself (sampling-param checks,
error types, response parsing) lives in `clients.sglang_protocol` and its public names are re-exported
here. Multi-turn VLM rollouts send the full token history as `input_ids` with ONE `<|image_pad|>` per image
(SGLang expands each to the image's run itself; `clients.sglang_mm` collapses our expanded runs and checks the
answer against them) and every image so far as `image_data` (lossless PNG data URLs, so the server sees the
exact pixels the policy's processor saw), with `return_logprob` on.

Seeds: a request's `sampling_seed` is honoured only by a server launched with `--enable-deterministic-inference`
(`get_server_info().deterministic_inference` says which); elsewhere sampling is not reproducible from seeds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import numpy as np

from ranger_jax.clients import http, media
from ranger_jax.clients.sglang_protocol import (
    FINISH_REASONS,
    SAMPLING_PARAM_TYPES,
    CacheFlushFailed,
    ContractViolation,
    GenerateResult,
    InvalidInput,
    MalformedRequest,
    ModelInfo,
    RequestAborted,
    ServerInfo,
    SGLangError,
    WeightUpdate,
    WeightUpdateFailed,
    as_error,
    generate_error,
    json_object,
    parse_generate_response,
    parse_model_info,
    parse_server_info,
    parse_weight_update,
    parse_weight_version,
    validate_sampling_params,
)

DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=5.0)  # one turn of up to 4096 new tokens under load
DEFAULT_MAX_RETRIES = http.DEFAULT_MAX_RETRIES
DEFAULT_MAX_CONCURRENCY = 64  # Gen-Searcher rollouts: 64 parallel tasks
WEIGHT_UPDATE_TIMEOUT = httpx.Timeout(1800.0, connect=5.0)
PAUSE_MODES = ("abort", "retract", "in_place")

__all__ = [  # the client, plus the protocol names re-exported so callers can write `sglang.<name>`
    "SGLangClient", "DEFAULT_TIMEOUT", "DEFAULT_MAX_RETRIES", "DEFAULT_MAX_CONCURRENCY", "WEIGHT_UPDATE_TIMEOUT",
    "PAUSE_MODES", "FINISH_REASONS", "SAMPLING_PARAM_TYPES", "SGLangError", "ContractViolation", "InvalidInput",
    "MalformedRequest", "RequestAborted", "CacheFlushFailed", "WeightUpdateFailed", "GenerateResult", "ModelInfo",
    "ServerInfo", "WeightUpdate", "parse_generate_response", "validate_sampling_params",
]


def _image_item(item: media.ImageLike | str) -> str:
    """A `/generate` image_data item: strings pass through (URL, data URL, base64), images become PNG data URLs."""
    if isinstance(item, str):
        return item
    return media.data_url(item, fmt="PNG")


@dataclasses.dataclass(frozen=True)
class _Call:
    """One HTTP exchange: what to send, and how to read the answer (or map its error)."""

    method: str
    path: str
    parse: Callable[[httpx.Response], Any]
    body: Any = None
    timeout: httpx.Timeout | None = None
    max_retries: int | None = None
    error: Callable[[http.StatusError], Exception] = lambda err: err


class SGLangClient:
    """Client for one SGLang LLM server (sync methods, and `a`-prefixed async twins).

    Args:
        base_url: server root, e.g. `http://127.0.0.1:30000`.
        api_key: for servers started with `--api-key` (sent as a Bearer token).
        timeout: per-request timeout of `/generate` (seconds or `httpx.Timeout`).
        max_retries: retries on transport errors, 408, 429 and 5xx.
        max_concurrency: requests in flight at once.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
                 max_retries: int = DEFAULT_MAX_RETRIES, max_concurrency: int = DEFAULT_MAX_CONCURRENCY):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.session = http.Session(base_url, timeout=timeout, max_retries=max_retries,
                                    max_concurrency=max_concurrency, headers=headers)

    @property
    def base_url(self) -> str:
        """The server root."""
        return self.session.base_url

    # -- request builders ------------------------------------------------------------------------------

    def _generate_call(self, input_ids: Sequence[int] | np.ndarray | None, text: str | None,
                       image_data: Sequence[media.ImageLike | str] | None, sampling_params: Mapping[str, Any] | None,
                       return_logprob: bool, rid: str | None, logprob_start_len: int,
                       return_text_in_logprobs: bool) -> _Call:
        if (input_ids is None) == (text is None):
            raise ValueError("pass exactly one of input_ids and text")
        body: dict[str, Any] = {"rid": rid or uuid.uuid4().hex}
        if input_ids is not None:
            ids = np.asarray(input_ids)
            if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
                raise ValueError(f"input_ids must be a non-empty 1-D sequence of ints, got shape {ids.shape} "
                                 f"dtype {ids.dtype}")
            body["input_ids"] = ids.astype(np.int64).tolist()
        else:
            body["text"] = text
        if image_data:
            body["image_data"] = [_image_item(item) for item in image_data]
        body["sampling_params"] = validate_sampling_params(sampling_params or {})
        body["return_logprob"] = bool(return_logprob)
        body["logprob_start_len"] = int(logprob_start_len)
        body["return_text_in_logprobs"] = bool(return_text_in_logprobs)
        body["stream"] = False

        def parse(response: httpx.Response) -> GenerateResult:
            return parse_generate_response(str(response.request.url), http.json_body(response),
                                           return_logprob=bool(return_logprob))

        return _Call("POST", "generate", parse, body=body, error=generate_error)

    async def _arun(self, call: _Call) -> Any:
        try:
            response = await self.session.arequest(call.method, call.path, json=call.body, timeout=call.timeout,
                                                   max_retries=call.max_retries)
        except http.StatusError as err:
            raise call.error(err) from err
        return call.parse(response)

    # -- /generate -------------------------------------------------------------------------------------

    async def agenerate(self, input_ids: Sequence[int] | np.ndarray | None = None, *, text: str | None = None,
                        image_data: Sequence[media.ImageLike | str] | None = None,
                        sampling_params: Mapping[str, Any] | None = None, return_logprob: bool = True,
                        rid: str | None = None, logprob_start_len: int = -1,
                        return_text_in_logprobs: bool = False) -> GenerateResult:
        """Generates one continuation.

        Args:
            input_ids: [T] prompt token ids with ONE `<|image_pad|>` per image of `image_data` (SGLang expands it;
                a prompt with expanded runs is decoded and re-tokenised by the server: use
                `sglang_mm.collapse_image_runs`). The answer's `prompt_tokens` counts the expanded prompt.
            text: a prompt string instead (SGLang then expands image placeholders itself).
            image_data: every image the prompt refers to, in order: PIL images or encoded bytes (sent as
                lossless PNG data URLs), or strings sent as given (URL, data URL, base64).
            sampling_params: SGLang sampling params, checked by `validate_sampling_params` (`sampling_seed` is
                ignored unless the server runs with `--enable-deterministic-inference`).
            return_logprob: return the log-prob of every output token.
            rid: request id (for `abort_request`); a fresh uuid4 hex when None.
            logprob_start_len: −1 = output tokens only; k ≥ 0 also returns prompt log-probs from position k.
            return_text_in_logprobs: fill the text slot of each logprob triple.

        Raises:
            ValueError: bad arguments (checked before sending).
            ContractViolation / InvalidInput / MalformedRequest / RequestAborted: see the module docstring.
            RateLimited / StatusError / TransportFailed / ResponseFormatError: other failures.
        """
        return await self._arun(self._generate_call(input_ids, text, image_data, sampling_params, return_logprob,
                                                    rid, logprob_start_len, return_text_in_logprobs))

    def generate(self, input_ids: Sequence[int] | np.ndarray | None = None, *, text: str | None = None,
                 image_data: Sequence[media.ImageLike | str] | None = None,
                 sampling_params: Mapping[str, Any] | None = None, return_logprob: bool = True,
                 rid: str | None = None, logprob_start_len: int = -1,
                 return_text_in_logprobs: bool = False) -> GenerateResult:
        """Sync twin of `agenerate`."""
        return self.session.run_sync(self.agenerate(
            input_ids, text=text, image_data=image_data, sampling_params=sampling_params,
            return_logprob=return_logprob, rid=rid, logprob_start_len=logprob_start_len,
            return_text_in_logprobs=return_text_in_logprobs))

    # -- control endpoints -----------------------------------------------------------------------------

    async def ahealth(self) -> bool:
        """True when `GET /health` answers 200 (False on 503 or no answer; no retries)."""
        call = _Call("GET", "health", lambda response: True, max_retries=0, timeout=httpx.Timeout(30.0, connect=2.0))
        try:
            return await self._arun(call)
        except (http.StatusError, http.TransportFailed):
            return False

    def health(self) -> bool:
        """Sync twin of `ahealth`."""
        return self.session.run_sync(self.ahealth())

    async def await_healthy(self, timeout_s: float = 300.0, *, poll_s: float = 1.0) -> None:
        """Polls `/health` until it answers 200.

        Raises:
            TimeoutError: still unhealthy after `timeout_s` (the message names the URL).
        """
        deadline = time.monotonic() + timeout_s
        while not await self.ahealth():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.session.url('health')} not healthy after {timeout_s:.0f}s")
            await asyncio.sleep(poll_s)

    def wait_until_healthy(self, timeout_s: float = 300.0, *, poll_s: float = 1.0) -> None:
        """Sync twin of `await_healthy`."""
        self.session.run_sync(self.await_healthy(timeout_s, poll_s=poll_s))

    async def _aget_first(self, paths: Sequence[str], parse: Callable[[httpx.Response], Any]) -> Any:
        """GETs the first of `paths` the server knows (404: the next one, an older server's name for it)."""
        for index, path in enumerate(paths):
            try:
                return await self._arun(_Call("GET", path, parse))
            except http.StatusError as err:
                if err.status != 404 or index == len(paths) - 1:
                    raise
        raise AssertionError("unreachable")

    async def aget_model_info(self) -> ModelInfo:
        """The served model's facts from `GET /model_info` (`/get_model_info` on servers without it)."""
        return await self._aget_first(("model_info", "get_model_info"), parse_model_info)

    def get_model_info(self) -> ModelInfo:
        """Sync twin of `aget_model_info`."""
        return self.session.run_sync(self.aget_model_info())

    async def aget_server_info(self) -> ServerInfo:
        """The server's launch arguments from `GET /server_info` (`/get_server_info` on servers without it),
        e.g. whether it honours `sampling_seed` (`deterministic_inference`)."""
        return await self._aget_first(("server_info", "get_server_info"), parse_server_info)

    def get_server_info(self) -> ServerInfo:
        """Sync twin of `aget_server_info`."""
        return self.session.run_sync(self.aget_server_info())

    async def aflush_cache(self) -> str:
        """Flushes the radix cache; returns the server's plain-text message. Raises CacheFlushFailed on 400."""
        call = _Call("POST", "flush_cache", lambda response: response.text, error=as_error(CacheFlushFailed))
        return await self._arun(call)

    def flush_cache(self) -> str:
        """Sync twin of `aflush_cache`."""
        return self.session.run_sync(self.aflush_cache())

    async def aupdate_weights_from_disk(self, model_path: str, *, weight_version: str | None = None,
                                        load_format: str | None = None, abort_all_requests: bool = False,
                                        flush_cache: bool = True) -> WeightUpdate:
        """Loads new weights from `model_path` (HF layout on storage the server can read).

        Raises:
            ValueError: an empty `model_path`.
            WeightUpdateFailed: the server answered `success: false` (its message is kept).
        """
        if not model_path:
            raise ValueError("update_weights_from_disk needs a model_path")
        body = {"model_path": str(model_path), "load_format": load_format, "abort_all_requests": abort_all_requests,
                "weight_version": weight_version, "flush_cache": flush_cache}
        return await self._arun(_Call("POST", "update_weights_from_disk", parse_weight_update, body=body,
                                      timeout=WEIGHT_UPDATE_TIMEOUT, error=as_error(WeightUpdateFailed)))

    def update_weights_from_disk(self, model_path: str, *, weight_version: str | None = None,
                                 load_format: str | None = None, abort_all_requests: bool = False,
                                 flush_cache: bool = True) -> WeightUpdate:
        """Sync twin of `aupdate_weights_from_disk`."""
        return self.session.run_sync(self.aupdate_weights_from_disk(
            model_path, weight_version=weight_version, load_format=load_format,
            abort_all_requests=abort_all_requests, flush_cache=flush_cache))

    async def aupdate_weight_version(self, new_version: str, *, abort_all_requests: bool = True) -> str:
        """Relabels the loaded weights; returns the new version."""
        body = {"new_version": str(new_version), "abort_all_requests": abort_all_requests}
        return await self._arun(_Call("POST", "update_weight_version", parse_weight_version, body=body,
                                      error=as_error(WeightUpdateFailed)))

    def update_weight_version(self, new_version: str, *, abort_all_requests: bool = True) -> str:
        """Sync twin of `aupdate_weight_version`."""
        return self.session.run_sync(self.aupdate_weight_version(new_version, abort_all_requests=abort_all_requests))

    async def apause_generation(self, mode: str = "abort") -> None:
        """Pauses generation: `abort` returns in-flight requests, `retract` requeues them, `in_place` freezes."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
        await self._arun(_Call("POST", "pause_generation", json_object, body={"mode": mode}))

    def pause_generation(self, mode: str = "abort") -> None:
        """Sync twin of `apause_generation`."""
        self.session.run_sync(self.apause_generation(mode))

    async def acontinue_generation(self) -> None:
        """Resumes generation after `pause_generation`."""
        await self._arun(_Call("POST", "continue_generation", json_object, body={}))

    def continue_generation(self) -> None:
        """Sync twin of `acontinue_generation`."""
        self.session.run_sync(self.acontinue_generation())

    async def aabort_request(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """Aborts request `rid` (or all); the aborted `/generate` call returns with finish_reason `abort`."""
        if rid is None and not abort_all:
            raise ValueError("abort_request needs a rid, or abort_all=True")
        await self._arun(_Call("POST", "abort_request", lambda response: None,
                               body={"rid": rid or "", "abort_all": abort_all}))

    def abort_request(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """Sync twin of `aabort_request`."""
        self.session.run_sync(self.aabort_request(rid, abort_all=abort_all))

    def close(self) -> None:
        """Closes the connection of sync calls (async ones close with `aclose` from their loop)."""
        self.session.close()

    async def aclose(self) -> None:
        """Closes the current loop's connection and the one of sync calls."""
        await self.session.aclose()

    def __enter__(self) -> "SGLangClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> "SGLangClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
