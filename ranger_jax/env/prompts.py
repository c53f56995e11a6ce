"""The text the environment shows the policy: system prompt, tool block, and the fixed control messages."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

_ROLE = """You prepare requests for an image generator. The user asks for a picture of something that may be new, \
obscure or easy to confuse with similar things. Use the tools to find the missing facts and clean visual \
references, then hand over a generation-ready prompt grounded in what you found."""

_RULES = """# How to respond
Every turn: optionally think inside <think>...</think>, then output exactly ONE of:
- one tool call: <tool_call>
{{"name": <tool name>, "arguments": {{...}}}}
</tool_call>
- the final answer: <answer>
{{"gen_prompt": "...", "reference_images": [{{"img_id": "IMG_001", "note": "what this image shows"}}]}}
</answer>
Never put two tool calls, or a tool call and an answer, in one turn. Tool results come back in \
<tool_response>...</tool_response>.

# Working rules
{tool_rules}
- Budget: at most {max_tool_calls} tool calls in total; use as few as you can and never repeat a query.
- Images are identified only by ids like IMG_007 (ids need not start at 001). Cite ids, never URLs or paths.
- Answer: gen_prompt describes the picture to generate and refers to references as "the first reference image", \
"the second reference image", ... in the order of reference_images; list at most {max_refs} references, \
sorted by id, one per distinct subject, no duplicates.
- A message saying FINAL STEP means: no more tools, output the <answer> now. A message saying RESPONSE TOO LONG \
means: skip the thinking and output only the tool call or the answer."""

# One working rule per tool, in this order; the prompt states only those of the enabled tools.
TOOL_RULES = {
    "text_search": "- Locate: text_search for names, dates, editions, credits and distinguishing details.",
    "image_search": "- Corroborate: use image_search at least once. Look-alikes (earlier editions, other colourways, "
                    "sibling products) often rank first; check each candidate against several sources before you "
                    "trust it.",
    "crop_image": "- Isolate: when the subject sits in a crowded photo, crop_image it with a normalised box "
                  "[x0, y0, x1, y1] (fractions 0-1 of width and height); the crop gets a new image id you can cite.",
    "web_fetch": "- web_fetch reads a page when snippets are not enough.",
    "find_object": "- find_object finds the object matching a colour-and-pattern description in the images you have "
                   "seen and crops it; the crop gets a new image id you can cite.",
}

_TOOLS_HEADER = """# Tools

You may call one of the following functions per turn.

You are provided with function signatures within <tools></tools> XML tags:
<tools>"""

FINAL_STEP = ("FINAL STEP: you have no tool calls left. Do not think and do not call tools; output only "
              '<answer>{"gen_prompt": "...", "reference_images": [{"img_id": "IMG_###", "note": "..."}]}</answer> '
              "now, citing only image ids you have seen.")
RESPONSE_TOO_LONG = ("=== RESPONSE TOO LONG === Your last response was cut off at the length limit and was not "
                     "executed. Skip the thinking and output only the <tool_call> or the <answer> JSON.")
INVALID_FORMAT = ("Error: Invalid format. You MUST output exactly one of <tool_call>{{...}}</tool_call> or "
                  "<answer>{{...}}</answer> after your thinking. Problem: {problem}")


# Token strings that only the chat renderer may place: text that spells them would be encoded as the special ids,
# so a page saying "<|image_pad|>" would desynchronise image placeholders from pixels, and "<|im_end|>" would
# forge turn boundaries (a known way multi-turn VLM rollouts end with image tokens and features out of step).
CONTROL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|vision_start|>", "<|vision_end|>",
                  "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
_CONTROL = re.compile("|".join(re.escape(token) for token in CONTROL_TOKENS))


def strip_control_tokens(text: str) -> str:
    """`text` with every literal chat-control or vision token string (CONTROL_TOKENS) removed."""
    return _CONTROL.sub("", text)


_SURROGATE = re.compile("[\ud800-\udfff]")


def renderable(text: str) -> str:
    """`text` fit for the chat renderer: no control tokens (`strip_control_tokens`) and valid UTF-8.

    JSON escapes in a tool call (`"\\ud800"`) can put lone UTF-16 surrogates into arguments that tool output
    echoes; they cannot be encoded, so surrogate pairs are joined and lone ones become U+FFFD.
    """
    if _SURROGATE.search(text):
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return strip_control_tokens(text)


def tool_block(schemas: list[dict[str, Any]]) -> str:
    """The Hermes-style `# Tools` block: one JSON schema per line inside `<tools></tools>`."""
    lines = [_TOOLS_HEADER, *(json.dumps(s, ensure_ascii=False) for s in schemas), "</tools>"]
    lines.append("\nFor the function call, return a json object with function name and arguments within "
                 "<tool_call></tool_call> XML tags:\n<tool_call>\n"
                 '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
    return "\n".join(lines)


def system_prompt(schemas: list[dict[str, Any]], *, today: dt.date, max_tool_calls: int, max_refs: int) -> str:
    """The full system prompt: role, protocol rules (a working rule for each tool in `schemas`, none for others),
    tool block and today's date."""
    names = {schema["function"]["name"] for schema in schemas}
    tool_rules = "\n".join(rule for name, rule in TOOL_RULES.items() if name in names)
    rules = _RULES.format(max_tool_calls=max_tool_calls, max_refs=max_refs, tool_rules=tool_rules)
    return f"{_ROLE}\n\n{rules}\n\n{tool_block(schemas)}\n\nToday's date: {today.isoformat()}"


_COMPACT = """Find what the user's picture needs, then answer. Each turn output exactly one \
<tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call> or <answer>{{"gen_prompt": "...", \
"reference_images": [{{"img_id": "IMG_001", "note": "..."}}]}}</answer>. At most {max_tool_calls} tool calls; \
cite at most {max_refs} image ids.
Tools:"""


def _signature(schema: dict[str, Any]) -> str:
    """`name(arg, arg?)`: a tool's name and arguments, optional ones marked with `?`."""
    function = schema["function"]
    required = set(function["parameters"].get("required", ()))
    args = ", ".join(a + ("" if a in required else "?") for a in function["parameters"]["properties"])
    return f"{function['name']}({args})"


def compact_system_prompt(schemas: list[dict[str, Any]], *, today: dt.date, max_tool_calls: int,
                          max_refs: int) -> str:
    """A short system prompt (the protocol and one line per tool, about 150 tokens) for small policies with
    short contexts; the tools, formats and limits are those of `system_prompt`."""
    head = _COMPACT.format(max_tool_calls=max_tool_calls, max_refs=max_refs)
    lines = [head, *(f"- {_signature(s)}: {s['function']['description']}" for s in schemas)]
    return "\n".join(lines) + f"\nToday's date: {today.isoformat()}"


def date_system_prompt(schemas: list[dict[str, Any]], *, today: dt.date, max_tool_calls: int, max_refs: int) -> str:
    """Only today's date: for a policy trained from scratch, which learns the tools and formats from its data and for
    which every fixed prompt token is context it must learn to look past (see `docs/sim_tiny.md`)."""
    del schemas, max_tool_calls, max_refs  # learned from the data, not read
    return f"Today's date: {today.isoformat()}"


PROMPT_STYLES = {"full": system_prompt, "compact": compact_system_prompt, "date": date_system_prompt}


def tool_response(body: str) -> str:
    """`body` wrapped in the `<tool_response>` tags of the chat format."""
    return f"<tool_response>\n{body}\n</tool_response>"


def invalid_format(problem: str) -> str:
    """The observation for a malformed turn, naming the `problem`."""
    return INVALID_FORMAT.format(problem=problem)
