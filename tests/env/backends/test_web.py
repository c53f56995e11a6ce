import asyncio
import gzip
import io

import numpy as np
import pytest
from PIL import Image
from support.loopback import LoopbackServer, Reply

from ranger_jax.env.backends import base, transport, urlguard, web

ARTICLE = """<!doctype html><html><head><title>Halvorsen Point Light gets a new railing</title>
<meta name="date" content="2025-11-14"></head><body><nav>Home | News | Contact</nav>
<article><h1>Halvorsen Point Light gets a new railing</h1>
<p>Crews finished replacing the gallery railing of the Halvorsen Point Light on Tuesday. The new railing is
painted signal red to match the cast-iron tower, which was first lit in 1891.</p>
<p>The heritage trust said the lantern room will reopen to visitors on weekends until six in the evening,
and that the keepers' cottage exhibition about the 1978 automation stays open all winter.</p></article>
<footer>Copyright Coastal News</footer></body></html>"""


def png(width=32, height=24, seed=0):
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def servers():
    with LoopbackServer() as srv, LoopbackServer() as other:
        html = {"Content-Type": "text/html; charset=utf-8"}
        srv.route("GET", "/page.html", lambda r: Reply.text(ARTICLE, content_type="text/html; charset=utf-8"))
        srv.route("GET", "/plain.txt", lambda r: Reply.text("just text\nline two"))
        srv.route("GET", "/big.html", lambda r: Reply.text("<html><body><p>" + "word " * 20_000 + "</p></body></html>",
                                                            content_type="text/html"))
        srv.route("GET", "/gzip.html", lambda r: Reply(body=gzip.compress(ARTICLE.encode()),
                                                        headers={**html, "Content-Encoding": "gzip"}))
        srv.route("GET", "/slow.html", lambda r: Reply(chunks=[b"<html><body>"] * 20, chunk_delay_s=0.1, headers=html))
        srv.route("GET", "/redirect", lambda r: Reply(status=302, headers={"Location": "/page.html"}))
        srv.route("GET", "/redirect-out", lambda r: Reply(status=301, headers={"Location": f"{other.url}/page.html"}))
        srv.route("GET", "/redirect-octal", lambda r: Reply(
            status=307, headers={"Location": f"http://0177.0.0.1:{other.port}/page.html"}))
        srv.route("GET", "/redirect-loop", lambda r: Reply(status=302, headers={"Location": "/redirect-loop"}))
        srv.route("GET", "/pdf", lambda r: Reply(body=b"%PDF-1.4", headers={"Content-Type": "application/pdf"}))
        srv.route("GET", "/img.png", lambda r: Reply(body=png(), headers={"Content-Type": "image/png"}))
        srv.route("GET", "/img-html", lambda r: Reply.text("<html></html>", content_type="text/html"))
        srv.route("GET", "/huge.png", lambda r: Reply(body=png(400, 400), headers={"Content-Type": "image/png"}))
        srv.route("GET", "/bomb.png", lambda r: Reply(body=gzip.compress(b"\0" * 5_000_000),
                                                       headers={"Content-Type": "image/png", "Content-Encoding": "gzip"}))
        srv.route("GET", "/drawing.svg", lambda r: Reply.text("<svg/>", content_type="image/svg+xml"))
        other.route("GET", "/page.html", lambda r: Reply.text(ARTICLE, content_type="text/html"))
        yield srv, other


def fetcher(server, **kwargs):
    kwargs.setdefault("timeout_s", 5.0)
    kwargs.setdefault("max_image_bytes", 100_000)
    return web.WebFetcher(urlguard.UrlGuard((server.netloc,)), **kwargs)


def run(coro):
    return asyncio.run(coro)


def test_html_page_to_text(servers):
    srv, _ = servers
    page = run(fetcher(srv).fetch_page(f"{srv.url}/page.html"))
    assert page.title == "Halvorsen Point Light gets a new railing" and page.url == f"{srv.url}/page.html"
    assert "painted signal red" in page.text and "1978 automation" in page.text
    assert "Copyright" not in page.text and "<p>" not in page.text
    assert srv.requests[-1].headers["User-Agent"].startswith("Mozilla/5.0")
    plain = run(fetcher(srv).fetch_page(f"{srv.url}/plain.txt"))
    assert plain.text == "just text\nline two"
    assert "painted signal red" in run(fetcher(srv).fetch_page(f"{srv.url}/gzip.html")).text


def test_page_size_cap_cuts_the_page(servers):
    srv, _ = servers
    page = run(fetcher(srv, max_page_bytes=2_000).fetch_page(f"{srv.url}/big.html"))
    assert page.text.endswith("[page cut at 2000 bytes]") and len(page.text) < 2_100


def test_slow_body_times_out(servers):
    srv, _ = servers
    with pytest.raises(base.BackendError, match=r"slow\.html timed out after 0\.5 s"):
        run(fetcher(srv, timeout_s=0.5).fetch_page(f"{srv.url}/slow.html"))


def test_redirects_are_followed_and_every_hop_is_guarded(servers):
    srv, other = servers
    page = run(fetcher(srv).fetch_page(f"{srv.url}/redirect"))
    assert page.url == f"{srv.url}/page.html" and "signal red" in page.text
    before = other.count()
    with pytest.raises(urlguard.UrlRefused, match=rf"refused to fetch {other.url}/page.html: loopback"):
        run(fetcher(srv).fetch_page(f"{srv.url}/redirect-out"))
    with pytest.raises(urlguard.UrlRefused, match="0177.0.0.1.*loopback"):
        run(fetcher(srv).fetch_image(f"{srv.url}/redirect-octal"))
    assert other.count() == before
    with pytest.raises(base.BackendError, match="too many redirects"):
        run(fetcher(srv, max_redirects=3).fetch_page(f"{srv.url}/redirect-loop"))
    # the same redirect works once the second host is allowed too
    allowed = web.WebFetcher(urlguard.UrlGuard((srv.netloc, other.netloc)))
    assert "signal red" in run(allowed.fetch_page(f"{srv.url}/redirect-out")).text


def test_unlisted_loopback_host_is_refused_before_any_request(servers):
    srv, other = servers
    before = other.count()
    with pytest.raises(urlguard.UrlRefused, match="loopback"):
        run(fetcher(srv).fetch_page(f"{other.url}/page.html"))
    with pytest.raises(urlguard.UrlRefused, match="0177.0.0.1.*loopback"):
        run(fetcher(srv).fetch_page(f"http://0177.0.0.1:{other.port}/page.html"))
    with pytest.raises(urlguard.UrlRefused, match="2130706433.*loopback"):
        run(fetcher(srv).fetch_image(f"http://2130706433:{other.port}/img.png"))
    assert other.count() == before


def test_malformed_redirect_is_refused(servers):
    srv, _ = servers
    srv.route("GET", "/redirect-bad", lambda r: Reply(status=302, headers={"Location": "http://[::1/x"}))
    with pytest.raises(urlguard.UrlRefused, match="malformed"):
        run(fetcher(srv).fetch_page(f"{srv.url}/redirect-bad"))


def test_http_errors_retries_and_content_types(servers):
    srv, _ = servers
    with pytest.raises(base.BackendError, match=r"HTTP 404 from .*/missing"):
        run(fetcher(srv).fetch_page(f"{srv.url}/missing"))
    srv.fail_next("GET", "/plain.txt", Reply(status=503, headers={"Retry-After": "0"}))
    before = srv.count("GET", "/plain.txt")
    assert run(fetcher(srv).fetch_page(f"{srv.url}/plain.txt")).text.startswith("just text")
    assert srv.count("GET", "/plain.txt") == before + 2
    with pytest.raises(base.BackendError, match="content-type 'application/pdf'"):
        run(fetcher(srv).fetch_page(f"{srv.url}/pdf"))
    with pytest.raises(base.BackendError, match="is an image"):
        run(fetcher(srv).fetch_page(f"{srv.url}/img.png"))


def test_image_download_and_limits(servers):
    srv, _ = servers
    image = run(fetcher(srv).fetch_image(f"{srv.url}/img.png", page_url="https://news.example.org/story"))
    assert image.data == png() and image.content_type == "image/png"
    assert srv.requests[-1].headers["Referer"] == "https://news.example.org/story"
    run(fetcher(srv).fetch_image(f"{srv.url}/img.png"))
    assert srv.requests[-1].headers["Referer"] == f"{srv.url}/"
    with pytest.raises(base.BackendError, match=r"not an image \(content-type 'text/html'\)"):
        run(fetcher(srv).fetch_image(f"{srv.url}/img-html"))
    with pytest.raises(transport.BodyTooLarge, match=r"huge\.png is too large: \d+ bytes \(limit 100000 bytes\)"):
        run(fetcher(srv).fetch_image(f"{srv.url}/huge.png"))
    with pytest.raises(transport.BodyTooLarge, match=r"bomb\.png is too large: more than 100000 bytes"):
        run(fetcher(srv).fetch_image(f"{srv.url}/bomb.png"))
    with pytest.raises(base.BackendError, match="SVG"):
        run(fetcher(srv).fetch_image(f"{srv.url}/drawing.svg"))
    with pytest.raises(base.BackendError, match="too small"):
        run(fetcher(srv, min_image_bytes=10**6 // 10).fetch_image(f"{srv.url}/img.png"))


def test_cache_replays_pages_and_images(servers, tmp_path):
    srv, _ = servers
    first_page = run(fetcher(srv, cache_dir=tmp_path).fetch_page(f"{srv.url}/page.html"))
    first_image = run(fetcher(srv, cache_dir=tmp_path).fetch_image(f"{srv.url}/img.png"))
    count = srv.count()
    assert run(fetcher(srv, cache_dir=tmp_path).fetch_page(f"{srv.url}/page.html")) == first_page
    assert run(fetcher(srv, cache_dir=tmp_path).fetch_image(f"{srv.url}/img.png")).data == first_image.data
    assert srv.count() == count
    for _ in range(2):  # a permanent failure replays from the cache too; a transient one is asked again
        with pytest.raises(transport.PermanentFetchError, match="not an image"):
            run(fetcher(srv, cache_dir=tmp_path).fetch_image(f"{srv.url}/img-html"))
    assert srv.count() == count + 1
    srv.fail_next("GET", "/plain.txt", Reply(status=503))
    with pytest.raises(base.BackendError, match="HTTP 503"):
        run(fetcher(srv, cache_dir=tmp_path, max_retries=0).fetch_page(f"{srv.url}/plain.txt"))
    assert run(fetcher(srv, cache_dir=tmp_path).fetch_page(f"{srv.url}/plain.txt")).text.startswith("just text")


def test_jina_reader(servers):
    srv, _ = servers
    target = f"{srv.url}/page.html"
    body = "Title: Railing restored\n\nURL Source: x\n\nPublished Time: 2025-11-14\n\nMarkdown Content:\n# Railing\nRed."
    srv.route("GET", f"/{target}", lambda r: Reply.text(body))
    page = run(fetcher(srv, jina_base_url=srv.url, jina_api_key="jk").fetch_page(target))
    assert page == base.Page(url=target, title="Railing restored", text="# Railing\nRed.", date="2025-11-14")
    request = srv.requests[-1]
    assert request.path == f"/{target}" and request.headers["Authorization"] == "Bearer jk"
    with pytest.raises(urlguard.UrlRefused, match="loopback"):
        run(fetcher(srv, jina_base_url=srv.url).fetch_page("http://127.0.0.1:1/secret"))
