"""The one retry loop and error tree shared by every HTTP client in ranger_jax.

Policy (STYLE.md §7): retry `httpx.TransportError` (timeouts included), 408, 429 and 5xx; honour
`Retry-After` up to a cap, otherwise back off `0.5·2ⁿ` seconds capped at 8 s with full jitter; re-raise
anything else at once. A non-idempotent request reuses one idempotency key across its retries.
"""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable

import httpx

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
DEFAULT_MAX_RETRIES = 4
INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
MAX_RETRY_AFTER_S = 60.0
RETRYABLE_STATUS = frozenset({408, 429})
IDEMPOTENCY_HEADER = "Idempotency-Key"


class ClientError(Exception):
    """Base of every error an HTTP client in ranger_jax raises."""


class StatusError(ClientError):
    """The server answered with a non-success status."""

    def __init__(self, status: int, url: str, body: str):
        self.status = status
        self.url = url
        self.body = body
        super().__init__(f"HTTP {status} from {url}: {body[:500]}")


class RateLimited(StatusError):
    """HTTP 429 after all retries."""


class TransportFailed(ClientError):
    """No HTTP answer at all (connect error, timeout, broken stream) after all retries."""

    def __init__(self, url: str, reason: str):
        self.url = url
        self.reason = reason
        super().__init__(f"request to {url} failed: {reason}")


class ResponseFormatError(ClientError):
    """The server answered 2xx but the body is not what the wire format promises."""

    def __init__(self, url: str, problem: str):
        self.url = url
        self.problem = problem
        super().__init__(f"unexpected response from {url}: {problem}")


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUS or 500 <= status <= 599


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a `Retry-After` header (delta-seconds or HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def retry_delay(attempt: int, retry_after: str | None = None, *, rng: random.Random | None = None) -> float:
    """Seconds to sleep before retry number `attempt` (0-based)."""
    waited = parse_retry_after(retry_after)
    if waited is not None:
        return min(waited, MAX_RETRY_AFTER_S)
    cap = min(INITIAL_BACKOFF_S * 2**attempt, MAX_BACKOFF_S)
    return (rng or random).uniform(0.5 * cap, cap)


def _error_for(response: httpx.Response) -> StatusError:
    url = str(response.request.url)
    try:
        body = response.text
    except (httpx.ResponseNotRead, UnicodeDecodeError):
        body = "<unreadable body>"
    cls = RateLimited if response.status_code == 429 else StatusError
    return cls(response.status_code, url, body)


def _with_idempotency_key(method: str, headers: dict[str, str] | None) -> dict[str, str]:
    headers = dict(headers or {})
    if method.upper() == "POST" and IDEMPOTENCY_HEADER not in headers:
        headers[IDEMPOTENCY_HEADER] = uuid.uuid4().hex
    return headers


def _next_delay(method: str, url: str, attempt: int, max_retries: int, *,
                response: httpx.Response | None = None, error: httpx.TransportError | None = None) -> float:
    """Seconds to wait before the next try after a failed `attempt`, or raises the final error."""
    if error is not None:
        if attempt >= max_retries:
            raise TransportFailed(url, f"{type(error).__name__}: {error}") from error
        delay, why = retry_delay(attempt), type(error).__name__
    else:
        assert response is not None
        if not is_retryable_status(response.status_code) or attempt >= max_retries:
            raise _error_for(response)
        delay, why = retry_delay(attempt, response.headers.get("Retry-After")), f"HTTP {response.status_code}"
    log.debug("retrying %s %s after %s (%.2fs)", method, url, why, delay)
    return delay


def request_with_retries(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    max_retries: int = DEFAULT_MAX_RETRIES,
    sleep: Callable[[float], None] = time.sleep,
    **kwargs,
) -> httpx.Response:
    """Sends one request through `client`, retrying per the module policy; returns a 2xx response.

    Raises:
        StatusError / RateLimited: a non-retryable status, or a retryable one after `max_retries` retries.
        TransportFailed: no answer after `max_retries` retries.
    """
    kwargs["headers"] = _with_idempotency_key(method, kwargs.get("headers"))
    for attempt in itertools.count():
        try:
            response = client.request(method, url, **kwargs)
        except httpx.TransportError as err:
            sleep(_next_delay(method, url, attempt, max_retries, error=err))
            continue
        if response.is_success:
            return response
        sleep(_next_delay(method, url, attempt, max_retries, response=response))
    raise AssertionError("unreachable")


async def arequest_with_retries(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    max_retries: int = DEFAULT_MAX_RETRIES,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    **kwargs,
) -> httpx.Response:
    """Async twin of `request_with_retries`, with the same policy and errors."""
    kwargs["headers"] = _with_idempotency_key(method, kwargs.get("headers"))
    for attempt in itertools.count():
        try:
            response = await client.request(method, url, **kwargs)
        except httpx.TransportError as err:
            await sleep(_next_delay(method, url, attempt, max_retries, error=err))
            continue
        if response.is_success:
            return response
        await sleep(_next_delay(method, url, attempt, max_retries, response=response))
    raise AssertionError("unreachable")


def json_body(response: httpx.Response) -> dict | list:
    """The response's JSON, or ResponseFormatError naming the URL."""
    try:
        return response.json()
    except ValueError as err:
        raise ResponseFormatError(str(response.request.url), f"body is not JSON: {response.text[:200]!r}") from err
