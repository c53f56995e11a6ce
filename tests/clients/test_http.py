"""The shared retry loop, error tree and Session, against a real loopback server."""
import asyncio
import email.utils
import socket
import threading
import time

import httpx
import pytest

from ranger_jax.clients import http
from support.loopback import LoopbackServer, Reply

NO_WAIT = {"Retry-After": "0"}


@pytest.fixture(scope="module")
def server():
    with LoopbackServer() as s:
        s.route("POST", "/ok", lambda req: Reply.json({"echo": req.json()}))
        s.route("GET", "/ok", lambda req: Reply.json({"hello": "world"}))
        s.route("GET", "/text", lambda req: Reply.text("not json"))
        s.route("GET", "/slow", lambda req: Reply.json({}, delay_s=1.0))
        yield s


def retried(method, url, *, client_timeout=None, **kwargs) -> httpx.Response:
    """`arequest_with_retries` through a fresh AsyncClient, from sync test code."""
    async def run():
        async with httpx.AsyncClient(timeout=client_timeout or httpx.Timeout(5.0)) as client:
            return await http.arequest_with_retries(client, method, url, **kwargs)

    return asyncio.run(run())


async def no_sleep(seconds: float) -> None:
    pass


def count_delta(server, method, path):
    before = server.count(method, path)
    return lambda: server.count(method, path) - before


def test_retries_429_with_retry_after_then_succeeds(server):
    server.fail_next("POST", "/ok", Reply(status=429, headers=NO_WAIT), Reply(status=503, headers=NO_WAIT))
    calls = count_delta(server, "POST", "/ok")
    response = retried("POST", f"{server.url}/ok", json={"a": 1})
    assert response.json() == {"echo": {"a": 1}}
    assert calls() == 3


def test_idempotency_key_is_reused_across_retries(server):
    server.fail_next("POST", "/ok", Reply(status=500, headers=NO_WAIT))
    start = len(server.requests)
    retried("POST", f"{server.url}/ok", json={})
    keys = {r.headers.get("Idempotency-Key") for r in server.requests[start:]}
    assert len(keys) == 1 and None not in keys


def test_rate_limited_after_retries_names_url_and_status(server):
    server.fail_next("POST", "/ok", *[Reply(status=429, headers=NO_WAIT, body=b"slow down")] * 3)
    with pytest.raises(http.RateLimited, match=r"HTTP 429 from http://127\.0\.0\.1:\d+/ok: slow down") as info:
        retried("POST", f"{server.url}/ok", max_retries=2, json={})
    assert info.value.status == 429 and info.value.body == "slow down"


def test_non_retryable_status_raises_at_once(server):
    server.fail_next("POST", "/ok", Reply.json({"error": "bad"}, status=400))
    calls = count_delta(server, "POST", "/ok")
    with pytest.raises(http.StatusError, match="HTTP 400") as info:
        retried("POST", f"{server.url}/ok", json={})
    assert calls() == 1 and not isinstance(info.value, http.RateLimited)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_transport_failure_names_url():
    url = f"http://127.0.0.1:{closed_port()}/x"
    with pytest.raises(http.TransportFailed, match=r"request to http://127\.0\.0\.1:\d+/x failed: ConnectError"):
        retried("GET", url, max_retries=1, sleep=no_sleep)


def test_timeout_is_a_transport_failure(server):
    with pytest.raises(http.TransportFailed, match="ReadTimeout"):
        retried("GET", f"{server.url}/slow", client_timeout=httpx.Timeout(0.2, connect=1.0), max_retries=0)
    session = http.Session(server.url, timeout=0.2, max_retries=0)
    with pytest.raises(http.TransportFailed, match="ReadTimeout"):  # the sync twin keeps the per-call timeout
        session.request("GET", "slow")
    session.close()


def test_parse_retry_after_and_delay_caps():
    assert http.parse_retry_after("3") == 3.0
    assert http.parse_retry_after(None) is None and http.parse_retry_after("soon") is None
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= http.parse_retry_after(future) <= 31
    assert http.retry_delay(0, "1000") == http.MAX_RETRY_AFTER_S
    assert all(http.MAX_BACKOFF_S / 2 <= http.retry_delay(10) <= http.MAX_BACKOFF_S for _ in range(20))
    assert 0.25 <= http.retry_delay(0) <= 0.5


def test_json_body_error_names_url(server):
    response = retried("GET", f"{server.url}/text")
    with pytest.raises(http.ResponseFormatError, match=r"unexpected response from http://127\.0\.0\.1:\d+/text: body is not JSON"):
        http.json_body(response)


@pytest.mark.parametrize("body, message", [
    ('{"error": "unknown field `x`"}', "unknown field `x`"),
    ('{"error": {"message": "bad input"}}', "bad input"),
    ('{"object": "error", "message": "parse", "code": 400}', "parse"),
    ('{"detail": "Field \'image\' or \'url\' is required"}', "Field 'image' or 'url' is required"),
    ('{"detail": [{"loc": ["body"], "msg": "field required"}]}', "field required"),
    ("Internal Server Error", "Internal Server Error"),
])
def test_error_message_shapes(body, message):
    assert http.error_message(body) == message


def test_session_limits_concurrency_and_works_across_event_loops():
    active, peak, lock = [0], [0], threading.Lock()

    def handler(req):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return Reply.json({"ok": True})

    with LoopbackServer() as s:
        s.route("GET", "/busy", handler)
        session = http.Session(s.url, max_concurrency=2, timeout=5.0)
        threads = [threading.Thread(target=session.request, args=("GET", "busy")) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert peak[0] == 2

        async def burst():
            await asyncio.gather(*[session.arequest("GET", "/busy") for _ in range(6)])
            await session.aclose()

        peak[0] = 0
        asyncio.run(burst())
        asyncio.run(burst())  # a fresh loop gets a fresh AsyncClient
        assert peak[0] == 2 and s.count("GET", "/busy") == 18


def test_session_per_call_retries_and_argument_errors(server):
    server.fail_next("GET", "/ok", Reply(status=503, headers=NO_WAIT))
    session = http.Session(server.url, max_retries=3)
    with pytest.raises(http.StatusError, match="HTTP 503"):
        session.request("GET", "ok", max_retries=0)
    assert session.request("GET", "ok").json() == {"hello": "world"}
    session.close()
    with pytest.raises(ValueError, match="base_url must start with http"):
        http.Session("127.0.0.1:80")
    with pytest.raises(ValueError, match="max_concurrency must be >= 1"):
        http.Session("http://x", max_concurrency=0)
    with pytest.raises(ValueError, match="max_retries must be >= 0"):
        http.Session("http://x", max_retries=-1)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        http.as_timeout(0)


def test_retry_loop_keeps_one_client_across_calls(server):
    server.fail_next("POST", "/ok", Reply(status=429, headers=NO_WAIT), Reply(status=500, headers=NO_WAIT))
    calls = count_delta(server, "POST", "/ok")

    async def run():
        async with httpx.AsyncClient() as client:
            ok = await http.arequest_with_retries(client, "POST", f"{server.url}/ok", json={"b": 2})
            server.fail_next("POST", "/ok", *[Reply(status=503, headers=NO_WAIT)] * 2)
            with pytest.raises(http.StatusError, match="HTTP 503"):
                await http.arequest_with_retries(client, "POST", f"{server.url}/ok", max_retries=1, json={})
            return ok

    assert asyncio.run(run()).json() == {"echo": {"b": 2}} and calls() == 5


def test_non_idempotent_policy_never_resends_after_a_read_timeout(server):
    """A service that cannot cancel: the slow request is sent once, and the error says it may still run."""
    policy = http.RetryPolicy(max_retries=3, idempotent=False)
    calls = count_delta(server, "GET", "/slow")
    with pytest.raises(http.TransportFailed, match="ReadTimeout") as info:
        retried("GET", f"{server.url}/slow", client_timeout=httpx.Timeout(0.2, connect=1.0), retry=policy,
                sleep=no_sleep)
    time.sleep(1.0)  # let the server finish the one request it got
    assert calls() == 1 and info.value.may_have_run and info.value.attempts == 1
    # the default (idempotent) policy sends it again
    calls = count_delta(server, "GET", "/slow")
    with pytest.raises(http.TransportFailed) as info:
        retried("GET", f"{server.url}/slow", client_timeout=httpx.Timeout(0.2, connect=1.0), max_retries=1,
                sleep=no_sleep)
    time.sleep(1.0)
    assert calls() == 2 and info.value.attempts == 2


def test_non_idempotent_policy_retries_what_never_reached_the_server(server):
    policy = http.RetryPolicy(max_retries=2, retry_status=frozenset({503}), idempotent=False)
    url = f"http://127.0.0.1:{closed_port()}/x"
    with pytest.raises(http.TransportFailed, match="ConnectError") as info:
        retried("POST", url, retry=policy, sleep=no_sleep, json={})
    assert info.value.attempts == 3 and not info.value.may_have_run
    # only the statuses the policy names are retried: 503 is, 500 and 504 are not
    server.fail_next("POST", "/ok", Reply(status=503, headers=NO_WAIT), Reply(status=500, headers=NO_WAIT))
    calls = count_delta(server, "POST", "/ok")
    with pytest.raises(http.StatusError, match="HTTP 500") as info:
        retried("POST", f"{server.url}/ok", retry=policy, json={})
    assert calls() == 2 and info.value.attempts == 2
    session = http.Session(server.url, retry=policy)
    server.fail_next("POST", "/ok", Reply(status=504, body=b'{"detail": "Inference timeout"}'))
    with pytest.raises(http.StatusError, match="HTTP 504") as info:
        session.request("POST", "ok", json={})
    assert info.value.attempts == 1 and session.max_retries == 2
    session.close()
    with pytest.raises(ValueError, match="RetryPolicy.max_retries must be an int >= 0, got -1"):
        http.RetryPolicy(max_retries=-1)
