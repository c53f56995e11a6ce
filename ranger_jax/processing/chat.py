"""Qwen3-VL ChatML rendering to token ids, built by concatenating per-segment ids.

A conversation is rendered exactly as the Qwen3-VL-Instruct chat template (`chat_template.json`, shipped
with this package) followed by the processor's image expansion: every image becomes `<|vision_start|>`,
t*h*w/merge² `<|image_pad|>` and `<|vision_end|>`. The ids are built segment by segment, so a rollout can
append turns one at a time and stay token-exact: the policy's sampled ids are never re-tokenized, only
the text the environment supplies is encoded.

    prefix = render_prefix(system, user, date=...)   <|im_start|>system\\n…<|im_end|>\\n<|im_start|>user\\n…<|im_end|>\\n
    generation_prompt()                              <|im_start|>assistant\\n
    assistant_generated(sampled_ids)                 …<|im_end|>              (loss mask 1)
    assistant_suffix()                               \\n
    render_tool_response(text, images_grid_thw=…)    <|im_start|>user\\n<images><tool_response>\\n…\\n</tool_response><|im_end|>\\n

Tool responses carry their images before the text (the order Gen-Searcher trains with).
The only place the segment-wise ids can differ from tokenizing the template's string in one piece is an
assistant turn whose content starts with whitespace that BPE would merge with the `assistant\\n` header;
the segment-wise form is what the policy sees when it generates after the generation prompt.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.resources
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ranger_jax.processing import image as image_lib
from ranger_jax.processing.tokenizer import Tokenizer

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
TOOL_RESPONSE_START = "<tool_response>\n"
TOOL_RESPONSE_END = "\n</tool_response>"
_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|im_end|>\n"
)


def qwen3_vl_chat_template() -> str:
    """The Jinja chat template of Qwen/Qwen3-VL-8B-Instruct (the hub's `chat_template.json`)."""
    text = importlib.resources.files("ranger_jax.processing").joinpath("chat_template.json").read_text("utf-8")
    return json.loads(text)["chat_template"]


@dataclasses.dataclass(frozen=True)
class Rendered:
    """Token ids of (part of) a conversation.

    Attributes:
        ids: `[T] int32` token ids, images expanded to their placeholder runs.
        loss_mask: `[T] bool`, True on assistant-generated tokens (content and the closing `<|im_end|>`).
        image_spans: per image in order, (index of its first `<|image_pad|>`, number of pads).
        image_grid_thw: `[num_images, 3] int64`, the grids the pads were sized from.
    """

    ids: np.ndarray
    loss_mask: np.ndarray
    image_spans: tuple[tuple[int, int], ...]
    image_grid_thw: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    @property
    def num_images(self) -> int:
        """Number of images whose placeholder runs the ids hold."""
        return len(self.image_spans)

    def __add__(self, other: Rendered) -> Rendered:
        return concat([self, other])


def concat(parts: Sequence[Rendered]) -> Rendered:
    """Concatenates rendered segments in order, shifting image spans by the preceding lengths."""
    spans, offset = [], 0
    for part in parts:
        spans.extend((start + offset, count) for start, count in part.image_spans)
        offset += len(part)
    return Rendered(
        ids=np.concatenate([p.ids for p in parts]).astype(np.int32) if parts else np.zeros(0, np.int32),
        loss_mask=np.concatenate([p.loss_mask for p in parts]).astype(bool) if parts else np.zeros(0, bool),
        image_spans=tuple(spans),
        image_grid_thw=(np.concatenate([p.image_grid_thw for p in parts]) if parts
                        else np.zeros((0, 3), np.int64)).astype(np.int64),
    )


class _Builder:
    """Accumulates ids, mask, image spans and grids."""

    def __init__(self):
        self.ids: list[int] = []
        self.mask: list[bool] = []
        self.spans: list[tuple[int, int]] = []
        self.grids: list[np.ndarray] = []

    def add(self, ids: Sequence[int], *, trained: bool) -> None:
        self.ids.extend(ids)
        self.mask.extend([trained] * len(ids))

    def add_image(self, grid: np.ndarray, count: int, pad_id: int) -> None:
        self.spans.append((len(self.ids), count))
        self.grids.append(grid)
        self.add([pad_id] * count, trained=False)

    def build(self) -> Rendered:
        return Rendered(
            ids=np.asarray(self.ids, np.int32),
            loss_mask=np.asarray(self.mask, bool),
            image_spans=tuple(self.spans),
            image_grid_thw=np.asarray(self.grids, np.int64).reshape(-1, 3),
        )


class _Image:
    """Marks where an image part sits among a turn's text pieces."""


_IMAGE = _Image()


def _as_grids(images_grid_thw: Any) -> np.ndarray:
    grids = np.asarray(images_grid_thw, dtype=np.int64)
    if grids.size == 0:
        return np.zeros((0, 3), np.int64)
    if grids.ndim != 2 or grids.shape[1] != 3:
        raise ValueError(f"images_grid_thw must be [num_images, 3], got shape {list(grids.shape)}")
    return grids


def _is_image_part(part: Mapping) -> bool:
    # The template's own test, in its order: a part with an image key is an image whatever its type.
    return part.get("type") == "image" or "image" in part or "image_url" in part


def _is_video_part(part: Mapping) -> bool:
    return part.get("type") == "video" or "video" in part


class ChatRenderer:
    """Renders Qwen3-VL ChatML conversations (or single turns) to ids, loss masks and image slots.

    Args:
        tokenizer: from `load_tokenizer`.
        merge_size: vision `spatial_merge_size`; an image of grid (t, h, w) takes t*h*w/merge_size² pads.
    """

    def __init__(self, tokenizer: Tokenizer, *, merge_size: int = 2):
        self.tokenizer = tokenizer
        self.merge_size = merge_size
        self._generation_prompt = tokenizer.encode("<|im_start|>assistant\n")
        self._newline = tokenizer.encode("\n")

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        images_grid_thw: Any = (),
        add_generation_prompt: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Rendered:
        """Renders a conversation as the Qwen3-VL template does, images expanded.

        Args:
            messages: ChatML dicts with `role` (system first only, user, assistant, tool) and `content`, a
                string or a list of parts `{"type": "text", "text": …}` / `{"type": "image", …}`. Assistant
                messages may carry OpenAI-style `tool_calls`; consecutive `tool` messages share one user turn.
            images_grid_thw: `[num_images, 3]`, one grid per image part in order of appearance.
            add_generation_prompt: append `<|im_start|>assistant\\n`.
            tools: OpenAI function schemas for the template's `# Tools` system block.

        Returns:
            The rendered conversation; `loss_mask` is True on assistant content, tool calls and `<|im_end|>`.

        Raises:
            ValueError: naming the message, when the image parts and grids disagree in number, a role or
                part is not supported, or supplied text contains vision tokens.
        """
        if not messages:
            raise ValueError("messages is empty")
        grids = _as_grids(images_grid_thw)
        num_parts = sum(
            1 for m in messages if isinstance(m.get("content"), list)
            for p in m["content"] if isinstance(p, Mapping) and _is_image_part(p)
        )
        if num_parts != len(grids):
            raise ValueError(
                f"messages hold {num_parts} image parts but images_grid_thw has {len(grids)} rows"
            )
        builder, next_grid = _Builder(), iter(grids)
        has_system = messages[0].get("role") == "system"
        if tools:
            system = "<|im_start|>system\n"
            if has_system:
                system += self._text_only(messages[0], 0) + "\n\n"
            system += _TOOLS_HEADER + "".join(
                "\n" + json.dumps(dict(tool), ensure_ascii=False) for tool in tools
            ) + _TOOLS_FOOTER
            self._add_turn(builder, [system], next_grid, where="the system/tools block")
        elif has_system:
            text = "<|im_start|>system\n" + self._text_only(messages[0], 0) + "<|im_end|>\n"
            self._add_turn(builder, [text], next_grid, where="message 0 (system)")
        index = 1 if has_system else 0
        while index < len(messages):
            message = messages[index]
            role = message.get("role")
            if role == "user":
                pieces = ["<|im_start|>user\n", *self._pieces(message, index), "<|im_end|>\n"]
                self._add_turn(builder, pieces, next_grid, where=f"message {index} (user)")
            elif role == "assistant":
                builder.add(self._generation_prompt, trained=False)
                text = self._text_only(message, index) + self._tool_calls_text(message, index)
                builder.add(self._encode_plain(text, where=f"message {index} (assistant)"), trained=True)
                builder.add([self.tokenizer.im_end_id], trained=True)
                builder.add(self._newline, trained=False)
            elif role == "tool":
                pieces = ["<|im_start|>user"]
                first = index
                while index < len(messages) and messages[index].get("role") == "tool":
                    pieces += ["\n" + TOOL_RESPONSE_START, *self._pieces(messages[index], index), TOOL_RESPONSE_END]
                    index += 1
                pieces.append("<|im_end|>\n")
                self._add_turn(builder, pieces, next_grid, where=f"messages {first}..{index - 1} (tool)")
                continue
            elif role == "system":
                raise ValueError(f"message {index} has role 'system'; a system message may only come first")
            else:
                raise ValueError(
                    f"message {index} has role {role!r}; supported roles are system, user, assistant, tool"
                )
            index += 1
        if add_generation_prompt:
            builder.add(self._generation_prompt, trained=False)
        return builder.build()

    def render_prefix(
        self,
        system: str,
        user: str,
        *,
        date: datetime.date | str | None,
        images_grid_thw: Any = (),
    ) -> Rendered:
        """The system turn (prompt + date, no separator, as Gen-Searcher does) and the first user turn.

        Args:
            system: the system prompt (with its own `# Tools` block).
            user: the task prompt.
            date: today's date appended to the system prompt ("YYYY-MM-DD"); None appends nothing.
            images_grid_thw: grids of images attached to the task, placed before its text.
        """
        date_text = "" if date is None else (date if isinstance(date, str) else date.isoformat())
        grids = _as_grids(images_grid_thw)
        user_content = [{"type": "image"} for _ in range(len(grids))] + [{"type": "text", "text": user}]
        messages = [{"role": "system", "content": system + date_text}, {"role": "user", "content": user_content}]
        return self.render(messages, images_grid_thw=grids)

    def render_user(self, text: str, *, images_grid_thw: Any = ()) -> Rendered:
        """A user turn `<|im_start|>user\\n<images>{text}<|im_end|>\\n`, images before text."""
        grids = _as_grids(images_grid_thw)
        content = [{"type": "image"} for _ in range(len(grids))] + [{"type": "text", "text": text}]
        return self.render([{"role": "user", "content": content}], images_grid_thw=grids)

    def render_tool_response(self, text: str, *, images_grid_thw: Any = ()) -> Rendered:
        """A tool result as a user turn: images, then `<tool_response>\\n{text}\\n</tool_response>`."""
        return self.render_user(TOOL_RESPONSE_START + text + TOOL_RESPONSE_END, images_grid_thw=images_grid_thw)

    def generation_prompt(self) -> Rendered:
        """`<|im_start|>assistant\\n`, loss mask 0."""
        return self._plain(self._generation_prompt, trained=False)

    def assistant_generated(self, ids: Sequence[int] | np.ndarray) -> Rendered:
        """The policy's sampled ids as they are (normally ending in `<|im_end|>`), loss mask 1.

        Raises:
            ValueError: naming the position, if the ids hold a vision token (it would desynchronise the
                image placeholders from the pixels).
        """
        ids = np.asarray(ids, np.int64).reshape(-1)
        bad = np.flatnonzero(np.isin(ids, list(self.tokenizer.vision_ids)))
        if bad.size:
            pos = int(bad[0])
            raise ValueError(
                f"generated ids hold vision token {self.tokenizer.id_to_token(int(ids[pos]))!r} at position "
                f"{pos}; mask vision tokens out of the sampler's logits"
            )
        return self._plain(ids.tolist(), trained=True)

    def assistant_suffix(self) -> Rendered:
        """The `\\n` that follows an assistant turn's `<|im_end|>`, loss mask 0."""
        return self._plain(self._newline, trained=False)

    def image_token_count(self, grid_thw: Any) -> int:
        """Placeholders one image of `grid_thw` takes."""
        return image_lib.image_token_count(grid_thw, merge_size=self.merge_size)

    def _plain(self, ids: Sequence[int], *, trained: bool) -> Rendered:
        builder = _Builder()
        builder.add(ids, trained=trained)
        return builder.build()

    def _pieces(self, message: Mapping[str, Any], index: int) -> list[str | _Image]:
        """Text pieces and image markers of a user or tool message."""
        content = self._content(message, index)
        if isinstance(content, str):
            return [content]
        pieces: list[str | _Image] = []
        for k, part in enumerate(content):
            if not isinstance(part, Mapping):
                raise ValueError(f"message {index} content part {k} is a {type(part).__name__}, not a dict")
            if _is_image_part(part):
                pieces.append(_IMAGE)
            elif _is_video_part(part):
                raise ValueError(f"message {index} content part {k} is a video; only images are supported")
            elif "text" in part:
                pieces.append(part["text"])
            else:
                raise ValueError(f"message {index} content part {k} has neither text nor image: {sorted(part)}")
        return pieces

    def _content(self, message: Mapping[str, Any], index: int) -> str | list:
        content = message.get("content")
        if not isinstance(content, (str, list)):
            raise ValueError(
                f"message {index} content must be a string or a list of parts, got {type(content).__name__}"
            )
        return content

    def _text_only(self, message: Mapping[str, Any], index: int) -> str:
        """Text of a system or assistant message, whose images the template would silently drop."""
        content = self._content(message, index)
        if isinstance(content, str):
            return content
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, Mapping) or "text" not in part or _is_image_part(part) or _is_video_part(part):
                raise ValueError(
                    f"message {index} ({message.get('role')}) content part {k} is not a text part; images are "
                    "only rendered in user and tool messages"
                )
            texts.append(part["text"])
        return "".join(texts)

    def _tool_calls_text(self, message: Mapping[str, Any], index: int) -> str:
        calls = message.get("tool_calls") or []
        text = ""
        for k, call in enumerate(calls):
            if k > 0 or message.get("content"):
                text += "\n"
            if call.get("function"):
                call = call["function"]
            if "name" not in call:
                raise ValueError(f"message {index} tool call {k} has no name")
            arguments = call.get("arguments")
            arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            text += '<tool_call>\n{"name": "' + str(call["name"]) + '", "arguments": ' + arguments + "}\n</tool_call>"
        return text

    def _encode_plain(self, text: str, *, where: str) -> list[int]:
        """Ids of text that must not produce vision tokens."""
        ids = self.tokenizer.encode(text)
        for token_id in ids:
            if token_id in self.tokenizer.vision_ids:
                raise ValueError(
                    f"text of {where} contains {self.tokenizer.id_to_token(token_id)!r}; vision tokens may only "
                    "come from image parts (strip them from the text)"
                )
        return ids

    def _add_turn(self, builder: _Builder, pieces: Sequence[str | _Image], next_grid, *, where: str) -> None:
        """Encodes a mask-0 turn in one piece (as the template's string is) and expands its image pads."""
        text = "".join(IMAGE_PLACEHOLDER if p is _IMAGE else p for p in pieces)
        num_images = sum(p is _IMAGE for p in pieces)
        ids = self.tokenizer.encode(text)
        tok = self.tokenizer
        counts = {t: ids.count(t) for t in tok.vision_ids}
        expected = {t: 0 for t in tok.vision_ids}
        expected.update({tok.vision_start_id: num_images, tok.image_pad_id: num_images,
                         tok.vision_end_id: num_images})
        if counts != expected:
            extra = next(t for t in tok.vision_ids if counts[t] != expected[t])
            raise ValueError(
                f"text of {where} contains {tok.id_to_token(extra)!r}; vision tokens may only come from image "
                "parts (strip them from the text)"
            )
        start = 0
        for pos in [i for i, token_id in enumerate(ids) if token_id == tok.image_pad_id]:
            builder.add(ids[start:pos], trained=False)
            grid = next(next_grid)
            builder.add_image(grid, self.image_token_count(grid), tok.image_pad_id)
            start = pos + 1
        builder.add(ids[start:], trained=False)
