"""OpenAI-compatible chat client (`POST {base_url}/chat/completions`): judges, page summariser, harness.

Wire format: the OpenAI chat completions API as SGLang and vLLM serve it (`messages`, `response_format`, `tools`;
the answer's `choices[0].message`). `base_url` follows the OpenAI convention and includes the version prefix, e.g.
`http://127.0.0.1:30000/v1`.

Structured output degrades gracefully: a `json_schema` request that the server refuses with HTTP 400/422 is
retried with `{"type": "json_object"}`, then with no `response_format` at all (the caller parses the reply
leniently with `ChatResult.json()`); the client remembers the level that worked. With `cache_dir`, responses
are stored under the caller's original request, so a replay returns exactly the same results without a
server, whichever fallback the live run needed (image data URLs are keyed by their SHA-256).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import json5

from ranger_jax.clients import cache, http, media

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = httpx.Timeout(300.0, connect=5.0)  # a judge reading two 4k images can take minutes
DEFAULT_MAX_RETRIES = http.DEFAULT_MAX_RETRIES
DEFAULT_MAX_TOKENS = 4096
DEFAULT_MAX_CONCURRENCY = 16
DEFAULT_IMAGE_MAX_SIDE = 4096  # KnowGen's judge cap
FALLBACK_STATUS = frozenset({400, 422})  # servers that reject json_schema answer with one of these
_SCHEMA_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(r"```(?:json5?|JSON)?\s*(.*?)```", re.DOTALL)
_RESERVED = ("model", "messages", "temperature", "max_tokens", "max_completion_tokens", "response_format", "tools")


class ChatFormatError(ValueError):
    """A reply that should hold JSON does not."""


def text_part(text: str) -> dict[str, Any]:
    """A `{"type": "text"}` content part."""
    return {"type": "text", "text": text}


def image_part(image: media.ImageLike, *, max_side: int | None = DEFAULT_IMAGE_MAX_SIDE, fmt: str = "JPEG",
               quality: int = 100, detail: str | None = None) -> dict[str, Any]:
    """An `image_url` content part carrying `image` as a data URL.

    The image is converted to RGB (alpha flattened on white), its longest side capped at `max_side`, and
    encoded as `fmt` (JPEG at `quality`, the KnowGen judge default; PNG is lossless).

    Args:
        image: PIL image, encoded bytes, or a file path.
        detail: OpenAI's `low` | `high` | `auto` hint (vLLM and SGLang ignore it); omitted when None.
    """
    part: dict[str, Any] = {"type": "image_url",
                            "image_url": {"url": media.data_url(image, fmt=fmt, max_side=max_side, quality=quality)}}
    if detail is not None:
        if detail not in ("low", "high", "auto"):
            raise ValueError(f"detail must be 'low', 'high' or 'auto', got {detail!r}")
        part["image_url"]["detail"] = detail
    return part


def json_schema_format(name: str, schema: Mapping[str, Any], *, strict: bool = True) -> dict[str, Any]:
    """A `response_format` asking for JSON that matches `schema`.

    Raises:
        ValueError: `name` is not 1–64 characters of `[a-zA-Z0-9_-]`.
    """
    if not _SCHEMA_NAME.match(name):
        raise ValueError(f"json_schema name must be 1-64 chars of [a-zA-Z0-9_-], got {name!r}")
    return {"type": "json_schema", "json_schema": {"name": name, "schema": dict(schema), "strict": strict}}


def _first_json_value(text: str) -> str | None:
    """The first balanced `{…}` or `[…]` span of `text` (string-literal aware), or None."""
    for start, char in enumerate(text):
        if char not in "{[":
            continue
        depth, in_string, escaped = 0, False, False
        for end in range(start, len(text)):
            c = text[end]
            if in_string:
                if escaped:
                    escaped = False
                elif c == "\\":
                    escaped = True
                elif c == '"':
                    in_string = False
            elif c == '"':
                in_string = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return text[start:end + 1]
        return None
    return None


def extract_json(text: str) -> Any:
    """Parses the JSON a model meant to return, tolerating `<think>` blocks, code fences, prose around it,
    and JSON5 slips (single quotes, trailing commas).

    Raises:
        ChatFormatError: no JSON value can be found (the message quotes the start of the text).
    """
    stripped = _THINK.sub("", text).strip()
    candidates = [stripped]
    candidates += [m.strip() for m in _FENCE.findall(stripped)]
    span = _first_json_value(stripped)
    if span is not None:
        candidates.append(span)
    for candidate in candidates:
        for loads in (json.loads, json5.loads):
            try:
                return loads(candidate)
            except ValueError:
                continue
    raise ChatFormatError(f"no JSON value in model reply: {text[:200]!r}")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One function call the model asked for; `arguments` is the raw JSON text it produced."""

    id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as a dict (JSON5-tolerant). Raises ChatFormatError if they are not an object."""
        value = extract_json(self.arguments) if self.arguments.strip() else {}
        if not isinstance(value, dict):
            raise ChatFormatError(f"tool call {self.name!r} arguments are not a JSON object: {self.arguments[:200]!r}")
        return value


@dataclasses.dataclass(frozen=True)
class ChatResult:
    """The first choice of a chat completion.

    Attributes:
        content: the assistant text (`""` when the model only called tools).
        finish_reason: `stop`, `length`, `tool_calls`, … as the server reported it.
        tool_calls: function calls, in order.
        usage: token counts (`prompt_tokens`, `completion_tokens`, `total_tokens`, …).
        reasoning_content: thinking split off by a reasoning parser, if any.
        model: the model name the server reported.
        response_format: the `type` of the response_format actually sent (`json_schema`, `json_object`,
            `text`) or None when the request went without one.
    """

    content: str
    finish_reason: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Mapping[str, int] = dataclasses.field(default_factory=dict)
    reasoning_content: str | None = None
    model: str = ""
    response_format: str | None = None

    def json(self) -> Any:
        """The content parsed leniently as JSON (see `extract_json`)."""
        return extract_json(self.content)


def _parse_tool_call(url: str, index: int, raw: Any) -> ToolCall:
    if not isinstance(raw, dict) or not isinstance(raw.get("function"), dict):
        raise http.ResponseFormatError(url, f"choices[0].message.tool_calls[{index}] has no 'function' object")
    function = raw["function"]
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    if not isinstance(function.get("name"), str):
        raise http.ResponseFormatError(url, f"choices[0].message.tool_calls[{index}].function has no 'name'")
    return ToolCall(id=str(raw.get("id", "")), name=function["name"], arguments=arguments)


def parse_completion(url: str, body: Any, response_format: str | None) -> ChatResult:
    """A `ChatResult` from a `/chat/completions` JSON body.

    Raises:
        ResponseFormatError: the body lacks `choices[0].message` (an in-body error message is quoted).
    """
    if not isinstance(body, dict):
        raise http.ResponseFormatError(url, f"body is {type(body).__name__}, not an object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        problem = "no choices in body"
        if "error" in body or "message" in body:
            problem += f"; server said: {http.error_message(json.dumps(body))}"
        raise http.ResponseFormatError(url, problem)
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise http.ResponseFormatError(url, "choices[0] has no 'message' object")
    content = message.get("content") or ""
    if isinstance(content, list):  # some servers echo content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise http.ResponseFormatError(url, f"choices[0].message.content is {type(content).__name__}, not a string")
    calls = tuple(_parse_tool_call(url, i, raw) for i, raw in enumerate(message.get("tool_calls") or []))
    usage = {k: v for k, v in (body.get("usage") or {}).items() if isinstance(v, int) and not isinstance(v, bool)}
    return ChatResult(content=content, finish_reason=choices[0].get("finish_reason"), tool_calls=calls,
                      usage=usage, reasoning_content=message.get("reasoning_content"),
                      model=str(body.get("model", "")), response_format=response_format)


def _compact(value: Any) -> Any:
    """`value` with every `data:` URL replaced by its SHA-256, so cache entries stay small but exact."""
    if isinstance(value, str) and value.startswith("data:"):
        return "sha256:" + hashlib.sha256(value.encode("utf-8")).hexdigest()
    if isinstance(value, dict):
        return {k: _compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    return value


def _format_ladder(response_format: Mapping[str, Any] | None) -> list[Mapping[str, Any] | None]:
    """The response_formats to try, strictest first."""
    if response_format is None:
        return [None]
    kind = response_format.get("type")
    if kind == "json_schema":
        return [response_format, {"type": "json_object"}, None]
    if kind == "json_object":
        return [response_format, None]
    return [response_format]


class ChatClient:
    """Client for one OpenAI-compatible chat endpoint and model.

    Args:
        base_url: the API root including `/v1`, e.g. `http://127.0.0.1:30000/v1`.
        model: model name sent with every request.
        api_key: sent as `Authorization: Bearer <key>` when given.
        timeout: per-request timeout (seconds or `httpx.Timeout`).
        max_retries: retries after the first try on transport errors, 408, 429 and 5xx.
        cache_dir: folder for the replay cache (None: no cache).
        max_concurrency: requests in flight at once (sync and async calls alike).
        chat_template_kwargs: sent with every request (e.g. `{"enable_thinking": False}` for Qwen3 judges).
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        cache_dir: str | os.PathLike | None = None,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.session = http.Session(base_url, timeout=timeout, max_retries=max_retries,
                                    max_concurrency=max_concurrency, headers=headers)
        self.model = model
        self.chat_template_kwargs = dict(chat_template_kwargs) if chat_template_kwargs else None
        self.cache = cache.JsonCache(cache_dir, namespace="openai-chat")
        self._level: dict[str, int] = {}  # response_format type -> first ladder rung known to work

    @property
    def url(self) -> str:
        """The full URL requests go to (`{base_url}/chat/completions`)."""
        return self.session.url("chat/completions")

    def _request(self, messages: Sequence[Mapping[str, Any]], temperature: float, max_tokens: int,
                 response_format: Mapping[str, Any] | None, tools: Sequence[Mapping[str, Any]] | None,
                 extra: Mapping[str, Any] | None) -> dict[str, Any]:
        if isinstance(messages, (str, bytes)) or not messages:
            raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping) or "role" not in message:
                raise ValueError(f"messages[{i}] must be a dict with a 'role', got {message!r:.100}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        # max_completion_tokens: the current name (OpenAI, SGLang and vLLM take `max_tokens` as a deprecated alias)
        body: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in messages],
                                "temperature": temperature, "max_completion_tokens": max_tokens}
        if response_format is not None:
            body["response_format"] = dict(response_format)
        if tools:
            body["tools"] = [dict(t) for t in tools]
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        for key, value in (extra or {}).items():
            if key in _RESERVED:
                raise ValueError(f"extra key {key!r} clashes with an argument of complete(); pass it as that argument")
            body[key] = value
        return body

    def _attempts(self, body: dict[str, Any]) -> tuple[str, int, list[dict[str, Any]]]:
        """(response_format type, first rung tried, request bodies to try in order)."""
        ladder = _format_ladder(body.get("response_format"))
        kind = str(ladder[0]["type"]) if ladder[0] is not None else ""
        start = self._level.get(kind, 0)
        bodies = []
        for rung in ladder[start:]:
            attempt = {k: v for k, v in body.items() if k != "response_format"}
            if rung is not None:
                attempt["response_format"] = rung
            bodies.append(attempt)
        return kind, start, bodies

    def _fell_back(self, bodies: list[dict[str, Any]], i: int, err: http.StatusError) -> bool:
        """Whether to try the next, looser response_format after `err` on attempt `i`."""
        if err.status not in FALLBACK_STATUS or i + 1 >= len(bodies):
            return False
        log.debug("%s refused response_format %s (HTTP %d: %s); falling back", self.url,
                  bodies[i].get("response_format", {}).get("type"), err.status, http.error_message(err.body)[:200])
        return True

    def _finish(self, key: dict[str, Any], attempt: dict[str, Any], response: httpx.Response, *, kind: str,
                rung: int) -> ChatResult:
        fmt = attempt.get("response_format", {}).get("type") if "response_format" in attempt else None
        body = http.json_body(response)
        result = parse_completion(self.url, body, fmt)
        if rung:  # remembered only once a looser format WORKED: a 400 on every rung says nothing about formats
            self._level[kind] = max(self._level.get(kind, 0), rung)
        self.cache.put(_compact(key), {"body": body, "response_format": fmt})
        return result

    def _cached(self, key: dict[str, Any]) -> ChatResult | None:
        hit = self.cache.get(_compact(key))
        if hit is None:
            return None
        return parse_completion(self.url, hit["body"], hit["response_format"])

    async def acomplete(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        temperature: float = 0.0,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        response_format: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> ChatResult:
        """Sends one chat completion and returns its first choice.

        Args:
            messages: OpenAI chat messages (content a string or a list of `text_part`/`image_part` parts).
            temperature: sampling temperature (0 for judges).
            max_tokens: completion token cap (sent as `max_completion_tokens`).
            response_format: e.g. `json_schema_format(...)` or `{"type": "json_object"}`; degrades on 400/422.
            tools: OpenAI function tool schemas.
            extra: more body keys (`seed`, `top_p`, `stop`, …); may not repeat an argument above.

        Raises:
            ValueError: malformed arguments.
            StatusError / RateLimited / TransportFailed: the server failed after retries.
            ResponseFormatError: a 2xx body without `choices[0].message`.
        """
        key = self._request(messages, temperature, max_tokens, response_format, tools, extra)
        cached = self._cached(key)
        if cached is not None:
            return cached
        kind, start, bodies = self._attempts(key)
        for i, attempt in enumerate(bodies):
            try:
                response = await self.session.arequest("POST", "chat/completions", json=attempt)
            except http.StatusError as err:
                if self._fell_back(bodies, i, err):
                    continue
                raise
            return self._finish(key, attempt, response, kind=kind, rung=start + i)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        temperature: float = 0.0,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        response_format: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> ChatResult:
        """Sync twin of `acomplete` (same arguments, fallbacks, cache and errors), run on the session's loop."""
        return self.session.run_sync(self.acomplete(messages, temperature=temperature, max_tokens=max_tokens,
                                                    response_format=response_format, tools=tools, extra=extra))

    def close(self) -> None:
        """Closes the connection of sync calls (async ones close with `aclose` from their loop)."""
        self.session.close()

    async def aclose(self) -> None:
        """Closes the current loop's connection and the one of sync calls."""
        await self.session.aclose()

    def __enter__(self) -> "ChatClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> "ChatClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
