import asyncio
import json

import pytest
from support import fixtures
from support.loopback import LoopbackServer, Reply

from ranger_jax.env.backends import base, serper


def fixture(name):
    return fixtures.load(f"serper_{name}_response")


@pytest.fixture(scope="module")
def server():
    with LoopbackServer() as srv:
        for endpoint in ("search", "images", "news"):
            srv.route("POST", f"/{endpoint}", lambda req, e=endpoint: Reply.json(fixture(e)))
        yield srv


def client(server, **kwargs):
    kwargs.setdefault("api_key", "test-key")
    return serper.SerperClient(base_url=server.url, **kwargs)


def run(coro):
    return asyncio.run(coro)


def test_search_parses_organic_and_strips_bold(server):
    before = server.count("POST", "/search")
    hits = run(client(server, gl="us").search("Marlow Street clock tower heron", num=5, tbs="qdr:w"))
    assert hits[0] == base.TextHit(title="Marlow Street Clock Tower - Town Archive",
                                   url="https://town-archive.example.org/marlow-tower",
                                   snippet="Plans, photographs and the story of the copper heron on top of the "
                                           "tower.", position=1)
    assert hits[1].date == "Mar 9, 2026" and hits[1].title == "Weathervane heron taken down for repairs"
    request = server.requests[-1]
    assert server.count("POST", "/search") == before + 1
    assert request.headers["X-API-KEY"] == "test-key"
    assert request.json() == {"q": "Marlow Street clock tower heron", "num": 5, "tbs": "qdr:w", "gl": "us"}


def test_images_and_news(server):
    images = run(client(server).images("Marlow Street clock tower heron", num=20))
    assert images[1] == base.ImageHit(title="Copper heron weathervane, close-up",
                                      image_url="https://pics.example.com/p/31/heron-vane.png",
                                      page_url="https://pics.example.com/p/31", source="Example Pics",
                                      width=900, height=1200, position=2)
    news = run(client(server).news("Marlow Street clock tower heron", tbs="qdr:w"))
    assert news[0].date == "4 days ago" and news[0].snippet.endswith("— Riverside Post")
    assert server.requests[-1].json()["tbs"] == "qdr:w"


def test_429_with_retry_after_then_success(server):
    server.fail_next("POST", "/search", Reply.json({"message": "Too many"}, status=429, headers={"Retry-After": "0"}))
    before = server.count("POST", "/search")
    hits = run(client(server).search("q429"))
    assert len(hits) == 2 and server.count("POST", "/search") == before + 2


def test_5xx_retried_then_success(server):
    server.fail_next("POST", "/images", Reply(status=503, headers={"Retry-After": "0"}), Reply(status=502))
    before = server.count("POST", "/images")
    assert len(run(client(server).images("q5xx"))) == 2
    assert server.count("POST", "/images") == before + 3


def test_persistent_errors_become_backend_errors(server):
    server.fail_next("POST", "/search", *[Reply(status=500, body=b"boom", headers={"Retry-After": "0"})] * 2)
    with pytest.raises(base.BackendError, match=r"HTTP 500 from http://127\.0\.0\.1:\d+/search: boom"):
        run(client(server, max_retries=1).search("q500"))
    server.fail_next("POST", "/search", Reply.json({"message": "Unauthorized.", "statusCode": 403}, status=403))
    with pytest.raises(base.SearchUnavailable, match=r"rejected the API key \(HTTP 403.*Unauthorized"):
        run(client(server).search("q403"))
    server.fail_next("POST", "/search", Reply.json({"message": "Query not allowed", "statusCode": 400}))
    with pytest.raises(base.BackendError, match="Serper error from .*/search: Query not allowed"):
        run(client(server).search("q200"))
    server.fail_next("POST", "/news", Reply.json({"news": "oops"}))
    with pytest.raises(base.BackendError, match="malformed 'news'"):
        run(client(server).news("qbad"))


def test_timeout_is_a_backend_error(server):
    server.fail_next("POST", "/search", Reply.json(fixture("search"), delay_s=1.0))
    with pytest.raises(base.BackendError, match="Serper unreachable.*ReadTimeout"):
        run(client(server, timeout=0.2, max_retries=0).search("slow"))


def test_missing_key_is_reported_without_a_request(server, monkeypatch):
    monkeypatch.delenv(serper.API_KEY_ENV, raising=False)
    before = len(server.requests)
    with pytest.raises(base.SearchUnavailable, match="SERPER_API_KEY"):
        run(serper.SerperClient(base_url=server.url).search("x"))
    assert len(server.requests) == before
    monkeypatch.setenv(serper.API_KEY_ENV, "from-env")
    run(serper.SerperClient(base_url=server.url).search("x"))
    assert server.requests[-1].headers["X-API-KEY"] == "from-env"


def test_cache_replays_without_requests(server, tmp_path):
    first = run(client(server, cache_dir=tmp_path).images("cached query", tbs="qdr:d"))
    count = server.count()
    again = run(client(server, cache_dir=tmp_path, api_key=None).images("cached query", tbs="qdr:d"))
    assert again == first and server.count() == count
    run(client(server, cache_dir=tmp_path).images("cached query", tbs="qdr:w"))  # different request → miss
    assert server.count() == count + 1


def test_malformed_result_rows_are_skipped_or_cleaned():
    rows = [{"title": None, "link": 5, "snippet": ["a"], "date": 7}, "junk", None,
            {"title": "ok", "link": " https://a.org/x ", "snippet": "s", "date": 20251101, "position": "first"},
            {"imageUrl": 7, "link": 9}, {"imageUrl": "https://a.org/i.png", "link": ["x"], "source": {"n": 1},
                                        "imageWidth": "wide", "imageHeight": 1e400, "position": 2.0}]
    with LoopbackServer() as srv:
        body = json.dumps({"organic": rows, "images": rows}).replace("1e400", "Infinity")
        reply = Reply(body=body.encode(), headers={"Content-Type": "application/json"})
        srv.route("POST", "/search", lambda req: reply)
        srv.route("POST", "/images", lambda req: reply)
        hits = run(client(srv).search("q"))
        images = run(client(srv).images("q"))
    assert hits == [base.TextHit(title="ok", url="https://a.org/x", snippet="s", date=None, position=4)]
    assert images == [base.ImageHit(title="", image_url="https://a.org/i.png", page_url=None, source=None,
                                    width=None, height=None, position=2)]
