"""ChatClient against a loopback OpenAI-compatible `/v1/chat/completions` server."""
import asyncio
import copy
import io
import json

import pytest
from PIL import Image

from ranger_jax.clients import chat, http, media
from support import fixtures
from support.loopback import LoopbackServer, Reply

FIXTURE = fixtures.load("openai_chat_judge_response")
NO_WAIT = {"Retry-After": "0"}
SCHEMA = chat.json_schema_format("verdict", {"type": "object", "properties": {"ok": {"type": "boolean"}}})


def completion(content="{}", finish_reason="stop", tool_calls=None):
    body = copy.deepcopy(FIXTURE)
    body["choices"][0]["message"]["content"] = content
    body["choices"][0]["finish_reason"] = finish_reason
    if tool_calls is not None:
        body["choices"][0]["message"]["tool_calls"] = tool_calls
    return body


class ChatServer:
    """Answers like SGLang's OpenAI endpoint; refuses the response_format types in `reject` with HTTP 400."""

    def __init__(self):
        self.reject: set[str] = set()
        self.replies: list[dict] = []
        self.bodies: list[dict] = []

    def __call__(self, req):
        body = req.json()
        self.bodies.append(body)
        kind = (body.get("response_format") or {}).get("type")
        if kind in self.reject:
            return Reply.json({"object": "error", "message": f"response_format {kind} is not supported",
                               "type": "Bad Request", "param": None, "code": 400}, status=400)
        return Reply.json(self.replies.pop(0) if self.replies else FIXTURE)


@pytest.fixture(scope="module")
def loopback():
    with LoopbackServer() as s:
        yield s


@pytest.fixture()
def server(loopback):
    """The module's server with a fresh handler; `calls()` counts requests made during this test."""
    loopback.handler = ChatServer()
    loopback.route("POST", "/v1/chat/completions", loopback.handler)
    start = loopback.count()
    loopback.calls = lambda: loopback.count() - start
    return loopback


def client_for(server, **kwargs):
    return chat.ChatClient(f"{server.url}/v1", model="judge-model", max_retries=2, **kwargs)


def test_parses_the_fixture_and_sends_the_request(server):
    with client_for(server, api_key="sk-test", chat_template_kwargs={"enable_thinking": False}) as client:
        result = client.complete([{"role": "user", "content": "hi"}], max_tokens=64, extra={"seed": 7})
    assert result.finish_reason == "stop" and result.model == "Qwen/Qwen3-VL-32B-Instruct"
    assert result.usage["prompt_tokens"] == 2310 and result.tool_calls == ()
    assert result.json()["visual_correctness"] == 0.5 and result.response_format is None
    sent = server.handler.bodies[-1]
    assert sent == {"model": "judge-model", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.0,
                    "max_completion_tokens": 64, "chat_template_kwargs": {"enable_thinking": False}, "seed": 7}
    assert server.requests[-1].headers["Authorization"] == "Bearer sk-test"


def test_json_schema_400_falls_back_to_json_object_and_remembers(server):
    server.handler.reject = {"json_schema"}
    client = client_for(server)
    result = client.complete([{"role": "user", "content": "x"}], response_format=SCHEMA)
    assert result.response_format == "json_object"
    assert [(b.get("response_format") or {}).get("type") for b in server.handler.bodies] == ["json_schema", "json_object"]
    client.complete([{"role": "user", "content": "y"}], response_format=SCHEMA)
    assert server.handler.bodies[-1]["response_format"] == {"type": "json_object"}  # no second 400
    assert server.calls() == 3


def test_falls_back_to_plain_text_and_lenient_json(server):
    server.handler.reject = {"json_schema", "json_object"}
    server.handler.replies = [completion('<think>hmm</think>Sure! ```json\n{"ok": true,}\n```')]
    result = client_for(server).complete([{"role": "user", "content": "x"}], response_format=SCHEMA)
    assert result.response_format is None and "response_format" not in server.handler.bodies[-1]
    assert result.json() == {"ok": True}


def test_a_400_that_is_not_about_the_format_is_raised(server):
    server.handler.reject = {"json_schema", "json_object", None}
    client = client_for(server)
    with pytest.raises(http.StatusError, match="HTTP 400 .*response_format None is not supported"):
        client.complete([{"role": "user", "content": "x"}], response_format=SCHEMA)
    assert server.calls() == 3
    # that request failed on every rung, so nothing was learnt: the next one still asks for json_schema first
    server.handler.reject = set()
    assert client.complete([{"role": "user", "content": "y"}], response_format=SCHEMA).response_format == "json_schema"
    assert server.calls() == 4


def test_retries_429_and_5xx_then_raises_with_url(server):
    path = "/v1/chat/completions"
    server.fail_next("POST", path, Reply(status=429, headers=NO_WAIT), Reply(status=502, headers=NO_WAIT))
    assert client_for(server).complete([{"role": "user", "content": "x"}]).content
    server.fail_next("POST", path, *[Reply.json({"object": "error", "message": "overloaded", "code": 503},
                                                status=503, headers=NO_WAIT)] * 3)
    with pytest.raises(http.StatusError, match=r"HTTP 503 from http://127\.0\.0\.1:\d+/v1/chat/completions"):
        client_for(server).complete([{"role": "user", "content": "x"}])


def test_timeout_raises_transport_failed(server):
    server.fail_next("POST", "/v1/chat/completions", Reply.json(FIXTURE, delay_s=0.6))
    client = chat.ChatClient(f"{server.url}/v1", model="m", timeout=0.2, max_retries=0)
    with pytest.raises(http.TransportFailed, match="ReadTimeout"):
        client.complete([{"role": "user", "content": "x"}])


def test_cache_replays_exactly_without_the_server(tmp_path):
    handler = ChatServer()
    handler.reject = {"json_schema"}
    messages = [{"role": "user", "content": [chat.text_part("grade"), chat.image_part(Image.new("RGB", (8, 8)))]}]
    with LoopbackServer() as s:
        s.route("POST", "/v1/chat/completions", handler)
        live = chat.ChatClient(f"{s.url}/v1", model="m", cache_dir=tmp_path).complete(messages, response_format=SCHEMA)
        dead_url = s.url
    replay = chat.ChatClient(f"{dead_url}/v1", model="m", cache_dir=tmp_path, max_retries=0)
    assert replay.complete(messages, response_format=SCHEMA) == live
    assert asyncio.run(replay.acomplete(messages, response_format=SCHEMA)) == live
    with pytest.raises(http.TransportFailed):  # a different request is a miss
        replay.complete(messages, response_format=SCHEMA, temperature=0.5)


def test_tool_calls_are_parsed(server):
    server.handler.replies = [completion("", "tool_calls", [
        {"id": "call_1", "type": "function", "function": {"name": "image_search", "arguments": '{"query": "red light"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "crop_image", "arguments": {"img_id": "IMG_001"}}},
    ])]
    result = client_for(server).complete([{"role": "user", "content": "x"}],
                                         tools=[{"type": "function", "function": {"name": "image_search"}}])
    assert [c.name for c in result.tool_calls] == ["image_search", "crop_image"]
    assert result.tool_calls[0].parsed_arguments() == {"query": "red light"}
    assert result.tool_calls[1].parsed_arguments() == {"img_id": "IMG_001"}
    assert server.handler.bodies[-1]["tools"][0]["function"]["name"] == "image_search"
    with pytest.raises(chat.ChatFormatError, match="arguments are not a JSON object"):
        chat.ToolCall("c", "f", "[1, 2]").parsed_arguments()


def test_async_complete_and_concurrency(server):
    client = client_for(server, max_concurrency=2)

    async def run():
        results = await asyncio.gather(*[client.acomplete([{"role": "user", "content": str(i)}]) for i in range(5)])
        await client.aclose()
        return results

    assert len(asyncio.run(run())) == 5 and server.calls() == 5


def test_malformed_bodies_name_the_problem(server):
    server.handler.replies = [{"error": {"message": "model overloaded"}}, {"choices": [{"index": 0}]}]
    client = client_for(server)
    with pytest.raises(http.ResponseFormatError, match="no choices in body; server said: model overloaded"):
        client.complete([{"role": "user", "content": "x"}])
    with pytest.raises(http.ResponseFormatError, match=r"choices\[0\] has no 'message' object"):
        client.complete([{"role": "user", "content": "x"}])


def test_argument_errors():
    client = chat.ChatClient("http://127.0.0.1:9/v1", model="m")
    with pytest.raises(ValueError, match="messages must be a non-empty list"):
        client.complete([])
    with pytest.raises(ValueError, match=r"messages\[0\] must be a dict with a 'role'"):
        client.complete([{"content": "x"}])
    with pytest.raises(ValueError, match="extra key 'temperature' clashes"):
        client.complete([{"role": "user", "content": "x"}], extra={"temperature": 1})
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        client.complete([{"role": "user", "content": "x"}], max_tokens=0)
    with pytest.raises(ValueError, match="json_schema name must be 1-64 chars"):
        chat.json_schema_format("bad name", {})
    with pytest.raises(ValueError, match="detail must be"):
        chat.image_part(Image.new("RGB", (1, 1)), detail="ultra")


def test_image_part_is_a_capped_jpeg_on_white():
    part = chat.image_part(Image.new("RGBA", (8192, 40), (0, 0, 0, 0)), detail="low")
    assert part["type"] == "image_url" and part["image_url"]["detail"] == "low"
    mime, data = media.decode_data_url(part["image_url"]["url"])
    image = Image.open(io.BytesIO(data))
    assert mime == "image/jpeg" and image.size == (4096, 20) and image.getpixel((10, 10)) == (255, 255, 255)


@pytest.mark.parametrize("text, value", [
    ('{"a": 1}', {"a": 1}),
    ('<think>{"no": 1}</think>\n{"a": 2}', {"a": 2}),
    ('Here it is:\n```json\n{"a": 3}\n```\nthanks', {"a": 3}),
    ("The verdict is {'a': 4, 'b': \"}\"} and more", {"a": 4, "b": "}"}),
    ("[1, 2, 3]", [1, 2, 3]),
])
def test_extract_json(text, value):
    assert chat.extract_json(text) == value


def test_extract_json_failure_quotes_the_text():
    with pytest.raises(chat.ChatFormatError, match="no JSON value in model reply: 'I cannot judge this'"):
        chat.extract_json("I cannot judge this")


@pytest.mark.parametrize("body, message", [
    ([1], "body is list, not an object"),
    ({"choices": [{"message": {"content": 5}}]}, r"choices\[0\].message.content is int, not a string"),
    ({"choices": [{"message": {"content": "", "tool_calls": [{"id": "a"}]}}]},
     r"choices\[0\].message.tool_calls\[0\] has no 'function' object"),
    ({"choices": [{"message": {"content": "", "tool_calls": [{"function": {"arguments": "{}"}}]}}]},
     r"tool_calls\[0\].function has no 'name'"),
])
def test_parse_completion_errors(body, message):
    with pytest.raises(http.ResponseFormatError, match=message):
        chat.parse_completion("http://h/v1/chat/completions", body, None)


def test_content_parts_are_joined():
    body = {"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}]}
    assert chat.parse_completion("u", body, "text").content == "ab"


def test_cache_entries_key_images_by_digest(tmp_path, server):
    big = Image.effect_noise((256, 256), 64).convert("RGB")
    messages = [{"role": "user", "content": [chat.text_part("grade"), chat.image_part(big, fmt="PNG")]}]
    client = client_for(server, cache_dir=tmp_path)
    first = client.complete(messages)
    (entry,) = list(tmp_path.rglob("*.json"))
    stored = json.loads(entry.read_text())["request"]
    assert stored["messages"][0]["content"][1]["image_url"]["url"].startswith("sha256:")
    assert entry.stat().st_size < 10_000 and client.complete(messages) == first and server.calls() == 1
    other = [{"role": "user", "content": [chat.text_part("grade"), chat.image_part(big.rotate(90), fmt="PNG")]}]
    client.complete(other)
    assert server.calls() == 2  # a different image is a different key
