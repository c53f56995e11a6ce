"""Parsing one policy turn: `<think>`, exactly one `<tool_call>` or `<answer>`, json5-tolerant bodies.

Nothing here raises on policy text except the documented `FormatError` / `AnswerError`, whose messages are written
for the policy and become observations: the policy reads what was wrong and can correct itself next turn.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import json5

from ranger_jax.env import core

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
RESPONSE_OPEN = "<tool_response>"
MAX_LENIENT_CHARS = 20_000  # json5 (pure Python, ~0.1 MB/s) is tried only on bodies up to this length
MAX_IMG_NUMBER_DIGITS = 6  # IMG_999999: longer numbers are not image ids (and int() of huge ones raises)
_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)
_IMG_ID = re.compile(r"^\s*img[_\-\s]?0*([0-9]{1,%d})\s*$" % MAX_IMG_NUMBER_DIGITS, re.IGNORECASE | re.ASCII)


class FormatError(ValueError):
    """The turn does not follow the output protocol; the message tells the policy how to fix it."""


class AnswerError(ValueError):
    """An `<answer>` whose body cannot be used; the message says why."""


@dataclasses.dataclass(frozen=True)
class Turn:
    """The protocol blocks found in one assistant turn (after the thinking).

    Attributes:
        calls: bodies of closed `<tool_call>` blocks, in order.
        answers: bodies of closed `<answer>` blocks, in order.
        unclosed_call: a `<tool_call>` without its closing tag.
        unclosed_answer: an `<answer>` without its closing tag.
    """

    calls: tuple[str, ...]
    answers: tuple[str, ...]
    unclosed_call: bool
    unclosed_answer: bool


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A parsed `<tool_call>`: the tool name and its JSON arguments."""

    name: str
    arguments: dict[str, Any]


def _blocks(text: str, open_tag: str, close_tag: str) -> tuple[list[str], bool]:
    bodies, pos = [], 0
    while (start := text.find(open_tag, pos)) != -1:
        end = text.find(close_tag, start + len(open_tag))
        if end == -1:
            return bodies, True
        bodies.append(text[start + len(open_tag) : end])
        pos = end + len(close_tag)
    return bodies, False


def split_turn(text: str) -> Turn:
    """Finds the protocol blocks of one assistant turn.

    Thinking (everything up to the first `</think>`) is skipped, and so is anything from a `<tool_response>` the
    policy wrote itself.

    Raises:
        FormatError: a `<think>` that is never closed.
    """
    if THINK_CLOSE in text:
        text = text.split(THINK_CLOSE, 1)[1]
    elif THINK_OPEN in text:
        raise FormatError(f"your {THINK_OPEN} was never closed; end the thinking with {THINK_CLOSE}, then give "
                          f"exactly one {CALL_OPEN}…{CALL_CLOSE} or {ANSWER_OPEN}…{ANSWER_CLOSE}")
    text = text.split(RESPONSE_OPEN, 1)[0]
    calls, unclosed_call = _blocks(text, CALL_OPEN, CALL_CLOSE)
    answers, unclosed_answer = _blocks(text, ANSWER_OPEN, ANSWER_CLOSE)
    return Turn(tuple(calls), tuple(answers), unclosed_call, unclosed_answer)


def _strip_fence(body: str) -> str:
    if m := _FENCE.match(body):
        return m.group(1)
    return body.strip()


def parse_json_object(body: str, what: str) -> dict[str, Any]:
    """The JSON object in `body` (strict JSON first, then json5: single quotes, trailing commas, comments).

    Raises:
        FormatError: naming `what` when there is no object.
    """
    text = _strip_fence(body)
    start, end = text.find("{"), text.rfind("}")
    if start == -1 or end < start:
        raise FormatError(f"the {what} must be a JSON object {{…}}; got {text[:200]!r}")
    candidate = text[start : end + 1]
    try:
        obj = json.loads(candidate)
    except RecursionError as err:
        raise FormatError(f"the {what} nests too deeply to parse; got {candidate[:200]!r}") from err
    except ValueError as err:
        if len(candidate) > MAX_LENIENT_CHARS:  # json5 would block the event loop for seconds
            raise FormatError(f"the {what} is not valid JSON ({err}); it is {len(candidate)} characters long, "
                              f"so only strict JSON is accepted; got {candidate[:200]!r}") from err
        try:
            obj = json5.loads(candidate)
        except RecursionError as err5:
            raise FormatError(f"the {what} nests too deeply to parse; got {candidate[:200]!r}") from err5
        except ValueError as err5:
            raise FormatError(f"the {what} is not valid JSON ({err5}); got {candidate[:200]!r}") from err5
    if not isinstance(obj, dict):
        raise FormatError(f"the {what} must be a JSON object; got {type(obj).__name__}")
    return obj


def parse_tool_call(body: str) -> ToolCall:
    """`{"name": …, "arguments": {…}}` from a `<tool_call>` body.

    Also accepts `arguments` as a JSON string (OpenAI style), `parameters` for `arguments`, and an OpenAI
    `{"function": {…}}` wrapper.

    Raises:
        FormatError: with what is wrong.
    """
    obj = parse_json_object(body, "tool call")
    if isinstance(obj.get("function"), dict) and "name" not in obj:
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise FormatError(f'the tool call needs a "name" string; got keys {sorted(obj)}')
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = parse_json_object(arguments, f"arguments of {name}") if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise FormatError(f'"arguments" of {name} must be a JSON object; got {type(arguments).__name__}')
    return ToolCall(name=name.strip(), arguments=arguments)


def _protocol_json(obj: dict[str, Any]) -> str:
    """`obj` as JSON whose strings spell no `<`, so no tag inside a value (`</tool_call>`, `<answer>`) can end or
    open a protocol block; JSON reads `\\u003c` back as `<`."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")


def format_tool_call(name: str, arguments: Mapping[str, Any] | None = None) -> str:
    """The `<tool_call>` block that calls tool `name` with `arguments`, exactly as `parse_tool_call` reads it and
    as the system prompt shows it: `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`. Any argument
    value round-trips, even one that spells a protocol tag.

    Raises:
        ValueError: `name` is not a non-empty string, or `arguments` is not a JSON object (NaN included).
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a tool call needs a non-empty tool name; got {name!r}")
    arguments = {} if arguments is None else arguments
    if not isinstance(arguments, Mapping):
        raise ValueError(f"arguments of {name} must be a mapping (a JSON object); got {type(arguments).__name__}")
    try:
        body = _protocol_json({"name": name, "arguments": dict(arguments)})
    except (TypeError, ValueError) as err:
        raise ValueError(f"arguments of {name} are not JSON: {err}") from err
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def format_answer(gen_prompt: str, reference_images: Sequence[str | Mapping[str, str]] = ()) -> str:
    """The `<answer>` block with a generation prompt and the cited image ids, as `parse_answer` reads it.

    Args:
        gen_prompt: the grounded prompt for the image generator.
        reference_images: image ids (`"IMG_003"`) or `{"img_id": …, "note": …}` dicts, in the order the prompt's
            "first/second reference image" follow.

    Raises:
        ValueError: an empty prompt or a reference that is neither an id string nor a mapping with `img_id`.
    """
    if not isinstance(gen_prompt, str) or not gen_prompt.strip():
        raise ValueError(f"an answer needs a non-empty gen_prompt; got {gen_prompt!r}")
    refs = []
    for i, ref in enumerate(reference_images):
        if isinstance(ref, str):
            ref = {"img_id": ref}
        if not isinstance(ref, Mapping) or not isinstance(ref.get("img_id"), str):
            raise ValueError(f"reference_images[{i}] must be an image id or a mapping with 'img_id'; got {ref!r}")
        refs.append({"img_id": ref["img_id"], "note": str(ref.get("note", ""))})
    body = _protocol_json({"gen_prompt": gen_prompt, "reference_images": refs})
    return f"{ANSWER_OPEN}\n{body}\n{ANSWER_CLOSE}"


def normalise_img_id(value: object) -> str | None:
    """`IMG_###` for an image-id-like value (`img_3`, `IMG_003`, `IMG-3`; ASCII digits, at most 6), else None."""
    if not isinstance(value, str):
        return None
    m = _IMG_ID.match(value)
    return format_img_id(int(m.group(1))) if m else None


def format_img_id(index: int) -> str:
    """The image id the policy sees for the image at `index` (`IMG_001` style)."""
    return f"IMG_{index:03d}"


def parse_answer(body: str, known_ids: Collection[str], *, drop_unknown: bool, max_refs: int) -> core.Answer:
    """The final answer from an `<answer>` body.

    Args:
        body: text between `<answer>` and `</answer>`.
        known_ids: image ids the policy has seen in this episode.
        drop_unknown: silently drop unknown ids (the forced final turn) instead of failing.
        max_refs: keep at most this many references (first ones win).

    Raises:
        AnswerError: invalid JSON, missing or mistyped fields, or an unknown image id.
    """
    try:
        obj = parse_json_object(body, "answer")
    except FormatError as err:
        raise AnswerError(str(err)) from err
    gen_prompt = obj.get("gen_prompt")
    if not isinstance(gen_prompt, str) or not gen_prompt.strip():
        raise AnswerError(f'the answer needs a non-empty "gen_prompt" string; got {gen_prompt!r}')
    refs_in = obj.get("reference_images")
    if refs_in is None:
        raise AnswerError('the answer needs "reference_images": a list of {"img_id": "IMG_###", "note": "..."}')
    if not isinstance(refs_in, list):
        raise AnswerError(f'"reference_images" must be a list; got {type(refs_in).__name__}')
    refs: list[core.AnswerRef] = []
    seen: set[str] = set()
    for i, item in enumerate(refs_in):
        raw_id, note = (item, "") if isinstance(item, str) else (
            (item.get("img_id", item.get("image_id")), item.get("note", "")) if isinstance(item, dict) else (None, "")
        )
        img_id = normalise_img_id(raw_id)
        if img_id is None:
            if drop_unknown:
                continue
            raise AnswerError(f'reference_images[{i}] needs an "img_id" like "IMG_001"; got {item!r}')
        if img_id not in known_ids:
            if drop_unknown:
                continue
            shown = ", ".join(sorted(known_ids)) or "none"
            raise AnswerError(f"reference_images[{i}] cites {img_id}, which was never shown (known ids: {shown})")
        if img_id in seen:
            continue
        seen.add(img_id)
        refs.append(core.AnswerRef(img_id=img_id, note=note if isinstance(note, str) else json.dumps(note)))
    return core.Answer(gen_prompt=gen_prompt.strip(), reference_images=tuple(refs[:max_refs]))
