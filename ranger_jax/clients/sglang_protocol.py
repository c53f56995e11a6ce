"""SGLang LLM server wire contract (sglang 0.5.23's native API): sampling-param checks,
the error types every `/generate` error shape maps to, and typed parsing of `/generate` and control answers.

Error mapping of `/generate` (all `StatusError`s):
  - 400 `{"error": "<text>"}` (JSON contract, e.g. an unknown sampling param) → `ContractViolation`;
  - 400 `{"error": {"message"}}` (bad input, scheduler-side validation abort) → `InvalidInput`;
  - 400 `{"object": "error", …}` (body could not be parsed) → `MalformedRequest`;
  - another status with `{"object": "error", …}` (abort with a status code, e.g. 503 timeout; retried
    first) → `RequestAborted`;
  - an abort without status code (`/abort_request`, pause mode `abort`) is HTTP 200: no error, the result
    has `finish_reason == "abort"`, `abort_message` and the partial output.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import numpy as np

from ranger_jax.clients import http

FINISH_REASONS = ("stop", "length", "abort")

_INT, _NUM, _BOOL, _STR = (int,), (int, float), (bool,), (str,)
_JSON = (dict, list, str, int, float, bool)  # any JSON value
SAMPLING_PARAM_TYPES: dict[str, tuple[type, ...]] = {
    "max_new_tokens": _INT, "min_new_tokens": _INT, "stop": (str, list), "stop_regex": (str, list),
    "stop_token_ids": (list,), "temperature": _NUM, "top_p": _NUM, "top_k": _INT, "min_p": _NUM,
    "frequency_penalty": _NUM, "presence_penalty": _NUM, "repetition_penalty": _NUM, "n": _INT,
    "json_schema": _STR, "regex": _STR, "ebnf": _STR, "structural_tag": _STR, "ignore_eos": _BOOL,
    "no_stop_trim": _BOOL, "skip_special_tokens": _BOOL, "spaces_between_special_tokens": _BOOL,
    "logit_bias": (dict,), "sampling_seed": _INT, "custom_params": _JSON, "stream_interval": _INT,
    "beam_width": _INT, "watermark": (dict,), "choice": (list,),
}
# `sampling_seed` is honoured only by a server started with --enable-deterministic-inference (sglang
# `sampling/sampling_batch_info.py`); elsewhere it is accepted and ignored. `ServerInfo.deterministic_inference`
# tells which.
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


def generate_error(err: http.StatusError) -> http.StatusError:
    """The specific error type a `/generate` error body maps to (see the module docstring)."""
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
    choice = out.get("choice")
    if choice is not None and (not choice or not all(isinstance(c, str) for c in choice)):
        raise ValueError(f"sampling_params['choice'] must be a non-empty list of strings, got {choice!r:.80}")
    if out.get("custom_params") is not None:
        try:
            json.dumps(out["custom_params"], allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"sampling_params['custom_params'] must be JSON: {err}") from err
    if out.get("n") not in (None, 1):
        raise ValueError(f"sampling_params['n'] = {out['n']}: this client sends one sample per request; "
                         "send n requests with their own rids instead")
    ids = out.get("stop_token_ids") or []
    if any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise ValueError(f"sampling_params['stop_token_ids'] must be a list of ints, got {ids!r:.80}")
    return out


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
        """Whether the request was aborted (`finish_reason == "abort"`); the output is partial."""
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
    """`/model_info` (older servers: `/get_model_info`): what the server has loaded (`raw` keeps every field)."""

    model_path: str
    weight_version: str
    is_generation: bool
    has_image_understanding: bool
    raw: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """`/server_info` (older servers: `/get_server_info`): the server's launch arguments and state.

    Attributes:
        deterministic_inference: the server runs with `--enable-deterministic-inference`, so it honours each
            request's `sampling_seed`; None when the answer does not say (e.g. a router in front).
        version: the sglang version, when reported.
        raw: every field of the answer.
    """

    deterministic_inference: bool | None
    version: str | None
    raw: Mapping[str, Any]


def parse_server_info(response: httpx.Response) -> ServerInfo:
    """A `/server_info` answer as ServerInfo (a JSON object; its keys are the server arguments)."""
    body = json_object(response)
    flag = body.get("enable_deterministic_inference")
    version = body.get("version")
    return ServerInfo(deterministic_inference=flag if isinstance(flag, bool) else None,
                      version=str(version) if version is not None else None, raw=body)


@dataclasses.dataclass(frozen=True)
class WeightUpdate:
    """`/update_weights_from_disk` success answer."""

    message: str
    num_paused_requests: int


def json_object(response: httpx.Response) -> dict[str, Any]:
    """The response body as a JSON object; raises ResponseFormatError for anything else."""
    body = http.json_body(response)
    if not isinstance(body, dict):
        raise http.ResponseFormatError(str(response.request.url), f"expected a JSON object, got {type(body).__name__}")
    return body


def parse_model_info(response: httpx.Response) -> ModelInfo:
    """A `/model_info` answer as ModelInfo; raises ResponseFormatError without `model_path`."""
    body = json_object(response)
    if "model_path" not in body:
        raise http.ResponseFormatError(str(response.request.url), "no 'model_path' in the model info response")
    return ModelInfo(model_path=str(body["model_path"]), weight_version=str(body.get("weight_version", "")),
                     is_generation=bool(body.get("is_generation", True)),
                     has_image_understanding=bool(body.get("has_image_understanding", False)), raw=body)


def parse_weight_update(response: httpx.Response) -> WeightUpdate:
    """An `/update_weights_from_disk` answer; raises WeightUpdateFailed unless it succeeded."""
    body = json_object(response)
    if body.get("success") is not True:
        raise WeightUpdateFailed(response.status_code, str(response.request.url), response.text)
    return WeightUpdate(message=str(body.get("message", "")), num_paused_requests=int(body.get("num_paused_requests", 0)))


def parse_weight_version(response: httpx.Response) -> str:
    """The new version from an `/update_weight_version` answer; raises WeightUpdateFailed."""
    body = json_object(response)
    if body.get("success") is not True:
        raise WeightUpdateFailed(response.status_code, str(response.request.url), response.text)
    return str(body.get("new_version", ""))


def as_error(cls: type[SGLangError]) -> Callable[[http.StatusError], Exception]:
    """An error mapper that re-types a control endpoint's StatusError as `cls` (RateLimited stays as is)."""
    return lambda err: err if isinstance(err, http.RateLimited) else cls(err.status, err.url, err.body)
