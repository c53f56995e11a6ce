"""An episode's messages in the two chat formats other tools read: OpenAI chat completions and Hugging Face.

`EnvState.messages` keeps images as `{"type": "image", "img_id": …}` parts that point into the env's image store.
These functions resolve them to pixels, in the env's own order (a tool response's images sit inside it, after its
text):

- `openai_messages(env, state)`: `{"role", "content"}` with content a string, or a list of `{"type": "text",
  "text"}` and `{"type": "image_url", "image_url": {"url": "data:image/png;base64,…"}}` parts — what
  `/v1/chat/completions` takes (OpenAI, vLLM, SGLang);
- `hf_messages(env, state)`: content always a list of `{"type": "text", "text"}` and `{"type": "image",
  "image": PIL.Image}` parts — what `processor.apply_chat_template` and the Qwen3-VL chat template take.

Tool results are `user` messages, as the environment's protocol has them (Gen-Searcher's convention).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PIL import Image

from ranger_jax.clients import media
from ranger_jax.env import tool_env


def _parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _convert(env: tool_env.ToolEnv, state: tool_env.EnvState,
             image_part: Callable[[Image.Image], dict[str, Any]], *, keep_strings: bool) -> list[dict[str, Any]]:
    out = []
    for message in state.messages:
        if keep_strings and isinstance(message["content"], str):
            out.append({"role": message["role"], "content": message["content"]})
            continue
        parts = []
        for part in _parts(message):
            if part["type"] == "text":
                parts.append({"type": "text", "text": part["text"]})
            else:
                parts.append(image_part(env.image(state.images[part["img_id"]])))
        out.append({"role": message["role"], "content": parts})
    return out


def openai_messages(env: tool_env.ToolEnv, state: tool_env.EnvState, *, fmt: str = "PNG") -> list[dict[str, Any]]:
    """The episode as OpenAI chat messages, each image a data URL (lossless PNG by default).

    Args:
        env: the env that ran the episode (its image store holds the pixels).
        state: any state of the episode.
        fmt: image encoding of the data URLs (`"PNG"` or `"JPEG"`).

    Raises:
        OSError: an image file of the episode is gone (the env was closed without a lasting `image_store`).
    """
    return _convert(env, state, lambda image: {"type": "image_url",
                                               "image_url": {"url": media.data_url(image, fmt=fmt)}},
                    keep_strings=True)


def hf_messages(env: tool_env.ToolEnv, state: tool_env.EnvState) -> list[dict[str, Any]]:
    """The episode as Hugging Face chat messages, each image a PIL image in a `{"type": "image"}` part.

    Raises:
        OSError: an image file of the episode is gone (the env was closed without a lasting `image_store`).
    """
    return _convert(env, state, lambda image: {"type": "image", "image": image}, keep_strings=False)
