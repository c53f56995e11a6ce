"""ToolEnv over the live backend, end to end against one loopback server that plays Serper, the web and a
summariser (the production clients run; only base URLs differ)."""

import gzip
import io
import json
import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image
from support.loopback import LoopbackServer, Reply

from ranger_jax import env
from ranger_jax.env.backends import live, serper

ARTICLE = ("<html><head><title>Zurgrel Max 3 launch</title></head><body><article><p>The Zurgrel Max 3 Midnight "
           "has black checks on a red back and the emblem ZM3 below the camera. It went on sale on 16 May.</p>"
           "<p>Earlier models used blue chevrons; the Max 3 is the first with the checked pattern.</p></article>"
           "</body></html>")


def png(width, height, seed):
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def bomb_png(width, height):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 1000)) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def web():
    with LoopbackServer() as srv:
        base = srv.url
        image_rows = [
            {"title": "<b>Zurgrel</b> Max 3 Midnight", "imageUrl": f"{base}/img/0.png", "link": f"{base}/news/a.html"},
            {"title": "Metadata service", "imageUrl": "http://169.254.169.254/latest/x.png", "link": base},
            {"title": "Gigantic", "imageUrl": f"{base}/img/bomb.png", "link": base},
            {"title": "Not an image", "imageUrl": f"{base}/news/a.html", "link": base},
            {"title": "Launch crowd", "imageUrl": f"{base}/img/1.png", "link": f"{base}/news/b.html"},
            {"title": "Zurgrel Max 2", "imageUrl": f"{base}/img/2.png", "link": f"{base}/news/c.html"},
        ]
        srv.route("POST", "/images", lambda r: Reply.json({"searchParameters": r.json(), "images": image_rows}))
        srv.route("POST", "/search", lambda r: Reply.json({"organic": [
            {"title": "<b>Zurgrel Max 3</b> review", "link": f"{base}/news/a.html", "snippet": "Black <b>checks</b>.",
             "position": 1, "date": "May 16, 2025"}]}))
        for i in range(3):
            srv.route("GET", f"/img/{i}.png", lambda r, i=i: Reply(body=png(80 + 40 * i, 60, i),
                                                                   headers={"Content-Type": "image/png"}))
        srv.route("GET", "/img/bomb.png", lambda r: Reply(body=bomb_png(30_000, 30_000),
                                                          headers={"Content-Type": "image/png"}))
        srv.route("GET", "/news/a.html", lambda r: Reply.text(ARTICLE, content_type="text/html"))
        srv.route("GET", "/news/gz.html", lambda r: Reply(body=gzip.compress(ARTICLE.encode()), headers={
            "Content-Type": "text/html", "Content-Encoding": "gzip"}))
        srv.route("GET", "/news/slow.html", lambda r: Reply.text(ARTICLE, content_type="text/html", delay_s=1.5))
        srv.route("POST", "/v1/chat/completions", lambda r: Reply.json({
            "id": "c1", "object": "chat.completion", "model": r.json()["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "It has black checks and ZM3."},
                         "finish_reason": "stop"}]}))
        yield srv


def make(web, **options):
    options.setdefault("serper_api_key", "k")
    return env.make("live", serper_base_url=web.url, allow_hosts=(web.netloc,), fetch_timeout_s=1.0,
                    fetch_max_retries=0, **options)


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


TASK = env.Task("z", "The new Zurgrel Max 3 Midnight phone on a desk.", metadata={"today": "2025-05-18"})


def test_live_episode_search_download_crop_answer(web, tmp_path):
    with make(web, cache_dir=str(tmp_path / "cache"), image_store=str(tmp_path / "images")) as tool_env:
        state = tool_env.reset(TASK)
        state, obs = tool_env.step(state, call("image_search", query="Zurgrel Max 3", time_range="week"))
        assert [i.img_id for i in obs.images] == ["IMG_001", "IMG_002", "IMG_003"]
        assert "IMG_001: title: Zurgrel Max 3 Midnight" in obs.text
        assert "169.254.169.254" in obs.text and "link-local" in obs.text
        assert "decompression-bomb guard" in obs.text and "3 result(s) skipped" in obs.text
        record = state.images["IMG_002"]
        assert record.url == f"{web.url}/img/1.png" and (record.width, record.height) == (120, 60)
        assert record.page_url == f"{web.url}/news/b.html" and record.path.startswith(str(tmp_path / "images"))
        state, obs = tool_env.step(state, call("crop_image", img_id="IMG_002", bbox=[0.5, 0, 1, 1]))
        assert state.images["IMG_004"].root_box == (60.0, 0.0, 120.0, 60.0)
        state, obs = tool_env.step(state, call("search", query="Zurgrel Max 3"))
        assert "1. [Zurgrel Max 3 review]" in obs.text and "Black checks." in obs.text
        state, obs = tool_env.step(state, call("browse", url=f"{web.url}/news/gz.html", goal="pattern?"))
        assert "black checks on a red back" in obs.text and "title: Zurgrel Max 3 launch" in obs.text
        state, obs = tool_env.step(state, '<answer>{"gen_prompt": "the first reference image", '
                                          '"reference_images": [{"img_id": "IMG_004", "note": "phone"}]}</answer>')
        assert obs.termination == env.ANSWER
    images_request = next(r for r in web.requests if r.path == "/images")
    assert images_request.json()["tbs"] == "qdr:w" and images_request.headers["X-API-KEY"] == "k"


def test_replay_from_cache_makes_no_requests(web, tmp_path):
    script = [call("image_search", query="Zurgrel replay"), call("text_search", queries=["Zurgrel replay"]),
              call("web_fetch", url=f"{web.url}/news/a.html", prompt="x")]

    def play():
        with make(web, cache_dir=str(tmp_path)) as tool_env:
            state, texts = tool_env.reset(TASK), []
            for turn in script:
                state, obs = tool_env.step(state, turn)
                texts.append(obs.text)
            return texts, {k: (v.sha256, v.url) for k, v in state.images.items()}

    first = play()
    count = web.count()
    assert play() == first and web.count() == count


def test_summariser_answers_from_the_page(web):
    with make(web, summarizer_url=f"{web.url}/v1", summarizer_model="reader") as tool_env:
        state, obs = tool_env.step(tool_env.reset(TASK), call("web_fetch", url=f"{web.url}/news/a.html",
                                                              prompt="Which pattern?"))
    assert "Answer from the page for [Which pattern?]:\nIt has black checks and ZM3." in obs.text
    body = web.requests[-1].json()
    assert body["model"] == "reader" and body["temperature"] == 0.0
    assert "Which pattern?" in body["messages"][1]["content"] and "black checks" in body["messages"][1]["content"]
    web.fail_next("POST", "/v1/chat/completions", Reply(status=500, body=b"reader down"))
    with make(web, summarizer_url=f"{web.url}/v1", summarizer_max_retries=0) as tool_env:
        state, obs = tool_env.step(tool_env.reset(TASK), call("web_fetch", url=f"{web.url}/news/a.html", prompt="x"))
    assert "black checks on a red back" in obs.text and "Answer from the page" not in obs.text


def test_failures_become_observations(web, monkeypatch):
    monkeypatch.delenv(serper.API_KEY_ENV, raising=False)
    with env.make("live", serper_base_url=web.url, allow_hosts=(web.netloc,), fetch_timeout_s=0.5,
                  fetch_max_retries=0) as tool_env:
        state = tool_env.reset(TASK)
        state, obs = tool_env.step(state, call("text_search", queries=["a", "b"]))
        assert obs.text.count("no Serper API key (set SERPER_API_KEY)") == 2 and not obs.done
        assert (obs.info["error"], obs.info["errors"]) == ("search_unavailable", ["search_unavailable"] * 2)
        state, obs = tool_env.step(state, call("image_search", query="a"))
        assert "Image search failed: web search is unavailable" in obs.text
        assert (obs.info["error"], obs.info["errors"]) == ("search_unavailable", ["search_unavailable"])
        state, obs = tool_env.step(state, call("web_fetch", url=f"{web.url}/news/slow.html", prompt="x"))
        assert "timed out after 0.5 s" in obs.text and obs.info["error"] == "backend"
        state, obs = tool_env.step(state, call("web_fetch", url=f"{web.url}/missing", prompt="x"))
        assert "HTTP 404" in obs.text and obs.info["error"] == "backend"
        state, obs = tool_env.step(state, call("web_fetch", url="http://[::1]:22/", prompt="x"))
        assert "refused to fetch http://[::1]:22/: loopback" in obs.text and obs.info["error"] == "url_refused"
        state, obs = tool_env.step(state, call("web_fetch", url="gopher://x.org/", prompt="x"))
        assert "scheme 'gopher'" in obs.text and not obs.done and obs.info["error"] == "url_refused"


def test_a_live_env_without_a_search_key_warns_and_says_so_in_its_metadata(web, monkeypatch):
    monkeypatch.delenv(serper.API_KEY_ENV, raising=False)
    with pytest.warns(live.NoSearchKey, match=r"no Serper API key \(\$SERPER_API_KEY is not set\)"):
        keyless = env.make("live", serper_base_url=web.url)
    with keyless:
        facts = keyless.metadata
    assert facts["backend"] == "live" and facts["search_available"] is False and facts["search_key_env"] == \
        "SERPER_API_KEY" and "$SERPER_API_KEY is not set" in facts["problems"][0]
    json.dumps(facts)
    monkeypatch.setenv("TEAM_SERPER_KEY", "k")  # the variable is a setting of the env file
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with env.make("live", serper_base_url=web.url, serper_api_key_env="TEAM_SERPER_KEY") as keyed:
            assert keyed.metadata["search_available"] and keyed.metadata["problems"] == []
            assert keyed.backend.search.api_key == "k"
    with pytest.raises(ValueError, match="'serper_api_key_env' must name an environment variable"):
        env.make("live", serper_api_key_env="$TEAM_SERPER_KEY")


def test_a_host_that_does_not_resolve_is_not_reported_as_refused(web):
    with make(web) as tool_env:
        state, obs = tool_env.step(tool_env.reset(TASK), call("web_fetch", url="http://no-such-host.invalid/a",
                                                              prompt="x"))
    assert "cannot resolve host 'no-such-host.invalid'" in obs.text and "refused" not in obs.text
    assert (obs.info["error"], obs.info["errors"]) == ("dns", ["dns"])
