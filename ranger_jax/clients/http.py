"""The one retry loop and error tree shared by every HTTP client in ranger_jax.

Policy: retry `httpx.TransportError` (timeouts included), 408, 429 and 5xx; honour
`Retry-After` up to a cap, otherwise back off `0.5·2ⁿ` seconds capped at 8 s with full jitter; re-raise
anything else at once. A non-idempotent request reuses one idempotency key across its retries.

Each service can state its own rules as a `RetryPolicy`: how many retries, which statuses, and whether its
requests are idempotent. A service that cannot cancel work it has accepted (an image generator that queues a job
on a GPU) is not idempotent: a request whose fate is unknown — sent, then a read timeout or a dropped connection —
is never sent again (a second copy would queue a second job); only failures before anything was sent (connect
errors, a full connection pool) and the statuses the policy names are retried. The final error records how many
tries were made (`attempts`) and, for a transport failure, whether the server may still be running the request
(`may_have_run`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import itertools
import json
import logging
import random
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

import httpx

from ranger_jax import background

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
DEFAULT_MAX_RETRIES = 4
INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
MAX_RETRY_AFTER_S = 60.0
RETRYABLE_STATUS = frozenset({408, 429})
IDEMPOTENCY_HEADER = "Idempotency-Key"
DEFAULT_MAX_CONNECTIONS = 100


class ClientError(Exception):
    """Base of every error an HTTP client in ranger_jax raises."""


class StatusError(ClientError):
    """The server answered with a non-success status (`attempts`: tries made, retries included)."""

    def __init__(self, status: int, url: str, body: str):
        self.status = status
        self.url = url
        self.body = body
        self.attempts = 1
        super().__init__(f"HTTP {status} from {url}: {body[:500]}")


class RateLimited(StatusError):
    """HTTP 429 after all retries."""


class TransportFailed(ClientError):
    """No HTTP answer at all (connect error, timeout, broken stream) after all retries.

    Attributes:
        url / reason: where it went and what failed.
        may_have_run: the request may have reached the server, which may still be working on it (a read or write
            timeout, a dropped connection); False when nothing was sent (connect failure, full pool).
        attempts: tries made, retries included.
    """

    def __init__(self, url: str, reason: str, *, may_have_run: bool = False, attempts: int = 1):
        self.url = url
        self.reason = reason
        self.may_have_run = may_have_run
        self.attempts = attempts
        super().__init__(f"request to {url} failed: {reason}")


class ResponseFormatError(ClientError):
    """The server answered 2xx but the body is not what the wire format promises."""

    def __init__(self, url: str, problem: str):
        self.url = url
        self.problem = problem
        super().__init__(f"unexpected response from {url}: {problem}")


def is_retryable_status(status: int) -> bool:
    """Whether an HTTP status is retried by default: 408, 429 and 5xx."""
    return status in RETRYABLE_STATUS or 500 <= status <= 599


# failures raised before the request left: retrying them can never run a request twice
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


def was_sent(error: httpx.TransportError) -> bool:
    """Whether a transport failure may have happened after the request reached the server."""
    return not isinstance(error, _NOT_SENT)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How one service's requests are retried (see the module docstring).

    Attributes:
        max_retries: retries after the first try.
        retry_status: the HTTP statuses retried; None means 408, 429 and 5xx.
        idempotent: sending a request twice is harmless. When False, a transport failure after the request may
            have reached the server (`was_sent`) is raised at once, never retried.
    """

    max_retries: int = DEFAULT_MAX_RETRIES
    retry_status: frozenset[int] | None = None
    idempotent: bool = True

    def __post_init__(self):
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"RetryPolicy.max_retries must be an int >= 0, got {self.max_retries!r}")
        if self.retry_status is not None:
            object.__setattr__(self, "retry_status", frozenset(int(s) for s in self.retry_status))

    def retries_status(self, status: int) -> bool:
        """Whether a response with this status is tried again."""
        return is_retryable_status(status) if self.retry_status is None else status in self.retry_status

    def retries_error(self, error: httpx.TransportError) -> bool:
        """Whether a request that failed with this transport error is tried again."""
        return self.idempotent or not was_sent(error)


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


def _next_delay(method: str, url: str, attempt: int, policy: RetryPolicy, *,
                response: httpx.Response | None = None, error: httpx.TransportError | None = None) -> float:
    """Seconds to wait before the next try after a failed `attempt`, or raises the final error."""
    if error is not None:
        if attempt >= policy.max_retries or not policy.retries_error(error):
            reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            raise TransportFailed(url, reason, may_have_run=was_sent(error), attempts=attempt + 1) from error
        delay, why = retry_delay(attempt), type(error).__name__
    else:
        assert response is not None
        if not policy.retries_status(response.status_code) or attempt >= policy.max_retries:
            failure = _error_for(response)
            failure.attempts = attempt + 1
            raise failure
        delay, why = retry_delay(attempt, response.headers.get("Retry-After")), f"HTTP {response.status_code}"
    log.debug("retrying %s %s after %s (%.2fs)", method, url, why, delay)
    return delay


async def arequest_with_retries(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    max_retries: int = DEFAULT_MAX_RETRIES,
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    **kwargs,
) -> httpx.Response:
    """Sends one request through `client`, retrying per the module policy; returns a 2xx response.

    Args:
        max_retries: retries under the default policy (ignored when `retry` is given).
        retry: the service's own policy (statuses, idempotency, retries).

    Raises:
        StatusError / RateLimited: a status that is not retried, or a retried one after the last retry.
        TransportFailed: no answer after the last retry, or at once for a non-idempotent request that may have
            reached the server.
    """
    policy = retry if retry is not None else RetryPolicy(max_retries=max_retries)
    kwargs["headers"] = _with_idempotency_key(method, kwargs.get("headers"))
    for attempt in itertools.count():
        try:
            response = await client.request(method, url, **kwargs)
        except httpx.TransportError as err:
            await sleep(_next_delay(method, url, attempt, policy, error=err))
            continue
        if response.is_success:
            return response
        await sleep(_next_delay(method, url, attempt, policy, response=response))
    raise AssertionError("unreachable")


def json_body(response: httpx.Response) -> dict | list:
    """The response's JSON, or ResponseFormatError naming the URL."""
    try:
        return response.json()
    except ValueError as err:
        raise ResponseFormatError(str(response.request.url), f"body is not JSON: {response.text[:200]!r}") from err


def error_message(body: str) -> str:
    """The human message inside an error body, whichever common JSON shape it uses; else the text itself.

    Understands `{"error": "<text>"}`, `{"error": {"message": …}}`, `{"message": …}` (OpenAI/SGLang
    `{"object": "error", …}` included) and FastAPI's `{"detail": "<text>" | [{"msg": …}, …]}`.
    """
    try:
        obj = json.loads(body)
    except ValueError:
        return body.strip()
    if not isinstance(obj, dict):
        return body.strip()
    error = obj.get("error")
    if isinstance(error, str):
        return error
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    if isinstance(obj.get("message"), str):
        return obj["message"]
    detail = obj.get("detail")
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        return "; ".join(str(d.get("msg", d)) if isinstance(d, dict) else str(d) for d in detail)
    return body.strip()


def as_timeout(timeout: float | httpx.Timeout) -> httpx.Timeout:
    """`timeout` as an `httpx.Timeout`; a number is the read/write/pool limit with a ≤ 5 s connect limit."""
    if isinstance(timeout, httpx.Timeout):
        return timeout
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    return httpx.Timeout(float(timeout), connect=min(5.0, float(timeout)))


class Session:
    """One service's HTTP connection: an `httpx.AsyncClient` and a concurrency limit per event loop, and the
    module's retry policy.

    An `httpx.AsyncClient` belongs to the event loop that first used it, so each running loop gets its own
    (created on first use, dropped with the loop). Sync calls (`request`, `run_sync`) run on the session's own
    background loop (`ranger_jax.background`): callers on any number of threads share its client and its limit.

    Args:
        base_url: scheme, host, port and optional path prefix; request paths are relative to it.
        timeout: per-request timeout (seconds or `httpx.Timeout`).
        max_retries: retries after the first try (module policy).
        max_concurrency: requests in flight at once through this session (None: no limit but the pool).
        headers: sent with every request (e.g. `Authorization`).
        retry: the service's own retry policy (statuses, idempotency); replaces `max_retries` when given.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_concurrency: int | None = None,
        headers: Mapping[str, str] | None = None,
        retry: RetryPolicy | None = None,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")
        self.base_url = base_url.rstrip("/")
        self.timeout = as_timeout(timeout)
        self.retry = retry if retry is not None else RetryPolicy(max_retries=max_retries)
        self.max_retries = self.retry.max_retries
        self.max_concurrency = max_concurrency
        self.headers = dict(headers or {})
        self._limits = httpx.Limits(max_connections=max(max_concurrency or 0, DEFAULT_MAX_CONNECTIONS))
        self._background = background.BackgroundLoop("http.Session")
        # event loop -> (its AsyncClient, its concurrency semaphore); entries go away with their loop
        self._async: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def url(self, path: str) -> str:
        """Absolute URL of `path` on this service (for messages and cache keys)."""
        return f"{self.base_url}/{path.lstrip('/')}"

    def _async_client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore | None]:
        loop = asyncio.get_running_loop()
        pair = self._async.get(loop)
        if pair is None:
            client = httpx.AsyncClient(timeout=self.timeout, headers=self.headers, limits=self._limits)
            pair = (client, asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None)
            self._async[loop] = pair
        return pair

    @staticmethod
    def _options(json_body: Any, data: Any, files: Any, params: Any, headers: Mapping[str, str] | None,
                 timeout: float | httpx.Timeout | None) -> dict[str, Any]:
        options: dict[str, Any] = {"headers": dict(headers or {})}
        for key, value in (("json", json_body), ("data", data), ("files", files), ("params", params)):
            if value is not None:
                options[key] = value
        if timeout is not None:
            options["timeout"] = as_timeout(timeout)
        return options

    async def arequest(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: Mapping[str, Any] | None = None,
        files: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int | None = None,
    ) -> httpx.Response:
        """Sends `method path` with retries under the concurrency limit; returns the 2xx response.

        `max_retries` overrides the session's retry count for this call (0 for probes such as health checks).

        Raises:
            StatusError / RateLimited / TransportFailed: as `arequest_with_retries`.
        """
        options = self._options(json, data, files, params, headers, timeout)
        policy = self.retry if max_retries is None else dataclasses.replace(self.retry, max_retries=max_retries)
        client, slots = self._async_client()
        if slots is None:
            return await arequest_with_retries(client, method, self.url(path), retry=policy, **options)
        async with slots:
            return await arequest_with_retries(client, method, self.url(path), retry=policy, **options)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: Mapping[str, Any] | None = None,
        files: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | httpx.Timeout | None = None,
        max_retries: int | None = None,
    ) -> httpx.Response:
        """Sync twin of `arequest`, run on the session's background loop."""
        return self.run_sync(self.arequest(method, path, json=json, data=data, files=files, params=params,
                                           headers=headers, timeout=timeout, max_retries=max_retries))

    def run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs `coro` (code that calls this session's async methods) on the session's background loop and
        returns its result: how the clients built on a session give their async methods sync twins."""
        return self._background.run(coro)

    async def _aclose_loop_client(self) -> None:
        pair = self._async.pop(asyncio.get_running_loop(), None)
        if pair is not None:
            await pair[0].aclose()

    def close(self) -> None:
        """Closes the sync calls' client and stops their background loop (async clients of other loops close
        with `aclose` from their loop)."""
        self._background.close(self._aclose_loop_client)

    async def aclose(self) -> None:
        """Closes the current loop's async client and the sync calls' one."""
        await self._aclose_loop_client()
        self.close()
