"""WISE: the published score parser, WiScore per prompt and per category (hand-computed), and the judge's request
against a loopback chat server."""
import asyncio

import pytest
from PIL import Image

from ranger_jax.clients import chat
from ranger_jax.rewards import wise
from support.eval_services import completion
from support.loopback import LoopbackServer, Reply


@pytest.mark.parametrize("text, expected", [
    ("Consistency: 2\nRealism: 1\nAesthetic Quality: 0", (2, 1, 0)),
    ("**Consistency**: 1\n**Realism** 2\n**Aesthetic Quality**:1", (1, 2, 1)),  # bold, no colon
    ("Consistency: 1\nRealism: 1\nAesthetic Quality：1", (1, 1, wise.FAILED)),  # the pattern's colons are ASCII
    ("consistency 0, REALISM: 0, aesthetic quality: 2", (0, 0, 2)),
    ("Consistency: 1\nRealism: 1\nConsistency: 2\nAesthetic Quality: 1", (2, 1, 1)),  # a later mention wins
    ("Consistency: 2\nRealism: 2", (2, 2, wise.FAILED)),  # a missing score is 999, as published
    ("I cannot grade this.", (wise.FAILED,) * 3),
])
def test_extract_scores_follows_the_published_pattern(text, expected):
    scores = wise.extract_scores(text)
    assert tuple(scores[k] for k in wise.SCORE_KEYS) == expected


def test_wiscore_and_categories_by_published_ranges():
    assert wise.wiscore(2, 2, 2) == pytest.approx(1.0)
    assert wise.wiscore(2, 1, 0) == pytest.approx((1.4 + 0.2) / 2)
    assert [wise.category_of(i) for i in (1, 400, 401, 567, 568, 700, 701, 800, 801, 900, 901, 1000, 1001, 0)] == [
        "CULTURE", "CULTURE", "TIME", "TIME", "SPACE", "SPACE", "BIOLOGY", "BIOLOGY", "PHYSICS", "PHYSICS",
        "CHEMISTRY", "CHEMISTRY", None, None]


def row(prompt_id, c, r, a):
    return {"prompt_id": prompt_id, "Subcategory": "x", "consistency": c, "realism": r, "aesthetic_quality": a}


ROWS = [row(1, 2, 2, 2), row(2, 1, 0, 1), row(401, 2, 1, 0), row(568, 0, 2, 2), row(701, 1, 1, 1),
        row(801, 2, 0, 0), row(901, 0, 0, 0)]
# hand-computed WiScores: 1: 1.0; 2: (.7 + .1)/2 = .4 → CULTURE .7; TIME (1.4 + .2)/2 = .8;
# SPACE (.4 + .2)/2 = .3; BIOLOGY (.7 + .2 + .1)/2 = .5; PHYSICS 1.4/2 = .7; CHEMISTRY 0
# overall = .4·.7 + .167·.8 + .133·.3 + .1·.5 + .1·.7 + .1·0 = .28 + .1336 + .0399 + .05 + .07 = .5735
CATEGORY_SCORES = {"CULTURE": 0.7, "TIME": 0.8, "SPACE": 0.3, "BIOLOGY": 0.5, "PHYSICS": 0.7, "CHEMISTRY": 0.0}


def test_aggregate_hand_computed():
    result = wise.aggregate(ROWS)
    assert {c: result[c]["wiscore"] for c in wise.CATEGORIES} == pytest.approx(CATEGORY_SCORES)
    assert result["CULTURE"]["count"] == 2
    assert result["overall"] == {"wiscore": pytest.approx(0.5735), "count": 7}
    assert result["valid"] and result["complete"] and result["missing_ids"] == [] == result["failed_ids"]


def test_a_999_invalidates_and_a_missing_prompt_makes_the_run_incomplete(caplog):
    failed = wise.aggregate([*ROWS[:-1], row(901, 2, wise.FAILED, 1)])
    assert not failed["valid"] and failed["failed_ids"] == [901] and failed["overall"]["wiscore"] is None
    assert "CHEMISTRY" not in failed and failed["PHYSICS"]["wiscore"] == pytest.approx(0.7)
    incomplete = wise.aggregate(ROWS[1:], expected_ids=[r["prompt_id"] for r in ROWS])
    assert not incomplete["complete"] and incomplete["missing_ids"] == [1]
    assert incomplete["overall"]["wiscore"] is None and incomplete["CULTURE"]["wiscore"] == pytest.approx(0.4)
    no_space = wise.aggregate([r for r in ROWS if r["prompt_id"] != 568])
    assert no_space["complete"] and no_space["overall"]["wiscore"] is None  # a category without prompts
    outside = wise.aggregate([*ROWS, row(1500, 2, 2, 2)])
    assert outside["overall"]["wiscore"] == pytest.approx(0.5735) and "outside every category" in caplog.text


def test_aggregate_names_a_bad_row():
    with pytest.raises(ValueError, match=r"WISE score row 1 \(prompt_id 2\): realism must be a number"):
        wise.aggregate([row(1, 1, 1, 1), row(2, 1, "high", 1)])
    with pytest.raises(ValueError, match="row 0: prompt_id must be an integer"):
        wise.aggregate([row("7", 1, 1, 1)])


@pytest.fixture(scope="module")
def server():
    with LoopbackServer() as s:
        yield s


def test_judge_request_and_failures(server, tmp_path):
    bodies, replies = [], ["**Consistency**: 1\n**Realism**: 2\n**Aesthetic Quality**: 1", "Consistency: 2"]

    def handler(req):
        bodies.append(req.json())
        return Reply.json(completion(replies.pop(0)))

    server.route("POST", "/v1/chat/completions", handler)
    judge = wise.WiseJudge(chat.ChatClient(f"{server.url}/v1", model="gpt-4o", max_retries=0))
    image = Image.new("RGB", (8, 8), "red")
    verdict = asyncio.run(judge.ajudge("A lantern", "Round honey cakes", image))
    assert (verdict.consistency, verdict.realism, verdict.aesthetic_quality) == (1, 2, 1) and not verdict.failed
    assert verdict.wiscore == pytest.approx((0.7 + 0.4 + 0.1) / 2) and verdict.error is None
    system, user = bodies[0]["messages"]
    assert system["content"][0]["text"] == wise.SYSTEM_PROMPT
    text, picture = user["content"]
    assert 'PROMPT: "A lantern"\nEXPLANATION: "Round honey cakes"' in text["text"]
    assert picture["image_url"]["url"].startswith("data:image/png;base64,")
    assert bodies[0]["temperature"] == 0.0 and bodies[0]["max_completion_tokens"] == wise.MAX_TOKENS
    partial = asyncio.run(judge.ajudge("p", "e", image))
    assert partial.failed and partial.wiscore is None
    assert partial.error == "the reply has no realism, aesthetic_quality score"
    server.fail_next("POST", "/v1/chat/completions", Reply.text("busy", status=500))
    down = asyncio.run(judge.ajudge("p", "e", image))
    assert (down.consistency, down.realism, down.aesthetic_quality) == (wise.FAILED,) * 3
    assert down.error.startswith("judge endpoint failed: HTTP 500")


def test_template_file_needs_both_slots(tmp_path):
    (tmp_path / "mine.md").write_text("Grade {prompt} strictly.")
    with pytest.raises(ValueError, match=r"lacks the slots \['\{explanation\}'\]"):
        wise.load_template(tmp_path / "mine.md")
    (tmp_path / "ok.md").write_text("P={prompt} E={explanation}")
    assert wise.load_template(tmp_path / "ok.md") == "P={prompt} E={explanation}"
