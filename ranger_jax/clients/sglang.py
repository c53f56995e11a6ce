"""Client for the SGLang LLM server's native API: token-in/token-out `/generate` and the control endpoints.

Wire format: reference/wire_formats.md §1 (sglang 0.5.23). Multi-turn VLM rollouts send the full,
processor-expanded token history as `input_ids` and every image so far as `image_data` (lossless PNG data
URLs, so the server sees the exact pixels the policy's processor saw), with `return_logprob` on.

Errors of `/generate` map to specific types (all `StatusError`s):
  - 400 `{"error": "<text>"}` (JSON contract, e.g. an unknown sampling param) → `ContractViolation`;
  - 400 `{"error": {"message"}}` (bad input, scheduler-side validation abort) → `InvalidInput`;
  - 400 `{"object": "error", …}` (body could not be parsed) → `MalformedRequest`;
  - another status with `{"object": "error", …}` (abort with a status code, e.g. 503 timeout; retried
    first) → `RequestAborted`;
  - an abort without status code (`/abort_request`, pause mode `abort`) is HTTP 200: no error, the result
    has `finish_reason == "abort"`, `abort_message` and the partial output.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import numpy as np

from ranger_jax.clients import http, media

DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=5.0)  # one turn of up to 4096 new tokens under load
DEFAULT_MAX_RETRIES = http.DEFAULT_MAX_RETRIES
DEFAULT_MAX_CONCURRENCY = 64  # Gen-Searcher rollouts: 64 parallel tasks
WEIGHT_UPDATE_TIMEOUT = httpx.Timeout(1800.0, connect=5.0)
FINISH_REASONS = ("stop", "length", "abort")
PAUSE_MODES = ("abort", "retract", "in_place")

_INT, _NUM, _BOOL, _STR = (int,), (int, float), (bool,), (str,)
SAMPLING_PARAM_TYPES: dict[str, tuple[type, ...]] = {
    "max_new_tokens": _INT, "min_new_tokens": _INT, "stop": (str, list), "stop_regex": (str, list),
    "stop_token_ids": (list,), "temperature": _NUM, "top_p": _NUM, "top_k": _INT, "min_p": _NUM,
    "frequency_penalty": _NUM, "presence_penalty": _NUM, "repetition_penalty": _NUM, "n": _INT,
    "json_schema": _STR, "regex": _STR, "ebnf": _STR, "structural_tag": _STR, "ignore_eos": _BOOL,
    "no_stop_trim": _BOOL, "skip_special_tokens": _BOOL, "spaces_between_special_tokens": _BOOL,
    "logit_bias": (dict,), "sampling_seed": _INT, "custom_params": (dict,), "stream_interval": _INT,
    "beam_width": _INT, "watermark": (dict, bool), "choice": (list, dict),
}
_CONSTRAINTS = ("json_schema", "regex", "ebnf", "structural_tag")


class SGLangError(http.StatusError):
    """An SGLang endpoint refused or aborted a request; `message` is the server's text."""

    def __init__(self, status: int, url: str, body: str):
        super().__init__(status, url, body)
        self.message = http.error_message(body)


class ContractViolation(SGLangError):
    """HTTP 400 `{"error": "<text>"}`: the body broke the JSON contract (unknown key, wrong type)."""


class InvalidInput(SGLangError):
    """HTTP 400 `{"error": {"message"}}`: bad input found while normalising, tokenising or scheduling."""


class MalformedRequest(SGLangError):
    """HTTP 400 `{"object": "error", …}`: the request body could not be parsed."""


class RequestAborted(SGLangError):
    """A non-400 `{"object": "error", …}` answer: the server aborted the request with a status (e.g. 503)."""


class CacheFlushFailed(SGLangError):
    """`/flush_cache` refused (requests still running or a pause in place)."""


class WeightUpdateFailed(SGLangError):
    """`/update_weights_from_disk` or `/update_weight_version` reported failure."""


def _generate_error(err: http.StatusError) -> http.StatusError:
    if isinstance(err, http.RateLimited):
        return err
    try:
        obj = json.loads(err.body)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        return err
    if err.status == 400 and isinstance(obj.get("error"), str):
        return ContractViolation(err.status, err.url, err.body)
    if err.status == 400 and isinstance(obj.get("error"), dict):
        return InvalidInput(err.status, err.url, err.body)
    if obj.get("object") == "error":
        cls = MalformedRequest if err.status == 400 else RequestAborted
        return cls(err.status, err.url, err.body)
    return err


def validate_sampling_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Checks `params` against SGLang's `SamplingParams` contract before sending (the server rejects them too).

    Raises:
        ValueError: an unknown key (the message lists the known ones), a wrong JSON type, more than one
            constraint, or values outside their documented ranges.
    """
    out = {}
    for key, value in params.items():
        if key not in SAMPLING_PARAM_TYPES:
            raise ValueError(f"unknown sampling_params key {key!r}; SGLang accepts {sorted(SAMPLING_PARAM_TYPES)}")
        if value is None:
            out[key] = None
            continue
        types = SAMPLING_PARAM_TYPES[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            if key == "json_schema" and isinstance(value, dict):
                raise ValueError("sampling_params['json_schema'] must be JSON text; pass json.dumps(schema)")
            names = "/".join(t.__name__ for t in types)
            raise ValueError(f"sampling_params[{key!r}] must be {names}, got {type(value).__name__} {value!r:.60}")
        out[key] = value
    if sum(out.get(k) is not None for k in _CONSTRAINTS) > 1:
        raise ValueError(f"sampling_params may hold at most one of {_CONSTRAINTS}, got {[k for k in _CONSTRAINTS if out.get(k)]}")
    if out.get("temperature") is not None and out["temperature"] < 0:
        raise ValueError(f"sampling_params['temperature'] must be >= 0, got {out['temperature']}")
    if out.get("top_p") is not None and not 0 < out["top_p"] <= 1:
        raise ValueError(f"sampling_params['top_p'] must be in (0, 1], got {out['top_p']}")
    if out.get("max_new_tokens") is not None and out["max_new_tokens"] < 0:
        raise ValueError(f"sampling_params['max_new_tokens'] must be >= 0, got {out['max_new_tokens']}")
    if out.get("n") not in (None, 1):
        raise ValueError(f"sampling_params['n'] = {out['n']}: this client sends one sample per request; "
                         "send n requests with their own rids instead")
    ids = out.get("stop_token_ids") or []
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise ValueError(f"sampling_params['stop_token_ids'] must be a list of ints, got {ids!r:.80}")
    return out


def _image_item(item: media.ImageLike | str) -> str:
    """A `/generate` image_data item: strings pass through (URL, data URL, base64), images become PNG data URLs."""
    if isinstance(item, str):
        return item
    return media.data_url(item, fmt="PNG")


@dataclasses.dataclass(frozen=True)
class GenerateResult:
    """One `/generate` answer.

    Attributes:
        rid: the request id (`meta_info.id`).
        output_ids: [N] int32 generated ids, the final stop/EOS token included.
        output_logprobs: [N] float32 log-probs of `output_ids` (None without `return_logprob`).
        finish_reason: `stop`, `length` or `abort`.
        matched_stop: for `stop`, the matched token id or stop string.
        abort_message: for `abort`, the server's message.
        text: decoded completion (None on `--skip-tokenizer-init` servers).
        prompt_tokens / completion_tokens / cached_tokens: counts (prompt counts expanded image tokens).
        weight_version: the weights that produced the output.
        input_logprobs: [P] float32 prompt log-probs when `logprob_start_len >= 0` (NaN where null).
        meta_info: the raw `meta_info` object.
    """

    rid: str
    output_ids: np.ndarray
    output_logprobs: np.ndarray | None
    finish_reason: str
    matched_stop: int | str | None
    abort_message: str | None
    text: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    weight_version: str
    input_logprobs: np.ndarray | None
    meta_info: Mapping[str, Any]

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"


def _logprob_triples(url: str, key: str, triples: Any, *, allow_null: bool) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(triples, list):
        raise http.ResponseFormatError(url, f"meta_info.{key} is {type(triples).__name__}, not a list")
    ids, values = [], []
    for i, triple in enumerate(triples):
        if not isinstance(triple, (list, tuple)) or len(triple) < 2:
            raise http.ResponseFormatError(url, f"meta_info.{key}[{i}] is not a [logprob, token_id, text] triple")
        logprob, token = triple[0], triple[1]
        if logprob is None and not allow_null:
            raise http.ResponseFormatError(url, f"meta_info.{key}[{i}] has a null logprob")
        ids.append(int(token))
        values.append(np.nan if logprob is None else float(logprob))
    return np.asarray(ids, np.int32), np.asarray(values, np.float32)


def parse_generate_response(url: str, body: Any, *, return_logprob: bool) -> GenerateResult:
    """A `GenerateResult` from one `/generate` response object.

    Raises:
        ResponseFormatError: a missing `output_ids`/`meta_info`/`finish_reason`, an unknown finish type, or
            logprob triples that disagree with `output_ids` (the message names both counts).
    """
    if not isinstance(body, dict):
        raise http.ResponseFormatError(url, f"/generate answered a {type(body).__name__}, expected one object")
    meta = body.get("meta_info")
    if not isinstance(meta, dict):
        raise http.ResponseFormatError(url, "no 'meta_info' object in /generate response")
    if not isinstance(body.get("output_ids"), list):
        raise http.ResponseFormatError(url, "no 'output_ids' list in /generate response")
    output_ids = np.asarray(body["output_ids"], np.int32).reshape(-1)
    finish = meta.get("finish_reason")
    if not isinstance(finish, dict) or finish.get("type") not in FINISH_REASONS:
        raise http.ResponseFormatError(url, f"meta_info.finish_reason {finish!r:.100} is not one of {FINISH_REASONS}")
    output_logprobs = input_logprobs = None
    if return_logprob:
        ids, output_logprobs = _logprob_triples(url, "output_token_logprobs", meta.get("output_token_logprobs"),
                                                allow_null=False)
        if len(ids) != len(output_ids):
            raise http.ResponseFormatError(
                url, f"output_token_logprobs has {len(ids)} entries but output_ids has {len(output_ids)}")
        if not np.array_equal(ids, output_ids):
            first = int(np.flatnonzero(ids != output_ids)[0])
            raise http.ResponseFormatError(url, f"output_token_logprobs[{first}] is for token {ids[first]} "
                                                f"but output_ids[{first}] = {output_ids[first]}")
        if meta.get("input_token_logprobs"):
            input_logprobs = _logprob_triples(url, "input_token_logprobs", meta["input_token_logprobs"],
                                              allow_null=True)[1]
    return GenerateResult(
        rid=str(meta.get("id", "")),
        output_ids=output_ids,
        output_logprobs=output_logprobs,
        finish_reason=finish["type"],
        matched_stop=finish.get("matched"),
        abort_message=finish.get("message") if finish["type"] == "abort" else None,
        text=body.get("text"),
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=int(meta.get("completion_tokens", len(output_ids))),
        cached_tokens=int(meta.get("cached_tokens", 0)),
        weight_version=str(meta.get("weight_version", "")),
        input_logprobs=input_logprobs,
        meta_info=meta,
    )


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """`/get_model_info`: what the server has loaded (`raw` keeps every field)."""

    model_path: str
    weight_version: str
    is_generation: bool
    has_image_understanding: bool
    raw: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class WeightUpdate:
    """`/update_weights_from_disk` success answer."""

    message: str
    num_paused_requests: int


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


def _json_object(response: httpx.Response) -> dict[str, Any]:
    body = http.json_body(response)
    if not isinstance(body, dict):
        raise http.ResponseFormatError(str(response.request.url), f"expected a JSON object, got {type(body).__name__}")
    return body


def _parse_model_info(response: httpx.Response) -> ModelInfo:
    body = _json_object(response)
    if "model_path" not in body:
        raise http.ResponseFormatError(str(response.request.url), "no 'model_path' in /get_model_info response")
    return ModelInfo(model_path=str(body["model_path"]), weight_version=str(body.get("weight_version", "")),
                     is_generation=bool(body.get("is_generation", True)),
                     has_image_understanding=bool(body.get("has_image_understanding", False)), raw=body)


def _parse_weight_update(response: httpx.Response) -> WeightUpdate:
    body = _json_object(response)
    if body.get("success") is not True:
        raise WeightUpdateFailed(response.status_code, str(response.request.url), response.text)
    return WeightUpdate(message=str(body.get("message", "")), num_paused_requests=int(body.get("num_paused_requests", 0)))


def _parse_weight_version(response: httpx.Response) -> str:
    body = _json_object(response)
    if body.get("success") is not True:
        raise WeightUpdateFailed(response.status_code, str(response.request.url), response.text)
    return str(body.get("new_version", ""))


def _as(cls: type[SGLangError]) -> Callable[[http.StatusError], Exception]:
    return lambda err: err if isinstance(err, http.RateLimited) else cls(err.status, err.url, err.body)


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

        return _Call("POST", "generate", parse, body=body, error=_generate_error)

    def _run(self, call: _Call) -> Any:
        try:
            response = self.session.request(call.method, call.path, json=call.body, timeout=call.timeout,
                                            max_retries=call.max_retries)
        except http.StatusError as err:
            raise call.error(err) from err
        return call.parse(response)

    async def _arun(self, call: _Call) -> Any:
        try:
            response = await self.session.arequest(call.method, call.path, json=call.body, timeout=call.timeout,
                                                   max_retries=call.max_retries)
        except http.StatusError as err:
            raise call.error(err) from err
        return call.parse(response)

    # -- /generate -------------------------------------------------------------------------------------

    def generate(self, input_ids: Sequence[int] | np.ndarray | None = None, *, text: str | None = None,
                 image_data: Sequence[media.ImageLike | str] | None = None,
                 sampling_params: Mapping[str, Any] | None = None, return_logprob: bool = True,
                 rid: str | None = None, logprob_start_len: int = -1,
                 return_text_in_logprobs: bool = False) -> GenerateResult:
        """Generates one continuation.

        Args:
            input_ids: [T] prompt token ids, already processor-expanded (image pad runs included).
            text: a prompt string instead (SGLang then expands image placeholders itself).
            image_data: every image the prompt refers to, in order: PIL images or encoded bytes (sent as
                lossless PNG data URLs), or strings sent as given (URL, data URL, base64).
            sampling_params: SGLang sampling params, checked by `validate_sampling_params`.
            return_logprob: return the log-prob of every output token.
            rid: request id (for `abort_request`); a fresh uuid4 hex when None.
            logprob_start_len: −1 = output tokens only; k ≥ 0 also returns prompt log-probs from position k.
            return_text_in_logprobs: fill the text slot of each logprob triple.

        Raises:
            ValueError: bad arguments (checked before sending).
            ContractViolation / InvalidInput / MalformedRequest / RequestAborted: see the module docstring.
            RateLimited / StatusError / TransportFailed / ResponseFormatError: other failures.
        """
        return self._run(self._generate_call(input_ids, text, image_data, sampling_params, return_logprob, rid,
                                             logprob_start_len, return_text_in_logprobs))

    async def agenerate(self, input_ids: Sequence[int] | np.ndarray | None = None, *, text: str | None = None,
                        image_data: Sequence[media.ImageLike | str] | None = None,
                        sampling_params: Mapping[str, Any] | None = None, return_logprob: bool = True,
                        rid: str | None = None, logprob_start_len: int = -1,
                        return_text_in_logprobs: bool = False) -> GenerateResult:
        """Async twin of `generate`."""
        return await self._arun(self._generate_call(input_ids, text, image_data, sampling_params, return_logprob,
                                                    rid, logprob_start_len, return_text_in_logprobs))

    # -- control endpoints -----------------------------------------------------------------------------

    @staticmethod
    def _health_call() -> _Call:
        return _Call("GET", "health", lambda response: True, max_retries=0, timeout=httpx.Timeout(30.0, connect=2.0))

    def health(self) -> bool:
        """True when `GET /health` answers 200 (False on 503 or no answer; no retries)."""
        try:
            return self._run(self._health_call())
        except (http.StatusError, http.TransportFailed):
            return False

    async def ahealth(self) -> bool:
        try:
            return await self._arun(self._health_call())
        except (http.StatusError, http.TransportFailed):
            return False

    def wait_until_healthy(self, timeout_s: float = 300.0, *, poll_s: float = 1.0) -> None:
        """Polls `/health` until it answers 200.

        Raises:
            TimeoutError: still unhealthy after `timeout_s` (the message names the URL).
        """
        deadline = time.monotonic() + timeout_s
        while not self.health():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.session.url('health')} not healthy after {timeout_s:.0f}s")
            time.sleep(poll_s)

    async def await_healthy(self, timeout_s: float = 300.0, *, poll_s: float = 1.0) -> None:
        """Async twin of `wait_until_healthy`."""
        deadline = time.monotonic() + timeout_s
        while not await self.ahealth():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.session.url('health')} not healthy after {timeout_s:.0f}s")
            await asyncio.sleep(poll_s)

    @staticmethod
    def _model_info_call() -> _Call:
        return _Call("GET", "get_model_info", _parse_model_info)

    def get_model_info(self) -> ModelInfo:
        return self._run(self._model_info_call())

    async def aget_model_info(self) -> ModelInfo:
        return await self._arun(self._model_info_call())

    @staticmethod
    def _flush_call() -> _Call:
        return _Call("POST", "flush_cache", lambda response: response.text, error=_as(CacheFlushFailed))

    def flush_cache(self) -> str:
        """Flushes the radix cache; returns the server's plain-text message. Raises CacheFlushFailed on 400."""
        return self._run(self._flush_call())

    async def aflush_cache(self) -> str:
        return await self._arun(self._flush_call())

    @staticmethod
    def _update_weights_call(model_path: str, weight_version: str | None, load_format: str | None,
                             abort_all_requests: bool, flush_cache: bool) -> _Call:
        if not model_path:
            raise ValueError("update_weights_from_disk needs a model_path")
        body = {"model_path": str(model_path), "load_format": load_format, "abort_all_requests": abort_all_requests,
                "weight_version": weight_version, "flush_cache": flush_cache}
        return _Call("POST", "update_weights_from_disk", _parse_weight_update, body=body,
                     timeout=WEIGHT_UPDATE_TIMEOUT, error=_as(WeightUpdateFailed))

    def update_weights_from_disk(self, model_path: str, *, weight_version: str | None = None,
                                 load_format: str | None = None, abort_all_requests: bool = False,
                                 flush_cache: bool = True) -> WeightUpdate:
        """Loads new weights from `model_path` (HF layout on storage the server can read).

        Raises:
            WeightUpdateFailed: the server answered `success: false` (its message is kept).
        """
        return self._run(self._update_weights_call(model_path, weight_version, load_format, abort_all_requests,
                                                   flush_cache))

    async def aupdate_weights_from_disk(self, model_path: str, *, weight_version: str | None = None,
                                        load_format: str | None = None, abort_all_requests: bool = False,
                                        flush_cache: bool = True) -> WeightUpdate:
        return await self._arun(self._update_weights_call(model_path, weight_version, load_format,
                                                          abort_all_requests, flush_cache))

    @staticmethod
    def _weight_version_call(new_version: str, abort_all_requests: bool) -> _Call:
        body = {"new_version": str(new_version), "abort_all_requests": abort_all_requests}
        return _Call("POST", "update_weight_version", _parse_weight_version, body=body, error=_as(WeightUpdateFailed))

    def update_weight_version(self, new_version: str, *, abort_all_requests: bool = True) -> str:
        """Relabels the loaded weights; returns the new version."""
        return self._run(self._weight_version_call(new_version, abort_all_requests))

    async def aupdate_weight_version(self, new_version: str, *, abort_all_requests: bool = True) -> str:
        return await self._arun(self._weight_version_call(new_version, abort_all_requests))

    @staticmethod
    def _pause_call(mode: str) -> _Call:
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
        return _Call("POST", "pause_generation", _json_object, body={"mode": mode})

    def pause_generation(self, mode: str = "abort") -> None:
        """Pauses generation: `abort` returns in-flight requests, `retract` requeues them, `in_place` freezes."""
        self._run(self._pause_call(mode))

    async def apause_generation(self, mode: str = "abort") -> None:
        await self._arun(self._pause_call(mode))

    @staticmethod
    def _continue_call() -> _Call:
        return _Call("POST", "continue_generation", _json_object, body={})

    def continue_generation(self) -> None:
        self._run(self._continue_call())

    async def acontinue_generation(self) -> None:
        await self._arun(self._continue_call())

    @staticmethod
    def _abort_call(rid: str | None, abort_all: bool) -> _Call:
        if rid is None and not abort_all:
            raise ValueError("abort_request needs a rid, or abort_all=True")
        return _Call("POST", "abort_request", lambda response: None, body={"rid": rid or "", "abort_all": abort_all})

    def abort_request(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """Aborts request `rid` (or all); the aborted `/generate` call returns with finish_reason `abort`."""
        self._run(self._abort_call(rid, abort_all))

    async def aabort_request(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        await self._arun(self._abort_call(rid, abort_all))

    def close(self) -> None:
        self.session.close()

    async def aclose(self) -> None:
        await self.session.aclose()

    def __enter__(self) -> "SGLangClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> "SGLangClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
