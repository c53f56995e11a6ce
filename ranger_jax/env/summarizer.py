"""web_fetch's optional page reader: an OpenAI-compatible chat model answers the policy's prompt from the page.

Follows Gen-Searcher's `browse` tool: temperature 0, text-only prompt, answer only from
the page and say so when nothing is relevant; long pages are split into overlapping chunks whose answers are
joined as "result part i".
"""

from __future__ import annotations

import asyncio

from ranger_jax.clients import chat
from ranger_jax.env.backends import base

DEFAULT_OVERLAP_CHARS = 4_000
_SYSTEM = ("You read web pages for a research assistant. Answer the question using only the page content below. "
           "Quote names, dates, model numbers, colours and other visual details exactly as the page gives them. "
           "If the page says nothing relevant, reply plainly that it has no relevant information.")


def split_chunks(text: str, chunk_chars: int, overlap_chars: int = DEFAULT_OVERLAP_CHARS) -> list[str]:
    """`text` in windows of `chunk_chars` characters that overlap by `overlap_chars` (one window if it fits)."""
    if len(text) <= chunk_chars:
        return [text]
    overlap = min(overlap_chars, chunk_chars // 4)
    step = chunk_chars - overlap
    return [text[start : start + chunk_chars] for start in range(0, len(text) - overlap, step)]


class PageSummarizer:
    """Answers a question from a page with a chat model.

    Args:
        client: the chat endpoint.
        max_tokens: answer tokens per chunk.
        chunk_chars: page characters per call.
    """

    def __init__(self, client: chat.ChatClient, *, max_tokens: int, chunk_chars: int):
        self.client = client
        self.max_tokens = max_tokens
        self.chunk_chars = chunk_chars

    async def _ask(self, page: base.Page, prompt: str, chunk: str) -> str:
        header = f"Page: {page.url}\nTitle: {page.title or '(none)'}" + (f"\nDate: {page.date}" if page.date else "")
        messages = [{"role": "system", "content": _SYSTEM},
                    {"role": "user", "content": f"Question: {prompt}\n\n{header}\n\n{chunk}"}]
        result = await self.client.acomplete(messages, temperature=0.0, max_tokens=self.max_tokens)
        return result.content.strip()

    async def answer(self, page: base.Page, prompt: str) -> str:
        """The model's answer to `prompt` from `page` (joined per chunk for long pages).

        Raises:
            ClientError: the chat endpoint failed after its retries.
        """
        chunks = split_chunks(page.text, self.chunk_chars)
        answers = await asyncio.gather(*(self._ask(page, prompt, c) for c in chunks))
        if len(answers) == 1:
            return answers[0]
        return "\n\n".join(f"result part {i + 1}:\n{a}" for i, a in enumerate(answers))

    async def aclose(self) -> None:
        """Closes the chat client."""
        await self.client.aclose()
