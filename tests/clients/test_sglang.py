"""SGLangClient against a loopback server speaking SGLang's native API (sglang 0.5.23)."""
import asyncio
import io
import re
import threading

import numpy as np
import pytest
from PIL import Image

from ranger_jax.clients import http, media, sglang
from support import fixtures
from support.loopback import LoopbackServer, Reply

GEN_REQUEST = fixtures.load("sglang_generate_request")
GEN_RESPONSE = fixtures.load("sglang_generate_response")
UPDATE_REQUEST = fixtures.load("sglang_update_weights_from_disk_request")
UPDATE_RESPONSE = fixtures.load("sglang_update_weights_from_disk_response")
# The fields of sglang 0.5.23's SamplingParams (kept apart from the client's own table on purpose).
SERVER_KNOWN = {"max_new_tokens", "min_new_tokens", "stop", "stop_regex", "stop_token_ids", "temperature", "top_p",
                "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "n", "json_schema",
                "regex", "ebnf", "structural_tag", "ignore_eos", "no_stop_trim", "skip_special_tokens",
                "spaces_between_special_tokens", "logit_bias", "sampling_seed", "custom_params", "stream_interval",
                "beam_width", "watermark", "choice"}
IM_END = 151645
NO_WAIT = {"Retry-After": "0"}


class FakeSGLang:
    """A scripted SGLang server: deterministic "generation", weight versions, pause/abort, health."""

    def __init__(self):
        self.weight_version, self.model_path, self.healthy = "default", "ckpts/base", True
        self.hold: dict[str, threading.Event] = {}
        self.bodies: list[dict] = []

    def generate(self, req):
        body = req.json()
        self.bodies.append(body)
        params = body.get("sampling_params") or {}
        for key in params:
            if key not in SERVER_KNOWN:
                return Reply.json({"error": f"unknown field `{key}`, expected one of `max_new_tokens`, ..."}, status=400)
        ids = body.get("input_ids")
        if not ids:
            return Reply.json({"error": {"message": "Either text, input_ids or input_embeds should be provided."}},
                              status=400)
        start = body.get("logprob_start_len", -1)
        if start > len(ids):
            return Reply.json({"error": {"message": f"logprob_start_len ({start}) >= prompt length ({len(ids)})"}},
                              status=400)
        rid = body["rid"]
        limit = params.get("max_new_tokens", 128)
        out = [int((ids[-1] + 7 * i + 1) % 1000) for i in range(min(limit, 4))]
        finish = {"type": "length", "length": limit}
        if limit > 4 and IM_END in (params.get("stop_token_ids") or []):
            out.append(IM_END)
            finish = {"type": "stop", "matched": IM_END}
        if rid in self.hold:  # wait for /abort_request, then answer with partial output, HTTP 200
            self.hold[rid].wait(5)
            out = out[:2]
            finish = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
        meta = {"id": rid, "finish_reason": finish, "prompt_tokens": len(ids) + 4 * len(body.get("image_data") or []),
                "weight_version": self.weight_version, "completion_tokens": len(out), "cached_tokens": 0}
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[-0.1 * (i + 1), t, None] for i, t in enumerate(out)]
            meta["input_token_logprobs"] = ([[None, ids[start], None]] + [[-1.0, t, None] for t in ids[start + 1:]]
                                            if start >= 0 else [])
        return Reply.json({"text": "x" * len(out), "output_ids": out, "meta_info": meta})

    def abort(self, req):
        body = req.json()
        if body["rid"] in self.hold:
            self.hold[body["rid"]].set()
        return Reply(status=200)

    def update_weights(self, req):
        body = req.json()
        if "missing" in body["model_path"]:
            return Reply.json({"success": False, "message": "Failed to get weights iterator: no such dir",
                               "num_paused_requests": 0}, status=400)
        self.model_path, self.weight_version = body["model_path"], body["weight_version"] or self.weight_version
        return Reply.json(UPDATE_RESPONSE)

    def update_version(self, req):
        self.weight_version = req.json()["new_version"]
        return Reply.json({"success": True, "message": f"Weight version updated to {self.weight_version}",
                           "new_version": self.weight_version})

    def model_info(self, req):
        return Reply.json({"model_path": self.model_path, "weight_version": self.weight_version, "is_generation": True,
                           "has_image_understanding": True, "preferred_sampling_params": None})


@pytest.fixture(scope="module")
def server():
    fake = FakeSGLang()
    with LoopbackServer() as s:
        s.route("POST", "/generate", fake.generate)
        s.route("POST", "/abort_request", fake.abort)
        s.route("POST", "/update_weights_from_disk", fake.update_weights)
        s.route("POST", "/update_weight_version", fake.update_version)
        s.route("GET", "/get_model_info", fake.model_info)
        s.route("GET", "/health", lambda req: Reply(status=200 if fake.healthy else 503))
        s.route("POST", "/flush_cache", lambda req: Reply.text(
            "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, "
            "the operation will not be performed.)\n"))
        s.route("POST", "/pause_generation", lambda req: Reply.json({"message": "Generation paused successfully.",
                                                                    "status": "ok"}))
        s.route("POST", "/continue_generation", lambda req: Reply.json({"message": "Generation continued successfully.",
                                                                       "status": "ok"}))
        s.fake = fake
        yield s


@pytest.fixture(scope="module")
def client(server):
    with sglang.SGLangClient(server.url, max_retries=2) as c:
        yield c


def test_fixture_request_and_response():
    with LoopbackServer() as s:
        s.route("POST", "/generate", lambda req: Reply.json(GEN_RESPONSE))
        result = sglang.SGLangClient(s.url).generate(
            GEN_REQUEST["input_ids"], sampling_params=GEN_REQUEST["sampling_params"], rid=GEN_REQUEST["rid"],
            return_text_in_logprobs=True)
        sent = s.requests[-1].json()
    assert {k: v for k, v in sent.items()} == {k: GEN_REQUEST[k] for k in sent}
    assert result.rid == "episode-0042-turn-1" and result.text == "Copper green."
    np.testing.assert_array_equal(result.output_ids, [84170, 6176, 13, 151645])
    np.testing.assert_allclose(result.output_logprobs, [-0.5316, -0.0871, -0.0153, -0.0021], rtol=1e-6)
    assert result.output_ids.dtype == np.int32 and result.output_logprobs.dtype == np.float32
    assert (result.finish_reason, result.matched_stop, result.weight_version) == ("stop", IM_END, "step_12")
    assert (result.prompt_tokens, result.completion_tokens, result.input_logprobs) == (14, 4, None)
    assert not result.aborted


def test_generate_with_images_sends_exact_pixels(client, server):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
    result = client.generate(np.array([1, 2, 3]), image_data=[Image.fromarray(pixels), "https://example.com/a.png"],
                             sampling_params={"max_new_tokens": 8, "stop_token_ids": [IM_END], "temperature": 0.7})
    sent = server.fake.bodies[-1]
    assert sent["image_data"][1] == "https://example.com/a.png"
    _, png = media.decode_data_url(sent["image_data"][0])
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png))), pixels)
    assert result.finish_reason == "stop" and result.output_ids[-1] == IM_END and result.prompt_tokens == 11
    assert len(result.output_ids) == len(result.output_logprobs) == 5


def test_length_finish_and_prompt_logprobs(client):
    result = client.generate([5, 6, 7, 8], sampling_params={"max_new_tokens": 3}, logprob_start_len=1)
    assert result.finish_reason == "length" and len(result.output_ids) == 3
    assert np.isnan(result.input_logprobs[0]) and list(result.input_logprobs[1:]) == [-1.0, -1.0]
    assert client.generate([1], return_logprob=False).output_logprobs is None


@pytest.mark.parametrize("params, message", [
    ({"max_tokens": 5}, r"unknown sampling_params key 'max_tokens'; SGLang accepts \["),
    ({"max_new_tokens": 1.5}, r"sampling_params\['max_new_tokens'\] must be int, got float 1.5"),
    ({"ignore_eos": 1}, r"sampling_params\['ignore_eos'\] must be bool"),
    ({"top_k": True}, r"sampling_params\['top_k'\] must be int, got bool"),
    ({"json_schema": {"type": "object"}}, r"must be JSON text; pass json.dumps\(schema\)"),
    ({"regex": "a+", "ebnf": "x"}, "at most one of"),
    ({"n": 2}, "one sample per request"),
    ({"top_p": 0.0}, r"top_p'\] must be in \(0, 1\]"),
    ({"temperature": -1}, r"temperature'\] must be >= 0"),
    ({"max_new_tokens": -1}, r"max_new_tokens'\] must be >= 0"),
    ({"stop_token_ids": ["<|im_end|>"]}, "must be a list of ints"),
    ({"choice": "yes"}, r"sampling_params\['choice'\] must be list, got str"),
    ({"choice": ["yes", 1]}, r"sampling_params\['choice'\] must be a non-empty list of strings"),
    ({"watermark": True}, r"sampling_params\['watermark'\] must be dict, got bool"),
    ({"custom_params": {"scale": float("nan")}}, r"sampling_params\['custom_params'\] must be JSON"),
])
def test_sampling_params_are_checked_locally(client, server, params, message):
    before = server.count("POST", "/generate")
    with pytest.raises(ValueError, match=message):
        client.generate([1, 2], sampling_params=params)
    assert server.count("POST", "/generate") == before


def test_choice_watermark_and_custom_params_travel_as_their_json_types(client, server):
    params = {"choice": ["yes", "no"], "watermark": {"gamma": 0.25, "delta": 2.0}, "custom_params": [1, "a", None]}
    client.generate([1, 2], sampling_params=params)
    assert server.fake.bodies[-1]["sampling_params"] == params
    client.generate([1, 2], sampling_params={"custom_params": "any JSON value"})
    assert server.fake.bodies[-1]["sampling_params"] == {"custom_params": "any JSON value"}


def test_model_and_server_info_prefer_the_current_endpoints():
    """`/model_info` and `/server_info` first; a server that only knows the deprecated names still answers."""
    model = {"model_path": "ckpts/new", "weight_version": "7", "is_generation": True, "has_image_understanding": True}
    with LoopbackServer() as new, LoopbackServer() as old:
        new.route("GET", "/model_info", lambda req: Reply.json(model))
        new.route("GET", "/server_info", lambda req: Reply.json({"enable_deterministic_inference": True,
                                                                 "version": "0.5.23", "tp_size": 2}))
        old.route("GET", "/get_model_info", lambda req: Reply.json({**model, "model_path": "ckpts/old"}))
        old.route("GET", "/get_server_info", lambda req: Reply.json({"enable_deterministic_inference": False}))
        with sglang.SGLangClient(new.url) as c:
            info, server_info = c.get_model_info(), c.get_server_info()
        assert info.model_path == "ckpts/new" and [r.path for r in new.requests] == ["/model_info", "/server_info"]
        assert (server_info.deterministic_inference, server_info.version, server_info.raw["tp_size"]) == (
            True, "0.5.23", 2)
        with sglang.SGLangClient(old.url) as c:
            assert c.get_model_info().model_path == "ckpts/old"
            assert c.get_server_info().deterministic_inference is False
        assert [r.path for r in old.requests] == ["/model_info", "/get_model_info", "/server_info",
                                                  "/get_server_info"]
    with LoopbackServer() as router:  # a router that says nothing about its workers
        router.route("GET", "/server_info", lambda req: Reply.json({"workers": 4}))
        with sglang.SGLangClient(router.url, max_retries=0) as c:
            assert c.get_server_info().deterministic_inference is None
            with pytest.raises(http.StatusError, match=r"HTTP 404 from http://127\.0\.0\.1:\d+/get_model_info"):
                c.get_model_info()


def test_input_argument_errors(client):
    with pytest.raises(ValueError, match="exactly one of input_ids and text"):
        client.generate([1], text="hi")
    with pytest.raises(ValueError, match="exactly one of input_ids and text"):
        client.generate()
    with pytest.raises(ValueError, match=r"non-empty 1-D sequence of ints, got shape \(0,\)"):
        client.generate([])
    with pytest.raises(ValueError, match=r"got shape \(1, 2\)"):
        client.generate([[1, 2]])
    with pytest.raises(ValueError, match="dtype float64"):
        client.generate([1.0, 2.0])


@pytest.mark.parametrize("reply, cls, message", [
    (Reply.json({"error": "unknown field `foo`, expected one of `max_new_tokens`"}, status=400),
     sglang.ContractViolation, "unknown field `foo`"),
    (Reply.json({"error": {"message": "logprob_start_len (9) >= prompt length (3)"}}, status=400),
     sglang.InvalidInput, r"logprob_start_len \(9\)"),
    (Reply.json({"object": "error", "message": "JSON decode error", "type": "Bad Request", "param": None,
                 "code": 400}, status=400), sglang.MalformedRequest, "JSON decode error"),
    (Reply.json({"object": "error", "message": "Request timed out", "type": "ServiceUnavailable", "param": None,
                 "code": 503}, status=503, headers=NO_WAIT), sglang.RequestAborted, "Request timed out"),
])
def test_error_shapes_map_to_specific_errors(server, reply, cls, message):
    client = sglang.SGLangClient(server.url, max_retries=1)
    server.fail_next("POST", "/generate", *[reply] * (2 if reply.status == 503 else 1))  # only 503 is retried
    with pytest.raises(cls, match=message) as info:
        client.generate([1, 2, 3])
    assert re.search(message, info.value.message) and info.value.status == reply.status
    assert isinstance(info.value, http.StatusError) and str(server.url) in str(info.value)
    assert client.generate([1, 2, 3]).finish_reason == "length"  # no scripted reply left over


def test_real_server_errors_are_mapped(server):
    client = sglang.SGLangClient(server.url)
    with pytest.raises(sglang.InvalidInput, match=r"logprob_start_len \(9\) >= prompt length \(3\)"):
        client.generate([1, 2, 3], logprob_start_len=9)
    with pytest.raises(sglang.InvalidInput, match="Either text, input_ids or input_embeds"):
        client.generate(text="hello")  # this fake only tokenises input_ids


def test_503_abort_is_retried_then_succeeds_and_429_stays_rate_limited(server, client):
    server.fail_next("POST", "/generate", Reply.json({"object": "error", "message": "timeout", "code": 503},
                                                     status=503, headers=NO_WAIT))
    assert client.generate([4]).finish_reason == "length"
    server.fail_next("POST", "/generate", *[Reply(status=429, headers=NO_WAIT)] * 3)
    with pytest.raises(http.RateLimited):
        client.generate([4])


def test_abort_request_returns_partial_output_with_http_200(server, client):
    server.fake.hold["held-1"] = threading.Event()

    async def run():
        pending = asyncio.ensure_future(client.agenerate([1, 2], rid="held-1", sampling_params={"max_new_tokens": 9}))
        while not any(b.get("rid") == "held-1" for b in server.fake.bodies):
            await asyncio.sleep(0.01)
        await client.aabort_request("held-1")
        return await pending

    result = asyncio.run(run())
    assert result.aborted and result.abort_message == "Aborted" and len(result.output_ids) == 2
    assert any(r.path == "/abort_request" and r.json() == {"rid": "held-1", "abort_all": False}
               for r in server.requests)
    with pytest.raises(ValueError, match="needs a rid, or abort_all=True"):
        client.abort_request()
    client.abort_request(abort_all=True)


@pytest.mark.parametrize("body, message", [
    ({"text": "", "meta_info": {}}, "no 'output_ids' list"),
    ({"output_ids": [1]}, "no 'meta_info' object"),
    ({"output_ids": [1], "meta_info": {"finish_reason": {"type": "eos"}}}, "is not one of"),
    ({"output_ids": [1, 2], "meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[-1.0, 1, None]]}},
     "output_token_logprobs has 1 entries but output_ids has 2"),
    ({"output_ids": [1, 2], "meta_info": {"finish_reason": {"type": "stop"},
                                          "output_token_logprobs": [[-1.0, 1, None], [-1.0, 3, None]]}},
     r"output_token_logprobs\[1\] is for token 3 but output_ids\[1\] = 2"),
    ({"output_ids": [1], "meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[None, 1, None]]}},
     r"output_token_logprobs\[0\] has a null logprob"),
    ([{"output_ids": []}], "answered a list, expected one object"),
])
def test_malformed_generate_responses(body, message):
    with pytest.raises(http.ResponseFormatError, match=message):
        sglang.parse_generate_response("http://h/generate", body, return_logprob=True)


def test_control_endpoints(server, client):
    assert client.health()
    server.fake.healthy = False
    before = server.count("GET", "/health")
    assert not client.health() and server.count("GET", "/health") == before + 1  # probes are not retried
    with pytest.raises(TimeoutError, match=r"http://127\.0\.0\.1:\d+/health not healthy after 0s"):
        client.wait_until_healthy(0.05, poll_s=0.01)
    server.fake.healthy = True
    client.wait_until_healthy(1.0)
    assert "Cache flushed." in client.flush_cache()
    update = client.update_weights_from_disk(UPDATE_REQUEST["model_path"], weight_version="step_12")
    assert update.message.startswith("Succeeded to update model weights") and update.num_paused_requests == 2
    assert server.requests[-1].json() == UPDATE_REQUEST
    info = client.get_model_info()
    assert (info.model_path, info.weight_version, info.has_image_understanding) == (UPDATE_REQUEST["model_path"],
                                                                                    "step_12", True)
    assert client.update_weight_version("step_4") == "step_4"
    assert server.requests[-1].json() == {"new_version": "step_4", "abort_all_requests": True}
    assert client.generate([3]).weight_version == "step_4"
    client.pause_generation("retract")
    assert server.requests[-1].json() == {"mode": "retract"}
    client.continue_generation()
    with pytest.raises(ValueError, match=r"pause mode must be one of \('abort', 'retract', 'in_place'\)"):
        client.pause_generation("freeze")
    with pytest.raises(ValueError, match="needs a model_path"):
        client.update_weights_from_disk("")


def test_control_endpoint_failures(server, client):
    with pytest.raises(sglang.WeightUpdateFailed, match="Failed to get weights iterator: no such dir") as info:
        client.update_weights_from_disk("ckpts/missing")
    assert info.value.status == 400
    server.fail_next("POST", "/flush_cache", Reply.text("Cache not flushed: requests are running", status=400))
    with pytest.raises(sglang.CacheFlushFailed, match="Cache not flushed"):
        client.flush_cache()
    server.fail_next("POST", "/update_weight_version", Reply.json({"success": False, "message": "busy"}, status=400))
    with pytest.raises(sglang.WeightUpdateFailed, match="busy"):
        client.update_weight_version("v9")
    server.fail_next("GET", "/get_model_info", Reply.json({"weight_version": "x"}))
    with pytest.raises(http.ResponseFormatError, match="no 'model_path'"):
        client.get_model_info()


def test_async_control_endpoints(server):
    async def run():
        async with sglang.SGLangClient(server.url) as c:
            healthy = await c.ahealth()
            await c.await_healthy(1.0)
            info = await c.aget_model_info()
            flushed = await c.aflush_cache()
            await c.apause_generation()
            await c.acontinue_generation()
            version = await c.aupdate_weight_version("step_5")
            update = await c.aupdate_weights_from_disk("ckpts/step_6", weight_version="step_6")
            results = await asyncio.gather(*[c.agenerate([i + 1]) for i in range(4)])
            return healthy, info, flushed, version, update, results

    healthy, info, flushed, version, update, results = asyncio.run(run())
    assert healthy and info.model_path and flushed.startswith("Cache flushed.") and version == "step_5"
    assert update.message and {r.weight_version for r in results} == {"step_6"}


@pytest.mark.parametrize("meta, message", [
    ({"output_token_logprobs": "x"}, "meta_info.output_token_logprobs is str, not a list"),
    ({"output_token_logprobs": [[-1.0]]}, r"output_token_logprobs\[0\] is not a \[logprob, token_id, text\] triple"),
])
def test_malformed_logprob_lists(meta, message):
    body = {"output_ids": [1], "meta_info": {"finish_reason": {"type": "stop"}, **meta}}
    with pytest.raises(http.ResponseFormatError, match=message):
        sglang.parse_generate_response("http://h/generate", body, return_logprob=True)


def test_success_false_with_http_200_and_non_object_bodies(server, client):
    server.fail_next("POST", "/update_weights_from_disk", Reply.json({"success": False, "message": "rolled back"}))
    with pytest.raises(sglang.WeightUpdateFailed, match="rolled back"):
        client.update_weights_from_disk("ckpts/step_9")
    server.fail_next("POST", "/pause_generation", Reply.json(["ok"]))
    with pytest.raises(http.ResponseFormatError, match="expected a JSON object, got list"):
        client.pause_generation()
