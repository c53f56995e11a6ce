import asyncio
import concurrent.futures
import copy
import datetime as dt
import json
import logging
import pickle

import pytest

from ranger_jax import env
from ranger_jax.env import config as config_lib
from ranger_jax.env import prompts, tool_env, tools
from ranger_jax.env.backends import base

TASK = env.Task("t1", "Draw the new red lighthouse.", metadata={"today": "2025-12-01"})


def call(name, **arguments):
    return f"<think>plan</think>\n<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def answer(*img_ids, prompt="the first reference image, at dusk"):
    refs = [{"img_id": i, "note": "n"} for i in img_ids]
    return f"<answer>{json.dumps({'gen_prompt': prompt, 'reference_images': refs})}</answer>"


@pytest.fixture
def make_env(memory_backend, corpus):
    made = []

    def build(backend=None, **config):
        if backend is None:
            hits = corpus["hits"]
            bad = [base.ImageHit("corrupt", "https://img.example.com/corrupt.png"),
                   base.ImageHit("html", "https://img.example.com/page.html")]
            backend = memory_backend(
                images={"tower": hits[:4], "tower again": [hits[2], hits[5], hits[1]], "bad first": bad + hits[4:],
                        "all bad": bad, "many": hits},
                text={"tower": [base.TextHit("<Tower>", "https://a.org/t", "red tower", "2025-11-30")]},
                pages={"https://a.org/long": base.Page("https://a.org/long", "Long", "word " * 40_000)},
                blobs=corpus["blobs"],
            )
        made.append(tool_env.ToolEnv(backend, config_lib.EnvConfig(**config)))
        return made[-1]

    yield build
    for e in made:
        e.close()


def test_reset_builds_system_and_user_messages(make_env):
    e = make_env()
    state = e.reset(TASK)
    system, user = state.messages
    assert system["role"] == "system" and user == {"role": "user", "content": TASK.prompt}
    assert system["content"].endswith("Today's date: 2025-12-01")
    block = system["content"].split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()
    assert [json.loads(line)["function"]["name"] for line in block] == list(tools.TOOL_NAMES)
    assert [json.loads(line) for line in block] == e.tool_schemas()
    assert state.today == dt.date(2025, 12, 1) and state.num_turns == 0 and not state.done
    assert e.reset(env.Task("t2", "x")).today == dt.date.today()
    with pytest.raises(ValueError, match="t3.*YYYY-MM-DD"):
        e.reset(env.Task("t3", "x", metadata={"today": "yesterday"}))


def test_step_is_pure(make_env):
    e = make_env()
    state = e.reset(TASK)
    state, _ = e.step(state, call("image_search", query="tower"))
    frozen = copy.deepcopy(state)
    pickled = pickle.dumps(state)
    new, obs = e.step(state, call("crop_image", img_id="IMG_001", bbox=[0, 0, 0.5, 0.5]))
    assert state == frozen and pickle.loads(pickled) == state
    assert len(new.messages) == len(state.messages) + 2 and "IMG_005" in new.images and "IMG_005" not in state.images
    with pytest.raises((AttributeError, TypeError)):
        state.images["IMG_009"] = None
    with pytest.raises(AttributeError):
        state.num_turns = 3


def test_image_ids_are_stable_deduplicated_and_shared_with_crops(make_env):
    e = make_env()
    state = e.reset(TASK)
    state, obs = e.step(state, call("image_search", query="tower", top_k=3))
    assert [i.img_id for i in obs.images] == ["IMG_001", "IMG_002", "IMG_003"]
    assert obs.images[0].image.size == (64, 48)
    state, obs = e.step(state, call("crop_image", img_id="IMG_003", bbox=[0.1, 0.1, 0.9, 0.9]))
    assert [i.img_id for i in obs.images] == ["IMG_004"]
    state, obs = e.step(state, call("image_search", query="tower again"))
    assert [i.img_id for i in obs.images] == ["IMG_003", "IMG_005", "IMG_002"]
    assert state.images["IMG_005"].url == "https://img.example.com/5.png"
    state, obs = e.step(state, call("crop_image", img_id="IMG_003", bbox=[0.1, 0.1, 0.9, 0.9]))
    assert [i.img_id for i in obs.images] == ["IMG_004"] and state.next_image_index == 6
    content = state.messages[-3]["content"]  # the second image_search reply
    assert content[0]["type"] == "text" and content[0]["text"].startswith("<tool_response>")
    assert [p["img_id"] for p in content if p["type"] == "image"] == ["IMG_003", "IMG_005", "IMG_002"]
    assert content[-1] == {"type": "text", "text": "</tool_response>"}


def test_crop_records_compose_root_boxes(make_env):
    e = make_env()
    state = e.reset(TASK)
    state, _ = e.step(state, call("image_search", query="tower", top_k=1))  # IMG_001: 64x48
    state, _ = e.step(state, call("crop_image", img_id="IMG_001", bbox=[0.25, 0.5, 0.75, 1.0]))
    state, _ = e.step(state, call("crop_image", image_id="IMG_002", box=[0.5, 0, 1, 0.5]))
    first, second = state.images["IMG_002"], state.images["IMG_003"]
    assert first.parent_id == "IMG_001" and first.root_box == (16.0, 24.0, 48.0, 48.0)
    assert second.parent_id == "IMG_002" and second.root_box == (32.0, 24.0, 48.0, 36.0)
    assert second.root_url == first.root_url == state.images["IMG_001"].url == "https://img.example.com/0.png"
    assert (second.width, second.height) == (16, 12) and state.images["IMG_001"].root_box is None


def test_image_search_skips_unusable_results_and_caps_per_turn(make_env):
    e = make_env(max_images_per_turn=2)
    state = e.reset(TASK)
    state, obs = e.step(state, call("image_search", query="bad first", top_k=2))
    assert [i.img_id for i in obs.images] == ["IMG_001", "IMG_002"]
    assert state.images["IMG_001"].url.endswith("/4.png") and "2 result(s) skipped" in obs.text
    assert "not a readable image" in obs.text
    _, refused = e.step(state, call("image_search", query="many", top_k=50))  # explained, not clamped
    assert refused.images == () and "'top_k' must be between 1 and 2; got 50" in refused.text
    assert (refused.info["error"], refused.info["errors"]) == ("arguments", ["arguments"])
    state, obs = e.step(state, call("image_search", query="many"))
    assert len(obs.images) == 2 and obs.info["error"] is None and obs.info["errors"] == []
    state, obs = e.step(state, call("image_search", query="all bad"))
    assert obs.images == () and "none could be used" in obs.text and not obs.done
    assert (obs.info["error"], obs.info["errors"]) == ("image_rejected", ["image_rejected"] * 2)
    state, obs = e.step(state, call("image_search", query="nothing here"))
    assert "No usable images found" in obs.text


class BrokenBackend:
    """Every search and fetch fails the same way."""

    async def text_search(self, query, *, top_k, tbs=None):
        raise base.BackendError("HTTP 503 from search")

    image_search = text_search

    async def fetch_page(self, url):
        raise base.BackendError(f"HTTP 503 from {url}")

    async def aclose(self):
        pass


FAILURE_KEYS = {"tool", "arguments", "error", "errors", "latency_s", "final_turn"}


def test_the_same_failure_reports_the_same_info_in_every_tool(make_env):
    e = make_env(BrokenBackend())
    state = e.reset(TASK)
    turns = {"text_search": call("text_search", queries=["a", "b"]), "image_search": call("image_search", query="a"),
             "web_fetch": call("browse", url=["https://a.org/1", "https://a.org/2"], goal="x")}
    for tool, turn in turns.items():
        _, obs = e.step(state, turn)
        assert FAILURE_KEYS <= set(obs.info) and obs.info["tool"] == tool, obs.info
        assert obs.info["error"] == "backend" and set(obs.info["errors"]) == {"backend"}, obs.info
        json.dumps(obs.info, allow_nan=False)
    for turn, kind in ((call("crop_image", img_id="IMG_009", bbox=[0, 0, 1, 1]), "unknown_img_id"),
                       (call("text_search", queries=["a"], top_k=11), "arguments"),
                       (call("find_object", description="red"), "unknown_tool")):
        _, obs = e.step(state, turn)
        assert {"tool", "arguments", "error", "errors", "final_turn"} <= set(obs.info)
        assert (obs.info["error"], obs.info["errors"]) == (kind, [kind]), obs.info
    _, obs = e.step(state, "no protocol here")
    assert (obs.info["error"], obs.info["errors"]) == ("format", ["format"])


def test_the_system_prompt_describes_only_enabled_tools(make_env):
    for style in ("full", "compact"):
        prompt = make_env(tools=("text_search", "web_fetch"), prompt_style=style).reset(TASK).messages[0]["content"]
        assert "text_search" in prompt and "web_fetch" in prompt
        for name in ("image_search", "crop_image", "find_object"):
            assert name not in prompt, (style, name)
    every = make_env().reset(TASK).messages[0]["content"]
    assert all(name in every.split("# Tools")[0] for name in tools.TOOL_NAMES)  # a working rule for each
    only_images = make_env(tools=("image_search",)).reset(TASK).messages[0]["content"]
    assert "crop" not in only_images


def test_valid_answer_ends_the_episode(make_env):
    e = make_env()
    state = e.reset(TASK)
    state, _ = e.step(state, call("image_search", query="tower", top_k=2))
    state, obs = e.step(state, "<think>done</think>" + answer("IMG_002", "IMG_001"))
    assert obs.done and obs.termination == env.ANSWER == state.termination
    assert [r.img_id for r in state.answer.reference_images] == ["IMG_002", "IMG_001"]
    with pytest.raises(ValueError, match="already over"):
        e.step(state, answer("IMG_001"))


@pytest.mark.parametrize("text", [
    answer("IMG_007"),
    "<answer>{gen_prompt: </answer>",
    '<answer>{"gen_prompt": "x"}</answer>',
])
def test_unusable_answer_is_answer_parse_failed(make_env, text):
    e = make_env()
    state, obs = e.step(e.reset(TASK), text)
    assert obs.done and obs.termination == env.ANSWER_PARSE_FAILED and state.answer is None


BAD_TURNS = [
    ("", "no <tool_call> or <answer>"),
    ("I think the answer is a red lighthouse.", "no <tool_call> or <answer>"),
    ("<think>never closed", "never closed"),
    ("<tool_call>{\"name\": \"text_search\"", "never closed"),
    ("<answer>{\"gen_prompt\": \"x\"", "never closed"),
    ("<tool_call>{not json}</tool_call>", "not valid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "JSON object"),
    ("<tool_call>{\"arguments\": {}}</tool_call>", '"name"'),
    (call("text_search", queries=["a"]) + call("text_search", queries=["b"]), "2 tool calls"),
    (call("text_search", queries=["a"]) + answer(), "a tool call and an answer"),
    (answer() + answer(), "2 answers"),
    (call("teleport", where="x"), "unknown tool 'teleport'"),
    (call("text_search", queries="a", top_k="many"), "whole number"),
    (call("text_search", queries=[["nested"]]), "non-empty string"),
    (call("text_search"), "needs 'queries'"),
    (call("image_search", query=None), "needs 'query'"),
    (call("web_fetch", url=42, prompt="x"), "must be a string or a list"),
    (call("crop_image", img_id="IMG_001", bbox=[0, 0, 1, 1]), "no such image"),
    (call("crop_image", img_id=7, bbox=[0, 0, 1, 1]), "IMG_003"),
    (call("crop_image", img_id="IMG_001", bbox=[0.2, 0.2, 0.2, 0.2]), "inverted"),
    (call("crop_image", img_id="IMG_001", bbox=[0.5, 0, 0.1, 1]), "inverted"),
    (call("crop_image", img_id="IMG_001", bbox=[0, 0, 1.5, 1]), "outside"),
    (call("crop_image", img_id="IMG_001", bbox=[0, 0, 0.05, 0.05]), "at least 8x8"),
    (call("crop_image", img_id="IMG_001", bbox="0 0 1 1"), "4 numbers"),
    (call("web_fetch", url="https://nowhere.example/x", prompt="x"), "HTTP 404"),
    (call("text_search", queries=["no such thing"]), "No results"),
]


@pytest.mark.parametrize("text, expected", BAD_TURNS)
def test_bad_policy_turns_become_observations(make_env, text, expected):
    e = make_env()
    state = e.reset(TASK)
    if "IMG_001" in text and "no such image" not in expected:
        state, _ = e.step(state, call("image_search", query="tower", top_k=1))
    new, obs = e.step(state, text)
    assert not obs.done and obs.termination is None
    assert expected in obs.text
    assert new.messages[-1] == {"role": "user", "content": obs.text} and new.num_turns == state.num_turns + 1


def test_protocol_violations_run_nothing(make_env):
    e = make_env()
    state = e.reset(TASK)
    e.step(state, call("text_search", queries=["tower"]) + call("image_search", query="tower"))
    e.step(state, call("image_search", query="tower") + answer())
    assert e.backend.calls == []


def test_forced_final_turn(make_env):
    e = make_env(max_turns=2)
    state = e.reset(TASK)
    state, obs = e.step(state, call("image_search", query="tower", top_k=2))
    assert prompts.FINAL_STEP not in obs.text
    state, obs = e.step(state, call("text_search", queries=["tower"]))
    assert obs.text.endswith(prompts.FINAL_STEP) and state.final_turn and obs.info["final_turn"]
    done, obs = e.step(state, call("text_search", queries=["more"]))
    assert obs.termination == env.NO_ANSWER and ("text_search", "more") not in e.backend.calls
    # a tool call next to the answer is cut away; unknown ids are dropped
    done, obs = e.step(state, call("text_search", queries=["more"]) + answer("IMG_009", "IMG_002"))
    assert obs.termination == env.ANSWER and [r.img_id for r in done.answer.reference_images] == ["IMG_002"]
    done, obs = e.step(state, "<think>out of time")
    assert obs.termination == env.NO_ANSWER
    done, obs = e.step(state, "<think>long", truncated=True)
    assert obs.termination == env.NO_ANSWER


def test_max_turns_without_final_turn(make_env):
    e = make_env(max_turns=1, final_answer_turn=False)
    state, obs = e.step(e.reset(TASK), "hello")
    assert obs.termination == env.MAX_TURNS and state.done


def test_tool_call_budget(make_env):
    e = make_env(max_tool_calls=2)
    state = e.reset(TASK)
    state, obs = e.step(state, call("text_search", queries=["a"]))
    state, obs = e.step(state, call("crop_image", img_id="IMG_001"))  # bad arguments: not counted
    assert state.num_tool_calls == 1 and not state.final_turn
    state, obs = e.step(state, call("text_search", queries=["b"]))
    assert state.num_tool_calls == 2 and state.final_turn and prompts.FINAL_STEP in obs.text
    state, obs = e.step(state, answer())
    assert obs.termination == env.ANSWER


def test_repeated_and_truncated_responses(make_env):
    e = make_env(max_response_chars=500)
    state = e.reset(TASK)
    state, obs = e.step(state, call("text_search", queries=["tower"]))
    _, obs = e.step(state, call("text_search", queries=["tower"]))
    assert obs.termination == env.REPEATED_RESPONSE
    state, obs = e.step(state, "<think>" + "x" * 100, truncated=True)
    assert obs.text == prompts.RESPONSE_TOO_LONG and not obs.done and state.num_truncated == 1
    _, obs = e.step(state, "y" * 600)  # over max_response_chars counts as truncated
    assert obs.termination == env.REPEATED_RESPONSE
    state, obs = e.step(state, call("text_search", queries=["other"]))
    assert state.num_truncated == 0 and not obs.done


def test_terminate_for_rollout_side_reasons(make_env):
    e = make_env()
    state = e.reset(TASK)
    done = e.terminate(state, env.CONTEXT_EXCEEDED)
    assert done.done and done.termination == "context_exceeded" and not state.done
    with pytest.raises(ValueError, match="unknown termination 'bored'"):
        e.terminate(state, "bored")


def test_huge_outputs_are_cut(make_env):
    e = make_env(max_page_chars=100_000, max_observation_chars=3_000)
    state, obs = e.step(e.reset(TASK), call("web_fetch", url="https://a.org/long", prompt="what?"))
    assert len(obs.text) < 3_200 and "more characters]" in obs.text


def test_text_search_output(make_env):
    e = make_env()
    _, obs = e.step(e.reset(TASK), call("search", query=["tower", "no such thing"]))
    assert "--- search result for [tower] ---\n1. [<Tower>](https://a.org/t) (2025-11-30)\nred tower" in obs.text
    assert "--- search result for [no such thing] ---\nNo results" in obs.text


def test_astep_runs_many_episodes_in_one_loop_and_step_after(make_env):
    e = make_env()

    async def episode(i):
        state = e.reset(env.Task(f"t{i}", "p"))
        state, obs = await e.astep(state, call("image_search", query="tower", top_k=1 + i % 3))
        state, obs = await e.astep(state, answer("IMG_001"))
        return state

    async def main():
        return await asyncio.wait_for(asyncio.gather(*(episode(i) for i in range(12))), 30)

    states = asyncio.run(main())
    assert all(s.termination == env.ANSWER for s in states)
    assert [len(s.images) for s in states] == [1 + i % 3 for i in range(12)]
    state, obs = e.step(e.reset(TASK), call("image_search", query="tower", top_k=1))  # a different loop
    assert [i.img_id for i in obs.images] == ["IMG_001"]


def test_one_env_serves_many_threads_and_replays_exactly(make_env):
    """The documented guarantees: `step` may be called from many threads at once on one env, and the same turns
    give the same observations, image ids and pixels on a fresh env (the backend being deterministic)."""
    script = [call("image_search", query="tower", top_k=3), call("crop_image", img_id="IMG_002", bbox=[0, 0, .5, 1]),
              call("text_search", queries=["tower"]), answer("IMG_004", "IMG_001")]

    def play(e, i):
        state, seen = e.reset(env.Task(f"t{i}", "Draw the tower.", metadata={"today": "2025-12-01"})), []
        for turn in script:
            state, obs = e.step(state, turn)
            seen.append((obs.text, [(im.img_id, im.image.tobytes()) for im in obs.images], obs.termination))
        return seen, state.messages[1:], {k: r.sha256 for k, r in state.images.items()}

    shared = make_env()
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        runs = list(pool.map(lambda i: play(shared, i), range(16)))
    alone = play(make_env(), 0)
    assert all(run == alone for run in runs)
    assert alone[0][-1][2] == env.ANSWER and alone[2]["IMG_004"] != alone[2]["IMG_002"]


class _BrokenBackend:
    """A backend whose search has a bug (raises a plain exception type)."""

    async def text_search(self, query, *, top_k, tbs=None):
        raise KeyError("bug")

    async def image_search(self, query, *, top_k, tbs=None):
        return [base.ImageHit("x", "https://x.org/1.png")]

    async def fetch_page(self, url):
        raise ZeroDivisionError

    async def fetch_image(self, url, *, page_url=None):
        return base.FetchedImage(url=url, data=b"GIF89a" + b"\x00" * 64)

    async def aclose(self):
        pass


def test_backend_bugs_never_escape_step(make_env, caplog):
    e = make_env(backend=_BrokenBackend())
    state = e.reset(TASK)
    with caplog.at_level(logging.WARNING, logger="ranger_jax.env.tool_runner"):
        state, obs = e.step(state, call("text_search", queries=["a"]))
        assert "Search failed: KeyError" in obs.text and not obs.done
        state, obs = e.step(state, call("web_fetch", url="https://x.org", prompt="p"))
        assert "Could not read the page: ZeroDivisionError" in obs.text
        state, obs = e.step(state, call("image_search", query="a"))
        assert "not a readable image" in obs.text and obs.images == ()
    # bugs are logged with their traceback; a rejected image is an expected failure and is not
    logged = [(r.getMessage(), r.exc_info[0]) for r in caplog.records if r.name == "ranger_jax.env.tool_runner"]
    assert logged == [("text_search 'a' failed unexpectedly", KeyError),
                      ("web_fetch https://x.org failed unexpectedly", ZeroDivisionError)]
