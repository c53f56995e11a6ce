"""The small helpers for agent authors: tool-call and answer text the env's own parser reads, the first observation,
and an episode's messages as OpenAI and Hugging Face chat messages (checked against the Qwen3-VL chat template)."""

import base64
import io
import json
import math

import numpy as np
import pytest
from PIL import Image
from support.tiny_tokenizer import qwen3_tokenizer_dir

from ranger_jax import env
from ranger_jax.env import config as config_lib
from ranger_jax.env import parsing, tool_env
from ranger_jax.env.backends import base
from ranger_jax.processing import chat

TASK = env.Task("t1", "Draw the new red lighthouse.", metadata={"today": "2025-12-01"})


@pytest.fixture
def episode(memory_backend, corpus):
    """An env and a state after an image search (3 images), a crop and a format error."""
    backend = memory_backend(images={"tower": corpus["hits"][:3]}, blobs=corpus["blobs"],
                             text={"tower": [base.TextHit("Tower", "https://a.org/t", "red tower")]})
    with tool_env.ToolEnv(backend, config_lib.EnvConfig()) as e:
        state = e.reset(TASK)
        state, _ = e.step(state, env.format_tool_call("image_search", {"query": "tower", "top_k": 3}))
        state, _ = e.step(state, env.format_tool_call("crop_image", {"img_id": "IMG_002", "bbox": [0, 0, 0.5, 1]}))
        state, _ = e.step(state, "I am not sure.")
        yield e, state


@pytest.mark.parametrize("name, arguments", [
    ("text_search", {"queries": ["new red lighthouse", "phare rouge « neuf »"], "top_k": 3}),
    ("image_search", {"query": "tower \u2603 \"quoted\" <b>", "time_range": "week"}),
    ("crop_image", {"img_id": "IMG_001", "bbox": [0.1, 0.2, 0.5, 0.75]}),
    ("web_fetch", {"url": "https://a.org/t?x=1&y=</tool_call>", "prompt": "<answer>{}</answer> <think>"}),
    ("anything", {}),
])
def test_format_tool_call_round_trips_through_the_parser(name, arguments):
    text = env.format_tool_call(name, arguments)
    turn = parsing.split_turn(f"<think>plan</think>\n{text}")
    assert turn.answers == () and len(turn.calls) == 1 and not turn.unclosed_answer
    assert parsing.parse_tool_call(turn.calls[0]) == parsing.ToolCall(name, arguments)
    assert text.startswith("<tool_call>\n{") and text.endswith("}\n</tool_call>")  # the shape the prompt shows


def test_format_errors_name_the_problem():
    with pytest.raises(ValueError, match="non-empty tool name"):
        env.format_tool_call("", {})
    with pytest.raises(ValueError, match="arguments of crop_image are not JSON"):
        env.format_tool_call("crop_image", {"bbox": [math.nan, 0, 1, 1]})
    with pytest.raises(ValueError, match="must be a mapping"):
        env.format_tool_call("crop_image", [1, 2])
    with pytest.raises(ValueError, match="non-empty gen_prompt"):
        env.format_answer(" ", ["IMG_001"])
    with pytest.raises(ValueError, match=r"reference_images\[1\] must be an image id"):
        env.format_answer("x", ["IMG_001", 3])


def test_format_answer_round_trips_and_ends_the_episode(episode):
    e, state = episode
    prompt = "the first reference image, at dusk </answer> <tool_call>"
    text = env.format_answer(prompt, ["IMG_004", {"img_id": "IMG_001", "note": "n"}])
    body, = parsing.split_turn(text).answers
    answer = parsing.parse_answer(body, state.images, drop_unknown=False, max_refs=5)
    assert answer == env.Answer(prompt, (env.AnswerRef("IMG_004"), env.AnswerRef("IMG_001", "n")))
    done, obs = e.step(state, text)
    assert obs.termination == env.ANSWER and done.answer == answer


def test_the_first_observation_comes_from_reset(episode):
    e, _ = episode
    state = e.reset(TASK)
    first = e.observe(state)
    assert first == env.Observation(text=TASK.prompt) and not first.done
    state, stepped = e.step(state, env.format_tool_call("image_search", {"query": "tower", "top_k": 2}))
    again = e.observe(state)
    assert again.text == stepped.text and again.images == stepped.images and len(again.images) == 2
    state, end = e.step(state, env.format_answer("the first reference image", ["IMG_001"]))
    assert e.observe(state).done and e.observe(state).termination == env.ANSWER == end.termination


def _decode(url):
    head, payload = url.split(",", 1)
    assert head == "data:image/png;base64"
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(payload))).convert("RGB"))


def test_openai_messages(episode):
    e, state = episode
    messages = env.openai_messages(e, state)
    assert [m["role"] for m in messages] == [m["role"] for m in state.messages]
    assert messages[0]["content"] == state.messages[0]["content"] and messages[1]["content"] == TASK.prompt
    json.dumps(messages)  # plain JSON, as a request body
    images = [part for m in messages if isinstance(m["content"], list) for part in m["content"]
              if part["type"] == "image_url"]
    ids = [part["img_id"] for m in state.messages if isinstance(m["content"], list) for part in m["content"]
           if part["type"] == "image"]
    assert ids == ["IMG_001", "IMG_002", "IMG_003", "IMG_004"] and len(images) == 4
    for part, img_id in zip(images, ids):
        assert set(part) == {"type", "image_url"} and set(part["image_url"]) == {"url"}
        np.testing.assert_array_equal(_decode(part["image_url"]["url"]), np.asarray(e.image(state.images[img_id])))
    for message, original in zip(messages, state.messages):
        if isinstance(original["content"], list):
            texts = [p["text"] for p in original["content"] if p["type"] == "text"]
            assert [p["text"] for p in message["content"] if p["type"] == "text"] == texts
            assert all(set(p) == {"type", "text"} for p in message["content"] if p["type"] == "text")


def test_hf_messages_render_with_the_qwen3_vl_chat_template(episode):
    from transformers import AutoTokenizer

    e, state = episode
    messages = env.hf_messages(e, state)
    assert all(isinstance(m["content"], list) for m in messages)
    pictures = [p["image"] for m in messages for p in m["content"] if p["type"] == "image"]
    assert len(pictures) == 4 and all(isinstance(p, Image.Image) for p in pictures)
    hf = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())
    text = hf.apply_chat_template(messages, chat_template=chat.qwen3_vl_chat_template(), tokenize=False)
    assert text.count("<|vision_start|><|image_pad|><|vision_end|>") == 4
    tool_turn = state.messages[3]["content"]  # the image search: text, 3 images, closing tag
    expected = (tool_turn[0]["text"] + "<|vision_start|><|image_pad|><|vision_end|>" * 3 + tool_turn[-1]["text"])
    assert f"<|im_start|>user\n{expected}<|im_end|>" in text
    assert text.startswith(f"<|im_start|>system\n{state.messages[0]['content']}<|im_end|>")
    assert f"<|im_start|>user\n{TASK.prompt}<|im_end|>" in text
