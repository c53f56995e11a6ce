"""Image generators against loopback servers: SGLang diffusion images API and the Gen-Searcher service."""
import asyncio
import base64
import io
import re
import threading
import time
from email.parser import BytesParser
from email.policy import HTTP

import pytest
from PIL import Image

from ranger_jax.clients import compositor, images, media
from support import fixtures
from support.loopback import LoopbackServer, Reply

GEN_REQUEST = fixtures.load("sglang_images_generations_request")
GEN_RESPONSE = fixtures.load("sglang_images_generations_response")
NO_WAIT = {"Retry-After": "0"}


def form_fields(req) -> list[tuple[str, str]]:
    """(name, value) of every multipart/form-data part, in order."""
    head = b"Content-Type: " + req.headers["Content-Type"].encode() + b"\r\n\r\n"
    message = BytesParser(policy=HTTP).parsebytes(head + req.body)
    return [(p.get_param("name", header="content-disposition"), p.get_content()) for p in message.iter_parts()]


def b64_png(color, size=(6, 4), fmt="PNG") -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, fmt)
    return base64.b64encode(buf.getvalue()).decode()


def edits_handler(req):
    """Like sglang's /v1/images/edits: 422 without image/url, 400 for a url of another form."""
    fields = form_fields(req)
    urls = [v for k, v in fields if k == "url"]
    if not urls:
        return Reply.json({"detail": "Field 'image' or 'url' is required"}, status=422)
    if any(not u.startswith(("data:image/", "http://", "https://")) for u in urls):
        return Reply.json({"detail": "Failed to process image source: Unsupported image url format"}, status=400)
    first = (Image.open(io.BytesIO(media.decode_data_url(urls[0])[1])).getpixel((0, 0))
             if urls[0].startswith("data:") else (0, 0, 0))
    return Reply.json({"id": "x", "created": 1, "data": [{"b64_json": b64_png(first, fmt="JPEG"), "url": None}]})


@pytest.fixture(scope="module")
def server():
    with LoopbackServer() as s:
        s.route("POST", "/v1/images/generations", lambda req: Reply.json(GEN_RESPONSE))
        s.route("POST", "/v1/images/edits", edits_handler)
        yield s


@pytest.fixture(scope="module")
def generator(server):
    return images.SGLangImageGenerator(server.url, model="Qwen/Qwen-Image", seed=2718, num_inference_steps=40,
                                       size="1328x1328", max_retries=1)


def test_text_only_prompt_uses_generations_with_pinned_fields(server, generator):
    result = generator.generate(GEN_REQUEST["prompt"])
    sent = server.requests[-1].json()
    assert sent == GEN_REQUEST
    assert result.ok and result.error is None and result.latency_s > 0
    image = Image.open(io.BytesIO(result.image))
    assert image.format == "PNG" and image.size == (3, 2) and image.getpixel((0, 0)) == (184, 115, 51)
    assert result.request["endpoint"].endswith("/v1/images/generations") and result.request["num_references"] == 0


def test_references_go_to_edits_as_ordered_data_urls(server, generator):
    refs = [Image.new("RGB", (8, 8), "red"), Image.new("RGBA", (4, 4), (0, 0, 255, 255)),
            Image.new("RGB", (3, 3), "lime"), Image.new("RGB", (3, 3), "black")]
    result = generator.generate("the same red thing", refs, seed=7, size=(512, 256))
    fields = form_fields(server.requests[-1])
    names = dict(fields)
    assert names["seed"] == "7" and names["size"] == "512x256" and names["response_format"] == "b64_json"
    assert names["num_inference_steps"] == "40" and names["true_cfg_scale"] == "4.0"
    urls = [v for k, v in fields if k == "url"]
    colours = [Image.open(io.BytesIO(media.decode_data_url(u)[1])).getpixel((0, 0)) for u in urls]
    assert colours == [(255, 0, 0), (0, 0, 255), (0, 255, 0)]  # first 3 refs, in order
    assert result.ok and result.request["num_references"] == 3 and result.request["num_references_given"] == 4
    decoded = Image.open(io.BytesIO(result.image))
    assert decoded.format == "PNG" and decoded.mode == "RGB"  # the server's JPEG came back as PNG


@pytest.mark.parametrize("path, reply, expected", [
    ("/v1/images/edits", Reply.json({"detail": "Field 'image' or 'url' is required"}, status=422),
     "HTTP 422 .*Field 'image' or 'url' is required"),
    ("/v1/images/edits", Reply.json({"detail": "Failed to process image source: Unsupported image url format"},
                                    status=400), "HTTP 400 .*Unsupported image url format"),
    ("/v1/images/generations", Reply.json({"detail": "size must be formatted as positive WIDTHxHEIGHT"}, status=400),
     "size must be formatted"),
    ("/v1/images/generations", Reply.text("Internal Server Error", status=500, headers=NO_WAIT),
     "HTTP 500 .*Internal Server Error"),
    ("/v1/images/generations", Reply.json({"error": "backend crashed"}, status=503, headers=NO_WAIT),
     "HTTP 503 .*backend crashed"),
])
def test_http_failures_become_failed_results(server, generator, path, reply, expected):
    server.fail_next("POST", path, *[reply] * (2 if reply.status >= 500 else 1))  # 5xx is retried once
    refs = [Image.new("RGB", (2, 2))] if path.endswith("edits") else []
    result = generator.generate("a prompt", refs)
    assert not result.ok and result.image is None
    assert re.search(expected, result.error), result.error
    assert generator.generate("a prompt", refs).ok  # nothing scripted is left over


def test_url_references_pass_through_and_bad_ones_are_reported(server, generator):
    result = generator.generate("x", ["data:text/plain;base64,aGk="])
    assert not result.ok and "Unsupported image url format" in result.error
    assert generator.generate("x", ["https://example.com/ref.png"]).ok
    assert dict(form_fields(server.requests[-1]))["url"] == "https://example.com/ref.png"
    assert "image file /no/such.png does not exist" in generator.generate("x", ["/no/such.png"]).error


def test_500_then_success_is_retried(server, generator):
    server.fail_next("POST", "/v1/images/generations", Reply.text("Internal Server Error", status=500, headers=NO_WAIT))
    before = server.count("POST", "/v1/images/generations")
    assert generator.generate("retry me").ok
    assert server.count("POST", "/v1/images/generations") == before + 2


def test_bad_payloads_and_arguments_are_failed_results(server, generator):
    server.fail_next("POST", "/v1/images/generations", Reply.json({"id": "x", "data": [{"b64_json": "bm90IGFuIGltYWdl"}]}),
                     Reply.json({"id": "x", "data": []}), Reply.json({"id": "x", "data": [{"url": "/v1/images/x/content"}]}),
                     Reply.text("<html>"))
    assert "undecodable image" in generator.generate("a").error
    assert "returned no data[0]" in generator.generate("a").error
    assert "without b64_json (url='/v1/images/x/content')" in generator.generate("a").error
    assert "body is not JSON" in generator.generate("a").error
    assert generator.generate("  ").error == "bad generation request: prompt is empty"
    assert "size must be formatted as positive WIDTHxHEIGHT, got '12'" in generator.generate("a", size="12").error
    assert "bytes are not a decodable image" in generator.generate("a", [b"junk"]).error
    with pytest.raises(ValueError, match="num_inference_steps must be >= 1"):
        images.SGLangImageGenerator("http://x", num_inference_steps=0)


def test_timeout_is_a_failed_result():
    with LoopbackServer() as s:
        s.route("POST", "/v1/images/generations", lambda req: Reply.json(GEN_RESPONSE, delay_s=0.5))
        result = images.SGLangImageGenerator(s.url, timeout=0.15, max_retries=0).generate("slow")
    assert not result.ok and "ReadTimeout" in result.error and result.latency_s >= 0.15


def test_async_generate(server, generator):
    async def run():
        return await asyncio.gather(generator.agenerate("a"), generator.agenerate("b", [Image.new("RGB", (2, 2))]))

    text_only, edit = asyncio.run(run())
    assert text_only.ok and edit.ok and edit.request["endpoint"].endswith("/edits")


class GenSearcherService:
    """Gen-Searcher's `POST /generate`: success with a PNG of the first reference's colour, or success=false."""

    def __init__(self):
        self.active = self.peak = 0
        self.lock = threading.Lock()

    def __call__(self, req):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            body = req.json()
            time.sleep(0.02)  # long enough for requests to overlap
            if body["prompt"] == "fail":
                return Reply.json({"success": False, "message": "CUDA out of memory"})
            colour = Image.open(io.BytesIO(media.decode_data_url(body["image_urls"][0])[1])).getpixel((0, 0))
            return Reply.json({"success": True, "image": b64_png(colour)})
        finally:
            with self.lock:
                self.active -= 1


def test_gen_searcher_contract_and_failures():
    service = GenSearcherService()
    with LoopbackServer() as s:
        s.route("POST", "/generate", service)
        generator = images.GenSearcherGenerator(s.url, max_retries=0)
        result = generator.generate("edit this", [Image.new("RGB", (4, 4), "red")] * 5, seed=3)
        sent = s.requests[-1].json()
        assert result.ok and Image.open(io.BytesIO(result.image)).getpixel((0, 0)) == (255, 0, 0)
        assert len(sent["image_urls"]) == 3 and sent["image_urls"][0].startswith("data:image/png;base64,")
        assert {k: sent[k] for k in ("prompt", "seed", "true_cfg_scale", "negative_prompt", "num_inference_steps",
                                     "guidance_scale", "num_images_per_prompt")} == {
            "prompt": "edit this", "seed": 3, "true_cfg_scale": 4.0, "negative_prompt": " ",
            "num_inference_steps": 40, "guidance_scale": 1.0, "num_images_per_prompt": 1}
        failed = generator.generate("fail", [Image.new("RGB", (2, 2))])
        assert not failed.ok and failed.error.endswith("reported failure: CUDA out of memory")
        s.fail_next("POST", "/generate", Reply.json({"status": "weird"}), Reply.json({"success": True}))
        assert "answered without 'success'" in generator.generate("x", [Image.new("RGB", (2, 2))]).error
        assert "success without an 'image' string" in generator.generate("x", [Image.new("RGB", (2, 2))]).error
        before = s.count()
        assert "needs at least one reference image, got 0" in generator.generate("x").error
        assert "has no size field" in generator.generate("x", [Image.new("RGB", (2, 2))], size="64x64").error
        assert s.count() == before


def test_gen_searcher_spreads_load_and_respects_limits():
    services = [GenSearcherService(), GenSearcherService()]
    with LoopbackServer() as a, LoopbackServer() as b:
        a.route("POST", "/generate", services[0])
        b.route("POST", "/generate", services[1])
        generator = images.GenSearcherGenerator([a.url, b.url], max_per_url=2, max_concurrency=10)
        assert generator.max_concurrency == 4
        ref = [Image.new("RGB", (2, 2), "blue")]

        async def burst():
            return await asyncio.gather(*[generator.agenerate(f"p{i}", ref) for i in range(12)])

        results = asyncio.run(burst())
        threads = [threading.Thread(target=generator.generate, args=("sync", ref)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(r.ok for r in results)
        assert a.count() + b.count() == 20 and min(a.count(), b.count()) >= 5  # least-loaded URL first
        assert max(s.peak for s in services) <= 2
        with pytest.raises(ValueError, match="needs at least one base URL"):
            images.GenSearcherGenerator([])


def test_parse_size():
    assert images.parse_size("1664x928") == (1664, 928) and images.parse_size((3, 4)) == (3, 4)
    for bad in ("0x5", "axb", "5x", (0, 3)):
        with pytest.raises(ValueError, match="size must be"):
            images.parse_size(bad)


def test_constructor_errors():
    with pytest.raises(ValueError, match="max_references must be >= 1, got 0"):
        images.SGLangImageGenerator("http://x", max_references=0)
    with pytest.raises(ValueError, match="size must be formatted"):
        images.SGLangImageGenerator("http://x", size="big")
    with pytest.raises(ValueError, match="max_per_url and max_concurrency must be >= 1, got 0, 20"):
        images.GenSearcherGenerator("http://x", max_per_url=0)
    with pytest.raises(ValueError, match="max_references must be >= 1, got 0"):
        compositor.CompositorGenerator(max_references=0)


def test_gen_searcher_statuses_and_timeouts_are_recorded_not_resent():
    """The service's 400/503/504 and a client timeout: what is retried, and what the result records."""
    service, ref = GenSearcherService(), [Image.new("RGB", (2, 2), "green")]
    busy = Reply.json({"detail": "All GPUs are busy (wait timeout)"}, status=503, headers=NO_WAIT)
    with LoopbackServer() as s:
        s.route("POST", "/generate", service)
        generator = images.GenSearcherGenerator(s.url)
        assert not generator.retry.idempotent and generator.retry.max_retries == 2

        s.fail_next("POST", "/generate", Reply.json({"detail": "cannot identify image file"}, status=400))
        before = s.count()
        result = generator.generate("x", ref)
        assert s.count() - before == 1 and not result.ok
        assert result.error.endswith("cannot identify image file (the service could not load a reference image)")
        assert (result.request["status"], result.request["attempts"]) == (400, 1)

        s.fail_next("POST", "/generate", busy)  # nothing ran: sent again, and the second try succeeds
        before = s.count()
        assert generator.generate("x", ref).ok and s.count() - before == 2

        s.fail_next("POST", "/generate", busy, busy, busy)
        result = generator.generate("x", ref)
        assert not result.ok and "All GPUs are busy (wait timeout) (no GPU came free" in result.error
        assert (result.request["status"], result.request["attempts"]) == (503, 3)

        s.fail_next("POST", "/generate", Reply.json({"detail": "Inference timeout"}, status=504))
        before = s.count()
        result = generator.generate("x", ref)
        assert s.count() - before == 1 and "cannot stop the work" in result.error
        assert (result.request["status"], result.request["attempts"]) == (504, 1)

        slow = images.GenSearcherGenerator(s.url, timeout=0.3)
        s.fail_next("POST", "/generate", Reply.json({"success": True, "image": b64_png("red")}, delay_s=1.0))
        before = s.count()
        result = slow.generate("x", ref)
        time.sleep(1.0)  # the service is still working on it; it must have been sent once
        assert s.count() - before == 1 and not result.ok and "ReadTimeout" in result.error
        assert "not sent again: the request may still be queued or running" in result.error
        assert result.request["may_still_run"] is True and result.request["attempts"] == 1
