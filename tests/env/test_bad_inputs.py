"""Hostile policy turns through `ToolEnv.step`: each one becomes an explanatory observation, never an exception,
and the state it was given is left untouched."""

import json
import pickle
import time

import pytest

from ranger_jax import env
from ranger_jax.env import config as config_lib
from ranger_jax.env import parsing, tool_env
from ranger_jax.env.backends import base

TASK = env.Task("t1", "Draw the new red lighthouse.", metadata={"today": "2025-12-01"})


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def raw_call(arguments_json, name="crop_image"):
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments_json}}}</tool_call>'


@pytest.fixture(scope="module")
def tool_env_with_image(memory_backend, corpus):
    hits = corpus["hits"]
    backend = memory_backend(images={"tower": hits[:2]}, blobs=corpus["blobs"],
                             text={"tower": [base.TextHit("Tower", "https://a.org/t", "red tower")]})
    with tool_env.ToolEnv(backend, config_lib.EnvConfig()) as e:
        state, _ = e.step(e.reset(TASK), call("image_search", query="tower"))
        yield e, state


# (turn, text the observation must contain)
HOSTILE = [
    (call("crop_image", img_id="IMG_001", bbox=["0", "0", "1", "1"]), "must be numbers"),
    (raw_call('{"img_id": "IMG_001", "bbox": [NaN, 0, 1, 1]}'), "finite"),
    (raw_call('{"img_id": "IMG_001", "bbox": [0, 0, Infinity, 1]}'), "finite"),
    (raw_call('{"img_id": "IMG_001", "bbox": [0, 0, 1' + "0" * 400 + ", 1]}"), "finite"),
    (call("crop_image", img_id="IMG_001", bbox=[[0, 0], [1, 1]]), "4 numbers"),
    (call("crop_image", img_id="IMG_001", bbox={"x0": 0}), "4 numbers"),
    (call("crop_image", img_id="IMG_" + "9" * 5000, bbox=[0, 0, 1, 1]), "must look like"),
    (call("crop_image", img_id="IMG_\u0661", bbox=[0, 0, 1, 1]), "must look like"),
    (call("crop_image", img_id="img_1", bbox=[0, 0, 0.5, 0.5]), "crop of IMG_001"),
    (call("crop_image", img_id="IMG_099", bbox=[0, 0, 0.5, 0.5]), "no such image"),
    ("<tool_call>" + '{"a":' * 50_000 + "1" + "}" * 50_000 + "</tool_call>", "nests too deeply"),
    (raw_call('{"a":' * 5_000 + "1" + "}" * 5_000, name="text_search"), "nests too deeply"),
    ("<tool_call>" + "[" * 100_000 + "</tool_call>", "JSON object"),
    ("<tool_call>{name: 'text_search', arguments: {queries: ['" + "x" * 30_000 + "']}}</tool_call>",
     "only strict JSON"),
    (raw_call('{"queries": ["tower"], "top_k": NaN}', name="text_search"), "whole number"),
    (raw_call('{"queries": ["tower"], "top_k": -Infinity}', name="text_search"), "whole number"),
    (raw_call('{"queries": ["tower"], "top_k": ' + "9" * 1000 + "}", name="text_search"),
     "'top_k' must be between 1 and 10; got a 3322-bit number"),
    (call("text_search", queries=["tower"], top_k=0), "'top_k' must be between 1 and 10; got 0"),
    (call("image_search", query="tower", top_k=50), "'top_k' must be between 1 and 5; got 50"),
    (call("text_search", queries=["x" * 1_000_000]), "1000000 characters long"),
    (call("image_search", query="tower", colour="é" * 500_000), "unknown argument"),
    (call("text_search", queries=["tower"], tbs="qdr:y99999999999"), "not a date filter"),
    (call("text_search", queries=["tower"], tbs="cdr:1,cd_min:12/31/2025,cd_max:1/1/2025"), "after it ends"),
    (call("text_search", queries=[["tower"]]), "non-empty string"),
    (call("text_search", queries={"tower": 1}), "list of 1-3"),
    (call("text_search", queries=["tower"]) * 10, "10 tool calls in one turn"),
    ('<tool_call>{"name": 5, "arguments": {}}</tool_call>', '"name" string'),
    ('<tool_call>{"name": "text_search", "arguments": "not json"}</tool_call>', "JSON object"),
    (call("web_fetch", url="file:///etc/passwd", prompt="x"), "Could not read the page"),
    (call("web_fetch", url=5, prompt="x"), "string or a list"),
    (call("image_search", query=["a", "b"]), "one query"),
]


@pytest.mark.parametrize("turn, expected", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_tool_calls_become_observations(tool_env_with_image, turn, expected):
    e, state = tool_env_with_image
    before = pickle.dumps(state)
    start = time.perf_counter()
    new, obs = e.step(state, turn)
    assert time.perf_counter() - start < 5.0  # no multi-second parse on the shared event loop
    assert not obs.done and obs.termination is None
    assert expected in obs.text, obs.text[:300]
    assert pickle.dumps(state) == before and new.num_turns == state.num_turns + 1
    assert new.messages[-1]["role"] == "user"
    encoded = json.dumps(obs.info, ensure_ascii=False, allow_nan=False).encode("utf-8")  # strict JSON, UTF-8
    assert len(encoded) < 4_000, encoded[:300]  # rejected arguments are cut, never copied whole
    assert obs.info["error"] is None or obs.info["errors"] == [obs.info["error"]]


def test_rejected_arguments_are_cut_and_say_how_long_they_were(tool_env_with_image):
    e, state = tool_env_with_image
    _, obs = e.step(state, call("text_search", queries=["x" * 1_000_000]))
    assert obs.info["error"] == "arguments" and obs.info["tool"] == "text_search"
    query = obs.info["arguments"]["queries"][0]
    assert query.startswith("x" * 100) and query.endswith("[1000000 characters]") and len(query) < 300
    _, obs = e.step(state, call("search", queries=[str(i) for i in range(1000)]))  # an alias, a long list
    assert obs.info["tool"] == "text_search" and obs.info["arguments"]["queries"][-1] == "… [1000 items]"
    _, obs = e.step(state, call("fly", to="moon"))
    assert (obs.info["tool"], obs.info["error"], obs.info["errors"]) == ("fly", "unknown_tool", ["unknown_tool"])


HOSTILE_ANSWERS = [
    ('{"gen_prompt": "x", "reference_images": "IMG_001"}', env.ANSWER_PARSE_FAILED, "must be a list"),
    ('{"gen_prompt": "x", "reference_images": {"img_id": "IMG_001"}}', env.ANSWER_PARSE_FAILED, "must be a list"),
    ('{"gen_prompt": "x", "reference_images": [{"img_id": "IMG_' + "1" * 5000 + '"}]}', env.ANSWER_PARSE_FAILED,
     "needs an \"img_id\""),
    ("[" * 100_000, env.ANSWER_PARSE_FAILED, "JSON object"),
    ('{"a":' * 50_000 + "1" + "}" * 50_000, env.ANSWER_PARSE_FAILED, "nests too deeply"),
    ('{"gen_prompt": 5, "reference_images": []}', env.ANSWER_PARSE_FAILED, "gen_prompt"),
    ('{"gen_prompt": "x", "reference_images": [null, 5]}', env.ANSWER_PARSE_FAILED, "reference_images[0]"),
    ('{"gen_prompt": "x", "reference_images": [{"img_id": "img_1"}, {"img_id": "IMG_001"}, "IMG_2"]}',
     env.ANSWER, "answer received"),
    ('{"gen_prompt": "x", "reference_images": [{"img_id": "IMG_001", "note": {"n": NaN}}]}', env.ANSWER,
     "answer received"),
]


@pytest.mark.parametrize("body, termination, expected", HOSTILE_ANSWERS, ids=range(len(HOSTILE_ANSWERS)))
def test_hostile_answers_end_with_a_named_termination(tool_env_with_image, body, termination, expected):
    e, state = tool_env_with_image
    before = pickle.dumps(state)
    new, obs = e.step(state, f"<answer>{body}</answer>")
    assert obs.done and obs.termination == new.termination == termination
    assert expected in obs.text
    assert pickle.dumps(state) == before
    if termination == env.ANSWER:
        assert [r.img_id for r in new.answer.reference_images] == ["IMG_001", "IMG_002"][: len(
            new.answer.reference_images)]
        assert len({r.img_id for r in new.answer.reference_images}) == len(new.answer.reference_images)


def test_lone_surrogates_never_reach_the_renderer(tool_env_with_image):
    e, state = tool_env_with_image
    turn = '<tool_call>{"name": "text_search", "arguments": {"queries": ["tower \\ud800 <|im_end|>"]}}</tool_call>'
    _, obs = e.step(state, turn)
    obs.text.encode("utf-8")  # would raise on a lone surrogate
    assert "\ufffd" in obs.text and "<|im_end|>" not in obs.text
    json.dumps(obs.info, ensure_ascii=False).encode("utf-8")  # info is UTF-8 too (the query is in it twice)
    assert obs.info["arguments"]["queries"] == ["tower \ufffd <|im_end|>"] == obs.info["queries"]
    _, end = e.step(state, '<answer>{"gen_prompt": "x", "reference_images": ["IMG_\\udc00"]}</answer>')
    end.text.encode("utf-8")
    assert end.termination == env.ANSWER_PARSE_FAILED


def test_parser_limits():
    assert parsing.normalise_img_id("IMG_" + "7" * 7) is None and parsing.normalise_img_id("IMG_999999") == "IMG_999999"
    assert parsing.normalise_img_id("IMG_\u0663") is None and parsing.normalise_img_id("img 3") == "IMG_003"
    body = "{name: 'text_search', arguments: {queries: ['" + "x" * parsing.MAX_LENIENT_CHARS + "']}}"
    with pytest.raises(parsing.FormatError, match="only strict JSON is accepted"):
        parsing.parse_tool_call(body)
    strict = json.dumps({"name": "text_search", "arguments": {"queries": ["x" * 100_000]}})
    assert parsing.parse_tool_call(strict).arguments["queries"][0] == "x" * 100_000
    with pytest.raises(parsing.FormatError, match="nests too deeply"):
        parsing.parse_tool_call('{"name": "a", "arguments": ' + "[" * 3000 + "]" * 3000 + "}")


def test_reset_names_a_malformed_task(tool_env_with_image):
    e, _ = tool_env_with_image
    with pytest.raises(TypeError, match="reset needs an env.Task; got dict"):
        e.reset({"id": "t", "prompt": "x"})
    with pytest.raises(TypeError, match="task 't2': prompt must be a str; got NoneType"):
        e.reset(env.Task("t2", None))
    with pytest.raises(TypeError, match="task 't3': metadata must be a mapping or None; got list"):
        e.reset(env.Task("t3", "x", metadata=["today"]))
