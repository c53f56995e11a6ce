"""VLM judges (K-Score, text reward, Savanna) and the live reward flow against a loopback chat server."""
import asyncio
import io
import json

import pytest
from PIL import Image

from ranger_jax.clients import chat, compositor, images, media
from ranger_jax.env import core
from ranger_jax.rewards import combine, judge, kscore, live, savanna, text_reward
from support.loopback import LoopbackServer, Reply

KSCORE_REPLY = {"rationale": "Constraints: red tower.", "faithfulness": 1, "visual_correctness": 0.5,
                "text_accuracy": 0, "aesthetics": 0.5, "text_accuracy_na": False}
TEXT_REPLY = {"rationale": "Constraints: red tower.", "score": 0.8}


def completion(content: str):
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


class JudgeServer:
    """Replies by rubric: queued contents per rubric name (first words of the system prompt), else defaults."""

    def __init__(self):
        self.queues: dict[str, list[str]] = {}
        self.defaults = {"kscore": json.dumps(KSCORE_REPLY), "text_reward": json.dumps(TEXT_REPLY)}
        self.reject_schema = False
        self.bodies: list[dict] = []

    @staticmethod
    def rubric_of(body):
        system = body["messages"][0]["content"]
        for name in judge.RUBRICS:
            if system == judge.load_rubric(name):
                return name
        return "custom"

    def __call__(self, req):
        body = req.json()
        self.bodies.append(body)
        if self.reject_schema and body.get("response_format", {}).get("type") == "json_schema":
            return Reply.json({"object": "error", "message": "no json_schema", "code": 400}, status=400)
        name = self.rubric_of(body)
        queue = self.queues.get(name) or []
        content = queue.pop(0) if queue else self.defaults.get(name, "{}")
        return Reply.json(completion(content))


@pytest.fixture(scope="module")
def loopback():
    with LoopbackServer() as s:
        yield s


@pytest.fixture()
def server(loopback):
    loopback.judge = JudgeServer()
    loopback.route("POST", "/v1/chat/completions", loopback.judge)
    start = loopback.count()
    loopback.calls = lambda: loopback.count() - start
    return loopback


def client(server, **kwargs):
    return chat.ChatClient(f"{server.url}/v1", model="judge", max_retries=0, **kwargs)


def colour_of(part):
    return Image.open(io.BytesIO(media.decode_data_url(part["image_url"]["url"])[1])).getpixel((0, 0))


def test_kscore_judge_request_and_verdict(server):
    verdict = judge.KScoreJudge(client(server)).score("A red lighthouse", Image.new("RGB", (8, 8), "red"),
                                                       Image.new("RGBA", (8, 8), (0, 0, 255, 255)), sample_id="7")
    assert isinstance(verdict.value, kscore.KScore) and verdict.value.overall == round(0.1 + 0.2 + 0 + 0.05, 2)
    assert verdict.attempts == 1 and verdict.usage["total_tokens"] == 15
    body = server.judge.bodies[-1]
    assert body["messages"][0] == {"role": "system", "content": judge.load_rubric("kscore")}
    text, generated, truth = body["messages"][1]["content"]
    assert text["text"].startswith("Sample ID: 7\nRequest: A red lighthouse")
    assert generated["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert colour_of(generated)[0] > 240 and colour_of(truth)[2] > 240  # Image 1 = generated, Image 2 = GT
    assert body["response_format"]["json_schema"]["name"] == "kscore" and body["temperature"] == 0.0
    assert body["max_completion_tokens"] == judge.DEFAULT_MAX_TOKENS


def test_schema_fallback_and_retry_on_unusable_output(server):
    server.judge.reject_schema = True
    server.judge.queues["kscore"] = ["I think it is fine.", json.dumps({**KSCORE_REPLY, "faithfulness": "high"}),
                                     "```json\n" + json.dumps(KSCORE_REPLY) + "\n```"]
    verdict = judge.KScoreJudge(client(server)).score("p", Image.new("RGB", (2, 2)), Image.new("RGB", (2, 2)))
    assert verdict.attempts == 3 and verdict.value.visual_correctness == 0.5
    seeds = [b.get("seed") for b in server.judge.bodies if b.get("response_format", {}).get("type") != "json_schema"]
    assert seeds == [None, 1, 2]  # each retry asks with its own seed, so a cached run replays exactly


def test_unusable_output_and_dead_endpoint_raise_judge_error(server):
    server.judge.queues["kscore"] = ["nope"] * 2
    with pytest.raises(judge.JudgeError, match=r"no usable verdict from http://.*after 2 attempts: no JSON value"):
        judge.KScoreJudge(client(server), max_attempts=2).score("p", Image.new("RGB", (2, 2)), Image.new("RGB", (2, 2)))
    server.fail_next("POST", "/v1/chat/completions", Reply.text("Internal Server Error", status=500))
    with pytest.raises(judge.JudgeError, match="judge endpoint .* failed: HTTP 500"):
        judge.KScoreJudge(client(server)).score("p", Image.new("RGB", (2, 2)), Image.new("RGB", (2, 2)))


def test_user_rubric_file_and_rubric_errors(server, tmp_path):
    custom = tmp_path / "my_rubric.md"
    custom.write_text("Grade strictly. Reply in JSON.")
    server.judge.defaults["custom"] = json.dumps(KSCORE_REPLY)
    judge.KScoreJudge(client(server), prompt_path=custom).score("p", Image.new("RGB", (2, 2)), Image.new("RGB", (2, 2)))
    assert server.judge.bodies[-1]["messages"][0]["content"] == "Grade strictly. Reply in JSON."
    with pytest.raises(ValueError, match=r"unknown rubric 'kscor'; known: \('kscore'"):
        judge.load_rubric("kscor")
    with pytest.raises(FileNotFoundError, match="rubric file .*missing.md does not exist"):
        judge.load_rubric(tmp_path / "missing.md")
    (tmp_path / "empty.md").write_text("  \n")
    with pytest.raises(ValueError, match="empty.md is empty"):
        judge.load_rubric(tmp_path / "empty.md")
    for name in judge.RUBRICS:
        assert "Constraints:" in judge.load_rubric(name) and "JSON" in judge.load_rubric(name)


def test_text_reward_judge_sees_gt_only_and_answer_as_text(server):
    ans = core.Answer("A red lighthouse at dusk", (core.AnswerRef("IMG_002", "the tower"),))
    facts = {"IMG_002": {"title": "Halvorsen Point Light", "page_url": "https://h.example/p", "url": None}}
    verdict = text_reward.TextRewardJudge(client(server)).score("Draw it", Image.new("RGB", (4, 4), "green"), ans, facts)
    assert verdict.value.score == 0.75 and verdict.value.raw_score == 0.8
    content = server.judge.bodies[-1]["messages"][1]["content"]
    assert [p["type"] for p in content] == ["text", "image_url"]  # the GT only, no reference pixels
    rendered = json.loads(content[0]["text"].split("Agent answer:\n", 1)[1])
    assert rendered == {"gen_prompt": "A red lighthouse at dusk", "reference_images": [
        {"img_id": "IMG_002", "title": "Halvorsen Point Light", "page_url": "https://h.example/p", "note": "the tower"}]}


@pytest.mark.parametrize("raw, snapped", [(0.8, 0.75), (0.1, 0.0), (0.125, 0.0), (0.13, 0.25), (0.62, 0.5),
                                          (0.63, 0.75), (1.4, 1.0), (-3, 0.0), ("0.5", 0.5)])
def test_text_reward_snapping(raw, snapped):
    assert text_reward.parse_judge_output({"score": raw, "rationale": "r"}).score == snapped


def test_text_reward_output_errors():
    with pytest.raises(ValueError, match="lacks 'score'"):
        text_reward.parse_judge_output({"rationale": "r"})
    with pytest.raises(ValueError, match="must be a JSON object"):
        text_reward.parse_judge_output("0.5")


def test_savanna_judges(server):
    server.judge.queues["savanna_search"] = [json.dumps({"rationale": "Constraints: x", "passed": "true",
                                                         "matching_reference": "IMG_003"})]
    refs = {"IMG_001": Image.new("RGB", (2, 2)), "IMG_003": Image.new("RGB", (2, 2))}
    verdict = savanna.SearchJudge(client(server)).judge_search("Draw the new X", "the 2026 edition of X", refs,
                                                               answer_text="{...}", ground_truth=[Image.new("RGB", (2, 2))])
    assert verdict.value.passed and verdict.value.matching_reference == "IMG_003"
    text = server.judge.bodies[-1]["messages"][1]["content"][0]["text"]
    assert "3. selected reference IMG_003" in text and len(server.judge.bodies[-1]["messages"][1]["content"]) == 4
    with pytest.raises(ValueError, match="at least one selected reference"):
        savanna.SearchJudge(client(server)).judge_search("p", "t", {})

    server.judge.queues["savanna_generation"] = [json.dumps({
        "rationale": "Constraints: x", "identity_tier": "Exact",
        "context": [{"criterion": "on a beach", "satisfied": True}, {"criterion": "at night", "satisfied": False}]})]
    gen = savanna.GenerationJudge(client(server)).judge_generation(
        "Draw X on a beach at night with a dog", "X", Image.new("RGB", (2, 2)),
        criteria=["on a beach", "at night", "with a dog"])
    assert gen.value.context == (("on a beach", True), ("at night", False), ("with a dog", False))
    assert gen.value.score == pytest.approx(1 / 3) and not gen.value.passed


def test_savanna_parsers():
    extra = savanna.parse_generation_output({"identity_tier": "exact", "context": [
        {"criterion": "a", "satisfied": True}, {"criterion": "b", "satisfied": False}]}, criteria=["a"])
    assert extra.context == (("a", True),) and extra.passed  # extras beyond the asked criteria are dropped
    assert savanna.parse_generation_output({"identity_tier": "partial", "context": []}).score == 0.5
    assert savanna.parse_generation_output({"identity_tier": "exact", "context": []}).passed
    with pytest.raises(ValueError, match=r"identity_tier 'same' is not one of \['exact', 'partial', 'wrong'\]"):
        savanna.parse_generation_output({"identity_tier": "same"})
    with pytest.raises(ValueError, match=r"context\[0\] must be an object with 'satisfied'"):
        savanna.parse_generation_output({"identity_tier": "wrong", "context": ["x"]})
    with pytest.raises(ValueError, match="must be an object with 'passed'"):
        savanna.parse_search_output({"pass": True})


@pytest.fixture()
def episode(tmp_path):
    records = {}
    for i, colour in enumerate(["red", "blue"], start=1):
        path = tmp_path / f"img{i}.png"
        Image.new("RGB", (16, 16), colour).save(path)
        records[f"IMG_00{i}"] = core.ImageRecord(f"IMG_00{i}", str(path), "0" * 64, 16, 16, title=f"title {i}")
    return live.Episode(question="Draw the red tower", ground_truth=Image.new("RGB", (16, 16), "red"),
                        answer=core.Answer("A red tower", (core.AnswerRef("IMG_001", "tower"),)),
                        termination=core.ANSWER, images=records)


def test_live_reward_full_flow(server, episode):
    c = client(server)
    reward = live.LiveReward(compositor.CompositorGenerator(size=(64, 64)), image_judge=judge.KScoreJudge(c),
                             text_judge=text_reward.TextRewardJudge(c), alpha=0.5, seed=3)
    breakdown, generation = reward.score(episode)
    assert generation.ok and generation.request["seed"] == 3 and generation.request["num_references"] == 1
    assert breakdown.image_reward == 0.35 and breakdown.text_reward == 0.75
    assert breakdown.reward == pytest.approx(0.5 * 0.35 + 0.5 * 0.75) and breakdown.zero_reason is None
    assert breakdown.components["kscore"]["visual_correctness"] == 0.5
    assert breakdown.components["text_reward"]["raw_score"] == 0.8
    k_body = next(b for b in server.judge.bodies if JudgeServer.rubric_of(b) == "kscore")
    assert "Request: Draw the red tower" in k_body["messages"][1]["content"][0]["text"]  # the ORIGINAL question


def test_live_reward_zeros(server, episode, tmp_path):
    c = client(server)
    reward = live.LiveReward(compositor.CompositorGenerator(size=(32, 32)), image_judge=judge.KScoreJudge(c),
                             text_judge=text_reward.TextRewardJudge(c), alpha=0.5)
    repeated = live.Episode(**{**episode.__dict__, "termination": core.REPEATED_RESPONSE})
    breakdown, generation = reward.score(repeated)
    assert breakdown.zero_reason == combine.TERMINATED and generation is None and server.calls() == 0

    gone = dict(episode.images)
    gone["IMG_001"] = core.ImageRecord("IMG_001", str(tmp_path / "deleted.png"), "0" * 64, 1, 1)
    breakdown, _ = reward.score(live.Episode(**{**episode.__dict__, "images": gone}))
    assert breakdown.zero_reason == combine.REFERENCE_COUNT

    no_text = live.LiveReward(compositor.CompositorGenerator(), image_judge=judge.KScoreJudge(c), text_judge=None)
    assert no_text.score(episode)[0].zero_reason == combine.NO_JUDGE
    image_only = live.LiveReward(compositor.CompositorGenerator(), image_judge=judge.KScoreJudge(c), text_judge=None,
                                 alpha=0.0)
    assert image_only.score(episode)[0].reward == 0.35

    server.judge.queues["kscore"] = ["garbage"] * 3
    breakdown, generation = reward.score(episode)
    assert breakdown.zero_reason == combine.JUDGE_FAILED and "no usable verdict" in breakdown.detail and generation.ok


def test_live_reward_records_a_failed_generation(server, episode):
    server.route("POST", "/v1/images/edits", lambda req: Reply.text("Internal Server Error", status=500))
    generator = images.SGLangImageGenerator(server.url, max_retries=0)
    reward = live.LiveReward(generator, image_judge=judge.KScoreJudge(client(server)), text_judge=None, alpha=0.0)
    breakdown, generation = asyncio.run(reward.ascore(episode))
    assert breakdown.zero_reason == combine.GENERATION_FAILED and "HTTP 500" in breakdown.detail
    assert not generation.ok and "Internal Server Error" in generation.error
    assert server.calls() == 1  # the generation request only: no judge call after a failure


def test_judge_argument_errors(server):
    with pytest.raises(ValueError, match="max_attempts must be >= 1, got 0"):
        judge.KScoreJudge(client(server), max_attempts=0)
    with pytest.raises(ValueError, match="context must be a list, got str"):
        savanna.parse_generation_output({"identity_tier": "exact", "context": "all good"})
