"""The "harness" baseline: any OpenAI-compatible chat model with tool calling drives the environment.

The model gets the env's system prompt and the task as chat messages and the env's tools as OpenAI function
schemas; observations go back as `tool` messages answering its calls (images, which tool messages cannot carry,
follow in a user message, text before images as in Gen-Searcher's eval) or as user messages when it wrote the
protocol text itself. Each reply is rendered to protocol text — `<think>` from a split-off reasoning part, the
content, then one `<tool_call>` block per function call — and that text is what the env steps on.

The trajectory's ids are that text encoded with the policy tokenizer, log-probs 0: fine for viewing, evals and
SFT-style distillation, but NOT the model's own tokens (`token_exact = False`), so not GRPO data.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ranger_jax.clients import chat
from ranger_jax.env import parsing, tool_env
from ranger_jax.processing.tokenizer import Tokenizer
from ranger_jax.rollout import policy as policy_lib

IMAGES_NOTE = "Images returned by the tool, in order: {ids}."


def protocol_text(result: chat.ChatResult) -> str:
    """A chat reply as protocol text: `<think>reasoning</think>`, the content, then each tool call as a block."""
    parts = []
    if result.reasoning_content:
        parts.append(f"<think>{result.reasoning_content.strip()}</think>")
    if result.content.strip():
        parts.append(result.content.strip())
    for call in result.tool_calls:
        try:
            parts.append(parsing.format_tool_call(call.name, call.parsed_arguments()))
        except ValueError:  # arguments that are no JSON object (ChatFormatError): kept as written for the env
            parts.append(f'<tool_call>\n{{"name": {json.dumps(call.name)}, "arguments": {call.arguments}}}\n'
                         "</tool_call>")
    return "\n".join(parts)


def _assistant_message(result: chat.ChatResult) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.content}
    if result.tool_calls:
        message["tool_calls"] = [{"id": call.id or f"call_{i}", "type": "function",
                                  "function": {"name": call.name, "arguments": call.arguments}}
                                 for i, call in enumerate(result.tool_calls)]
    return message


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


class HarnessPolicy:
    """Policy backend over an OpenAI-compatible chat endpoint (see the module docstring).

    Args:
        client: the chat client of the model under test.
        tokenizer: the policy tokenizer the trajectory's ids are written with.
        tools: OpenAI function schemas offered to the model (`ToolEnv.tool_schemas()`); empty: protocol text only.
        name: label recorded on trajectories.
        image_format: how images are sent as data URLs (`PNG` keeps the prepared pixels exactly).
    """

    token_exact = False
    has_logprobs = False

    def __init__(self, client: chat.ChatClient, tokenizer: Tokenizer, *, tools: Sequence[Mapping[str, Any]] = (),
                 name: str = "harness", image_format: str = "PNG"):
        self.client, self.tokenizer, self.tools = client, tokenizer, [dict(t) for t in tools]
        self.name, self.image_format = name, image_format
        self._histories: dict[str, list[dict[str, Any]]] = {}

    def _messages(self, request: policy_lib.TurnRequest) -> list[dict[str, Any]]:
        """The chat history of the episode, with the latest observation appended."""
        state: tool_env.EnvState = request.state
        history = self._histories.get(request.rid)
        if history is None:
            history = [{"role": "system", "content": _text_of(state.messages[0]["content"])},
                       {"role": "user", "content": _text_of(state.messages[1]["content"])}]
            self._histories[request.rid] = history
            return history
        text = _text_of(state.messages[-1]["content"])
        images = [chat.image_part(image.image, fmt=self.image_format, max_side=None) for image in request.new_images]
        calls = history[-1].get("tool_calls") or []
        if calls:
            history.extend({"role": "tool", "tool_call_id": call["id"], "content": text} for call in calls)
            if images:
                note = IMAGES_NOTE.format(ids=", ".join(str(image.img_id) for image in request.new_images))
                history.append({"role": "user", "content": [chat.text_part(note), *images]})
        else:
            history.append({"role": "user", "content": [chat.text_part(text), *images] if images else text})
        return history

    async def generate(self, request: policy_lib.TurnRequest) -> policy_lib.Generation:
        """One chat completion, rendered to protocol text and encoded.

        Raises:
            ClientError (and subclasses): the server failed after retries.
        """
        if request.sampling.limits_draws:
            raise ValueError("draw_below / max_draws (decision sampling) need the JAX sampler; a chat endpoint "
                             "samples every token")
        messages = self._messages(request)
        extra: dict[str, Any] = {"top_p": float(request.sampling.top_p), "seed": int(request.seed)}
        if request.sampling.top_k != -1:
            extra["top_k"] = int(request.sampling.top_k)
        result = await self.client.acomplete(messages, temperature=float(request.sampling.temperature),
                                             max_tokens=request.max_new_tokens, tools=self.tools or None, extra=extra)
        messages.append(_assistant_message(result))
        generation = policy_lib.text_generation(self.tokenizer, protocol_text(result),
                                                max_new_tokens=request.max_new_tokens,
                                                info={"usage": dict(result.usage),
                                                      "finish_reason": result.finish_reason})
        if result.finish_reason == "length" and generation.finish_reason == "stop":
            # the model was cut off: its text is incomplete even though it fits in our tokens
            return policy_lib.Generation(token_ids=generation.token_ids[:-1], logprobs=generation.logprobs[:-1],
                                         finish_reason="length", info=generation.info)
        return generation

    async def fork(self, rid: str, into: Sequence[str]) -> None:
        """Each of `into` starts with a copy of `rid`'s chat history."""
        history = self._histories.get(rid)
        for other in into:
            if history is not None:
                self._histories[other] = copy.deepcopy(history)

    async def release(self, rid: str) -> None:
        """Forgets the episode's chat history."""
        self._histories.pop(rid, None)

    async def aclose(self) -> None:
        """Closes the chat client."""
        await self.client.aclose()
