"""Loopback services for eval runs (tests/evals): an OpenAI-compatible judge and an SGLang images API.

The judge answers from a table {judge kind: {text fragment: reply}}: the kind is the JSON schema the request names
(`kscore`, `savanna_search`, `savanna_generation`), else `mind_bench` (a checklist) or `wise`; the reply is the one
whose fragment (e.g. an item's "[k1]" marker) appears in the request's text. The generator draws a 4×4 PNG whose
colour is the number of references (0 → black), and refuses prompts containing FAILGEN (or another
fragment of `fail_on`) with HTTP 400.
"""

from __future__ import annotations

import base64
import io
import json
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path

from PIL import Image

from support.loopback import Reply

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "evals"


def completion(content: str) -> dict:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


def user_text(body: dict) -> str:
    content = body["messages"][-1]["content"]
    return content if isinstance(content, str) else "\n".join(p.get("text", "") for p in content)


def judge_kind(body: dict) -> str:
    schema = (body.get("response_format") or {}).get("json_schema") or {}
    if schema.get("name"):
        return schema["name"]
    return "mind_bench" if "Checklist to Verify" in user_text(body) else "wise"


class JudgeServer:
    """Scripted judge replies (see the module docstring); records every request body."""

    def __init__(self):
        self.replies: dict[str, dict[str, str]] = {}
        self.bodies: list[dict] = []

    def __call__(self, req) -> Reply:
        body = req.json()
        self.bodies.append(body)
        kind, text = judge_kind(body), user_text(body)
        table = self.replies.get(kind, {})
        content = next((reply for fragment, reply in table.items() if fragment in text), "no verdict")
        return Reply.json(completion(content))


def png_b64(color) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), color).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def form_fields(req) -> list[tuple[str, str]]:
    head = b"Content-Type: " + req.headers["Content-Type"].encode() + b"\r\n\r\n"
    message = BytesParser(policy=HTTP).parsebytes(head + req.body)
    return [(p.get_param("name", header="content-disposition"), p.get_content()) for p in message.iter_parts()]


class GeneratorServer:
    """SGLang's /v1/images/generations and /v1/images/edits; records (prompt, number of references)."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []
        self.fail_on = {"FAILGEN"}  # prompts containing any of these fragments are refused

    def reply(self, prompt: str, num_refs: int) -> Reply:
        self.calls.append((prompt, num_refs))
        if any(fragment in prompt for fragment in self.fail_on):
            return Reply.json({"detail": "the pipeline rejected the prompt"}, status=400)
        return Reply.json({"created": 1, "data": [{"b64_json": png_b64((40 * num_refs, 40 * num_refs, 40 * num_refs)),
                                                   "url": None}]})

    def generations(self, req) -> Reply:
        return self.reply(req.json()["prompt"], 0)

    def edits(self, req) -> Reply:
        fields = form_fields(req)
        return self.reply(dict(fields)["prompt"], sum(1 for k, _ in fields if k == "url"))


def kscore_reply(f, v, t, a, na=False) -> str:
    return json.dumps({"rationale": "Constraints: invented.", "faithfulness": f, "visual_correctness": v,
                       "text_accuracy": t, "aesthetics": a, "text_accuracy_na": na})
