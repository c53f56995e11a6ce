"""The chat harness over a loopback OpenAI-compatible server that plays back scripted tool-calling replies."""

import base64
import json

import numpy as np
import pytest
from support.loopback import LoopbackServer, Reply

from ranger_jax.clients import chat
from ranger_jax.data import viewer
from ranger_jax.env import core
from ranger_jax.env.sim import agents
from ranger_jax.rollout import episode, harness, runner, scoring, sequence

CONFIG = episode.EpisodeConfig(max_new_tokens=256, max_context_tokens=20_000,
                               vision=sequence.VisionSettings(min_pixels=4096, max_pixels=40_000))


def completion(message, finish="stop"):
    return {"id": "cmpl", "object": "chat.completion", "created": 0, "model": "frontier",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}


class ChatScript:
    """Replies with the scripted messages in order (all with `finish`); records every request body."""

    def __init__(self, replies, finish="stop"):
        self.replies, self.finish, self.bodies = list(replies), finish, []

    def __call__(self, req):
        self.bodies.append(req.json())
        return Reply.json(completion(self.replies[len(self.bodies) - 1], finish=self.finish))


def test_protocol_text_of_replies():
    call = chat.ToolCall(id="c", name="image_search", arguments='{"query": "red kit"}')
    text = harness.protocol_text(chat.ChatResult(content="", finish_reason="tool_calls", tool_calls=(call,),
                                                 reasoning_content=" plan "))
    assert text == '<think>plan</think>\n<tool_call>\n{"name": "image_search", "arguments": {"query": "red kit"}}' \
                   "\n</tool_call>"
    broken = chat.ToolCall(id="c", name="crop_image", arguments="{not json")
    assert harness.protocol_text(chat.ChatResult(content="ok", finish_reason="stop", tool_calls=(broken,))) == \
        'ok\n<tool_call>\n{"name": "crop_image", "arguments": {not json}\n</tool_call>'


@pytest.fixture(scope="module")
def loopback():
    with LoopbackServer() as server:
        yield server


def test_harness_episode_over_chat_loopback(loopback, sim_env, tasks, qwen_renderer, the_world):
    task = tasks[0]
    query = agents.subject_query(task.prompt)
    answer = {"gen_prompt": f"{task.prompt} as in the first reference image",
              "reference_images": [{"img_id": "IMG_006", "note": "crop"}]}
    script = ChatScript([
        {"content": "", "reasoning_content": "I search images.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "image_search", "arguments": json.dumps({"query": query})}}]},
        {"content": '<think>Crop it.</think>\n<tool_call>\n{"name": "crop_image", "arguments": '
                    '{"img_id": "IMG_001", "bbox": [0.1, 0.1, 0.9, 0.9]}}\n</tool_call>'},
        {"content": f"<answer>{json.dumps(answer)}</answer> <|image_pad|>"},
    ])
    loopback.route("POST", "/v1/chat/completions", script)
    client = chat.ChatClient(loopback.url + "/v1", model="frontier", max_retries=0)
    pol = harness.HarnessPolicy(client, qwen_renderer.tokenizer, tools=sim_env.tool_schemas())
    scorer = scoring.make_scorer(sim_env, world=the_world)
    [group] = runner.run(sim_env, pol, [task], renderer=qwen_renderer, scorer=scorer,
                         config=runner.RolloutConfig(seed=4, episode=CONFIG))
    traj = group.trajectories[0]
    assert traj.termination == core.ANSWER and traj.answer.reference_images[0].img_id == "IMG_006"
    assert traj.metadata["policy"] == "harness" and not traj.metadata["token_exact"]
    assert not traj.metadata["rl_trainable"] and not traj.sampler_logprobs.any()
    said = [m["content"] for m in traj.messages if m["role"] == "assistant"]
    assert said[0].startswith("<think>I search images.</think>\n<tool_call>\n")
    assert said[2].endswith("</answer> ")  # the literal <|image_pad|> never reaches the env or the ids
    assert (traj.token_ids == qwen_renderer.tokenizer.image_pad_id).sum() == sum(i.num_tokens() for i in traj.images)
    assert traj.reward_breakdown["breakdown"]["references"][0]["img_id"] == "IMG_006"
    page = viewer.render_html([traj])  # the viewer shows a harness episode like any other
    assert all(base64.b64encode(image.png).decode() in page for image in traj.images)
    assert "crop of IMG_001" in page and "harness" in page and "<h3>Crops</h3>" in page

    first, second, third = script.bodies
    assert first["tools"] == sim_env.tool_schemas() and first["model"] == "frontier"
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][1]["content"] == task.prompt
    assert first["max_completion_tokens"] == 256 and isinstance(first["seed"], int)
    # a native tool call is answered by a tool message; its images follow in a user message, text first
    tool_message, image_message = second["messages"][3], second["messages"][4]
    assert second["messages"][2]["tool_calls"][0]["id"] == "call_1"
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_1"
    assert "--- image search result for" in tool_message["content"]
    parts = image_message["content"]
    assert parts[0]["type"] == "text" and parts[0]["text"].startswith("Images returned by the tool, in order: IMG_001")
    assert all(p["image_url"]["url"].startswith("data:image/png;base64,") for p in parts[1:]) and len(parts) > 1
    # a protocol-text tool call is answered by a plain user message: text, then the crop
    last = third["messages"][-1]
    assert last["role"] == "user" and last["content"][0]["type"] == "text" and "IMG_006" in last["content"][0]["text"]
    assert [p["type"] for p in last["content"]] == ["text", "image_url"]


def test_harness_length_finish_is_a_truncated_turn(loopback, sim_env, tasks, qwen_renderer):
    script = ChatScript([{"content": "<think>I am still thinking about"}] * 2, finish="length")
    loopback.route("POST", "/v1/chat/completions", script)
    client = chat.ChatClient(loopback.url + "/v1", model="frontier", max_retries=0)
    pol = harness.HarnessPolicy(client, qwen_renderer.tokenizer)
    [group] = runner.run(sim_env, pol, [tasks[1]], renderer=qwen_renderer, config=runner.RolloutConfig(episode=CONFIG))
    traj = group.trajectories[0]
    assert traj.termination == core.REPEATED_RESPONSE
    assert [t["finish_reason"] for t in traj.metadata["turns"]] == ["length", "length"]
    assert "tools" not in script.bodies[0]
    mask = traj.loss_mask.astype(bool)
    assert qwen_renderer.tokenizer.im_end_id not in traj.token_ids[mask]  # no closing token was "generated"
    assert np.count_nonzero(traj.token_ids == qwen_renderer.tokenizer.im_end_id) == 2 + 2 + 1  # prefix, turns, tool
