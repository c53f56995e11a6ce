"""LLaMA-Factory sharegpt rows (Gen-Searcher's SFT data) to ChatML messages for `ChatRenderer.render`.

A row is `{"messages": [{"role", "content"}, …], "images": [path, …]}` (Gen-Searcher's `gen_sft`
entry), or the sharegpt default `{"conversations": [{"from", "value"}, …], "images": …}` with the
tags human / gpt / observation / system. Each `<image>` in a content string takes the next image path,
in place, as LLaMA-Factory's Qwen2-VL plugin expands it; observations become user turns wrapped in
`<tool_response>\\n…\\n</tool_response>` as LLaMA-Factory's Qwen templates format them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ranger_jax.processing.chat import TOOL_RESPONSE_END, TOOL_RESPONSE_START

IMAGE_TAG = "<image>"
ROLE_NAMES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "observation": "observation",
    "tool": "observation",
}


def _resolve(path: Any, media_dir: str | os.PathLike | None) -> Any:
    if media_dir is None or not isinstance(path, (str, os.PathLike)) or os.path.isabs(path):
        return path
    return str(Path(media_dir) / path)


def messages_from_sharegpt(
    row: Mapping[str, Any], *, media_dir: str | os.PathLike | None = None
) -> list[dict[str, Any]]:
    """Converts one sharegpt row to ChatML messages with image parts `{"type": "image", "image": path}`.

    Args:
        row: a sharegpt row with `messages` (role/content) or `conversations` (from/value), optional
            `images` (paths in order of the `<image>` tags) and optional `system` (used when the
            conversation has no system message).
        media_dir: folder that relative image paths are resolved against (LLaMA-Factory's `media_dir`).

    Returns:
        Messages in order; a content with `<image>` tags becomes a list of text and image parts.

    Raises:
        ValueError: naming both counts when `<image>` tags and images disagree, or naming the message for an
            unknown role, a non-string content, or an image outside user/observation turns.
    """
    if "messages" in row:
        turns, role_key, content_key = row["messages"], "role", "content"
    elif "conversations" in row:
        turns, role_key, content_key = row["conversations"], "from", "value"
    else:
        raise ValueError(f"sharegpt row has neither 'messages' nor 'conversations' (keys: {sorted(row)})")
    images = list(row.get("images") or [])
    num_tags = sum(
        turn.get(content_key, "").count(IMAGE_TAG) for turn in turns if isinstance(turn.get(content_key), str)
    )
    if num_tags != len(images):
        raise ValueError(f"sharegpt row has {num_tags} {IMAGE_TAG} tags but {len(images)} images")

    messages: list[dict[str, Any]] = []
    if row.get("system") and not (turns and ROLE_NAMES.get(turns[0].get(role_key)) == "system"):
        messages.append({"role": "system", "content": row["system"]})
    next_image = iter(images)
    for index, turn in enumerate(turns):
        tag = turn.get(role_key)
        role = ROLE_NAMES.get(tag)
        if role is None:
            raise ValueError(
                f"sharegpt message {index} has {role_key}={tag!r}; supported: {', '.join(sorted(ROLE_NAMES))}"
            )
        content = turn.get(content_key)
        if not isinstance(content, str):
            raise ValueError(f"sharegpt message {index} {content_key} is a {type(content).__name__}, not a string")
        if role == "observation":
            role, content = "user", TOOL_RESPONSE_START + content + TOOL_RESPONSE_END
        if IMAGE_TAG not in content:
            messages.append({"role": role, "content": content})
            continue
        if role != "user":
            raise ValueError(
                f"sharegpt message {index} ({tag}) holds {IMAGE_TAG}; images are only rendered in user and "
                "observation turns"
            )
        parts: list[dict[str, Any]] = []
        for k, text in enumerate(content.split(IMAGE_TAG)):
            if k > 0:
                parts.append({"type": "image", "image": _resolve(next(next_image), media_dir)})
            if text:
                parts.append({"type": "text", "text": text})
        messages.append({"role": role, "content": parts})
    return messages
