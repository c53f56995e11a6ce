"""Mind-Bench: the checklist judge's request and its published tolerance of short, long and broken replies, and the
all-checks pass rate (hand-computed)."""
import asyncio
import io
import json

import pytest
from PIL import Image

from ranger_jax.clients import chat, media
from ranger_jax.rewards import mind_bench
from support.eval_services import completion
from support.loopback import LoopbackServer, Reply


def test_parse_results_pads_truncates_and_refuses():
    assert mind_bench.parse_results({"results": [True]}, 3) == [True, False, False]
    assert mind_bench.parse_results({"results": [True, True, False, True]}, 2) == [True, True]
    assert mind_bench.parse_results({"results": ["true", 0]}, 2) == [True, False]
    assert mind_bench.parse_results({}, 2) == [False, False]
    with pytest.raises(ValueError, match="'results' list"):
        mind_bench.parse_results({"results": "all good"}, 2)
    with pytest.raises(ValueError, match=r"results\[1\] must be a boolean"):
        mind_bench.parse_results({"results": [True, "mostly"]}, 2)


def test_aggregate_hand_computed():
    rows = [{"Type": "2_Weather", "ID": 1, "Eval": True}, {"Type": "2_Weather", "ID": 2, "Eval": False},
            {"Type": "2_Weather", "ID": 3, "Eval": True}, {"Type": "5_Edit", "ID": 1, "Eval": False}]
    assert mind_bench.aggregate(rows) == {"overall": {"accuracy": 0.5, "passed": 2, "count": 4},
                                          "2_Weather": {"accuracy": pytest.approx(2 / 3), "passed": 2, "count": 3},
                                          "5_Edit": {"accuracy": 0.0, "passed": 0, "count": 1}}
    assert mind_bench.aggregate([]) == {"overall": {"accuracy": 0.0, "passed": 0, "count": 0}}
    with pytest.raises(ValueError, match=r"row 0 \(ID 7\): Eval must be true or false"):
        mind_bench.aggregate([{"Type": "x", "ID": 7, "Eval": "yes"}])


@pytest.fixture(scope="module")
def server():
    with LoopbackServer() as s:
        yield s


def colour(part):
    return Image.open(io.BytesIO(media.decode_data_url(part["image_url"]["url"])[1])).getpixel((0, 0))


def test_judge_request_layout_and_failures(server):
    bodies, replies = [], [json.dumps({"results": [True, True]}), "```json\n{\"results\": [true]}\n```", "nonsense"]

    def handler(req):
        bodies.append(req.json())
        return Reply.json(completion(replies.pop(0)))

    server.route("POST", "/v1/chat/completions", handler)
    judge = mind_bench.ChecklistJudge(chat.ChatClient(f"{server.url}/v1", model="gemini", max_retries=0))
    generated, reference = Image.new("RGB", (4, 4), (255, 0, 0)), Image.new("RGB", (4, 4), (0, 0, 255))
    checks = ["Town name legible.", "Rain icon visible."]
    verdict = asyncio.run(judge.ajudge(checks, generated, reference))
    assert verdict.passed and verdict.results == (True, True) and verdict.error is None
    system, user = bodies[0]["messages"]
    assert system == {"role": "system", "content": mind_bench.RUBRIC.read_text("utf-8")}
    parts = user["content"]
    assert parts[0]["text"] == "Checklist to Verify:\n1. Town name legible.\n2. Rain icon visible.\n"
    assert [p.get("text") for p in parts[1::2]] == [mind_bench.GENERATED_LABEL, mind_bench.REFERENCE_LABEL]
    assert colour(parts[2])[0] == 255 and colour(parts[4])[2] == 255
    assert bodies[0]["response_format"] == {"type": "json_object"} and bodies[0]["temperature"] == 0.0
    short = asyncio.run(judge.ajudge(checks, generated))  # no reference: only the generated image is sent
    assert short.results == (True, False) and not short.passed and len(bodies[1]["messages"][1]["content"]) == 3
    broken = asyncio.run(judge.ajudge(checks, generated))
    assert broken.results == (False, False) and broken.error.startswith("unreadable judge reply")
    server.fail_next("POST", "/v1/chat/completions", Reply.text("busy", status=503))
    down = asyncio.run(judge.ajudge(checks, generated))
    assert down.results == (False, False) and down.error.startswith("judge endpoint failed: HTTP 503")
    empty = asyncio.run(judge.ajudge([], generated))
    assert not empty.passed and empty.error == "the item has an empty checklist" and len(bodies) == 3
