import asyncio

import pytest
from support.loopback import LoopbackServer, Reply

from ranger_jax.clients import chat, http
from ranger_jax.env import summarizer
from ranger_jax.env.backends import base


def test_split_chunks_cover_the_text_with_overlap():
    text = "".join(chr(ord("a") + i % 26) for i in range(10_000))
    assert summarizer.split_chunks(text, 20_000) == [text]
    chunks = summarizer.split_chunks(text, 3_000, overlap_chars=500)
    assert all(len(c) <= 3_000 for c in chunks) and chunks[0] == text[:3_000]
    assert chunks[1].startswith(text[2_500:2_600])  # 500 characters of overlap
    assert text.endswith(chunks[-1]) and len(chunks) == 4


@pytest.fixture(scope="module")
def server():
    def reply(request):
        user = request.json()["messages"][1]["content"]
        return Reply.json({"choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": f" saw {len(user)} chars "}}]})

    with LoopbackServer() as srv:
        srv.route("POST", "/v1/chat/completions", reply)
        yield srv


def reader(server, chunk_chars):
    client = chat.ChatClient(f"{server.url}/v1", model="m", max_retries=0)
    return summarizer.PageSummarizer(client, max_tokens=64, chunk_chars=chunk_chars)


def test_short_page_one_answer_long_page_parts(server):
    page = base.Page(url="https://x.org/a", title="T", text="x" * 9_000, date="2025-01-02")
    answer = asyncio.run(reader(server, 20_000).answer(page, "what?"))
    assert answer.startswith("saw ") and "part" not in answer
    request = server.requests[-1].json()
    assert request["temperature"] == 0.0 and request["max_completion_tokens"] == 64
    assert request["messages"][1]["content"].startswith("Question: what?\n\nPage: https://x.org/a\nTitle: T\nDate: ")
    parts = asyncio.run(reader(server, 4_000).answer(page, "what?"))
    assert parts.count("result part ") == 3 and parts.startswith("result part 1:\nsaw ")


def test_server_errors_propagate_as_client_errors(server):
    server.fail_next("POST", "/v1/chat/completions", Reply(status=500, body=b"down"))
    page = base.Page(url="https://x.org/a", title="", text="hello")
    with pytest.raises(http.StatusError, match="HTTP 500"):
        asyncio.run(reader(server, 1_000).answer(page, "q"))
