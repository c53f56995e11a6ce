"""Running checked tool calls against a backend and the image store, and writing their results for the policy.

Every failure a tool can meet (backend errors, refused URLs, bad images, unknown ids, bad boxes) becomes text in
the result; `run` never raises for them. Each result's info reports `error` and `errors` with the failure kinds of
`env.info.ERROR_KINDS`, the same kind for the same failure in every tool. Image ids come from the episode's
`Ledger`, assigned in result order so an episode replays to the same ids.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from ranger_jax.clients import http
from ranger_jax.env import core, images, parsing, summarizer, tools
from ranger_jax.env import info as info_lib
from ranger_jax.env.backends import base

log = logging.getLogger(__name__)

MAX_IMAGE_CANDIDATES = 20  # image hits requested so failed downloads can be replaced


@dataclasses.dataclass
class Ledger:
    """A working copy of an episode's image table while one step runs.

    Attributes:
        images: img_id → record.
        keys: de-duplication key (image url, or crop identity) → img_id.
        next_index: number of the next new id.
    """

    images: dict[str, core.ImageRecord]
    keys: dict[str, str]
    next_index: int

    def add(self, key: str, build: Callable[[str], core.ImageRecord]) -> core.ImageRecord:
        """The record already filed under `key`, or a new one built with the next id."""
        if (known := self.keys.get(key)) is not None:
            return self.images[known]
        img_id = parsing.format_img_id(self.next_index)
        record = build(img_id)
        self.images[img_id] = record
        self.keys[key] = img_id
        self.next_index += 1
        return record


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What one tool call produced: text for `<tool_response>`, images to attach, facts for logging.

    `info` holds `error` (the failure kind that left the call without a result, or None) and `errors` (the kinds of
    every failed part); `ToolRunner.run` fills them in when a tool sets only `error`.
    """

    body: str
    shown: tuple[str, ...] = ()
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[… cut: {len(text) - limit} more characters]"


def _failure_text(err: Exception, what: str) -> str:
    """What the policy is told about a failed call (`what`, e.g. "text_search 'x'").

    Failures of the backend, of a remote service or a rejected image are expected and told as they are; any
    other exception is told with its type and logged with its traceback, as it points at a bug.
    """
    if isinstance(err, (base.BackendError, http.ClientError, images.ImageRejected)):
        return str(err)
    log.warning("%s failed unexpectedly", what, exc_info=err)
    return f"{type(err).__name__}: {err}"


def _format_text_hits(query: str, hits: list[base.TextHit], *, links: bool = True) -> str:
    lines = [f"--- search result for [{query}] ---"]
    if not hits:
        lines.append("No results. Try fewer or different words.")
    for i, hit in enumerate(hits, 1):
        date = f" ({hit.date})" if hit.date else ""
        head = f"[{hit.title}]({hit.url})" if links else hit.title
        lines.append(f"{i}. {head}{date}\n{hit.snippet}".rstrip())
    lines.append("--- end of search result ---")
    return "\n".join(lines)


def _format_image(record: core.ImageRecord, *, links: bool = True) -> str:
    lines = [f"{record.img_id}: title: {record.title or '(none)'}"]
    if record.url and links:
        lines.append(f"url: {record.url}")
    if record.page_url and links:
        lines.append(f"page_url: {record.page_url}")
    lines.append(f"size: {record.width}x{record.height}")
    return "\n".join(lines)


class ToolRunner:
    """Executes typed tool calls for one environment.

    Args:
        backend: search and fetch.
        store: where images are verified and kept.
        config: the env's limits (an `EnvConfig`).
        reader: optional page summariser for web_fetch.
    """

    def __init__(self, backend: base.Backend, store: images.ImageStore, config: Any,
                 reader: summarizer.PageSummarizer | None = None):
        self.backend = backend
        self.store = store
        self.config = config
        self.reader = reader

    @property
    def has_news(self) -> bool:
        """Whether the backend offers news search (`text_search` with `news: true`)."""
        return callable(getattr(self.backend, "news_search", None))

    async def run(self, call: tools.Call, ledger: Ledger) -> ToolResult:
        """Runs `call`; every expected failure is reported in the result text."""
        start = time.perf_counter()
        if isinstance(call, tools.TextSearch):
            result = await self._text_search(call)
        elif isinstance(call, tools.ImageSearch):
            result = await self._image_search(call, ledger)
        elif isinstance(call, tools.WebFetch):
            result = await self._web_fetch(call)
        elif isinstance(call, tools.FindObject):
            result = await asyncio.to_thread(self._find_object, call, ledger)
        else:
            result = self._crop(call, ledger)
        body = _clip(result.body, self.config.max_observation_chars)
        info = {**result.info, "latency_s": round(time.perf_counter() - start, 4)}
        info.setdefault("error", None)
        info.setdefault("errors", [info["error"]] if info["error"] else [])
        return ToolResult(body=body, shown=result.shown, info=info)

    async def _one_text_search(self, query: str, call: tools.TextSearch) -> tuple[str, str | None]:
        try:
            if call.news:
                hits = await self.backend.news_search(query, top_k=call.top_k, tbs=call.tbs)
            else:
                hits = await self.backend.text_search(query, top_k=call.top_k, tbs=call.tbs)
        except Exception as err:  # noqa: BLE001 — any failure is reported to the policy
            failure = _failure_text(err, f"text_search {query!r}")
            return f"--- search result for [{query}] ---\nSearch failed: {failure}\n--- end of search result ---", \
                info_lib.error_kind(err)
        return _format_text_hits(query, list(hits)[: call.top_k], links=self.config.show_links), None

    async def _text_search(self, call: tools.TextSearch) -> ToolResult:
        outs = await asyncio.gather(*(self._one_text_search(q, call) for q in call.queries))
        errors = [e for _, e in outs if e]
        return ToolResult(body="\n\n".join(t for t, _ in outs),
                          info={"tool": tools.TEXT_SEARCH, "queries": list(call.queries),
                                "error": errors[0] if len(errors) == len(outs) else None, "errors": errors})

    async def _download(self, hit: base.ImageHit) -> images.StoredImage | tuple[str, str]:
        """The stored image, or (what went wrong, its failure kind)."""
        try:
            fetched = await self.backend.fetch_image(hit.image_url, page_url=hit.page_url)
            return self.store.add(fetched.data, source=hit.image_url, trusted_file=fetched.trusted_file)
        except Exception as err:  # noqa: BLE001
            return _failure_text(err, f"image download {hit.image_url}"), info_lib.error_kind(err)

    async def _image_search(self, call: tools.ImageSearch, ledger: Ledger) -> ToolResult:
        info: dict[str, Any] = {"tool": tools.IMAGE_SEARCH, "query": call.query}
        header, footer = f"--- image search result for [{call.query}] ---", "--- end of image search result ---"
        try:
            hits = await self.backend.image_search(call.query, top_k=min(2 * call.top_k, MAX_IMAGE_CANDIDATES),
                                                   tbs=call.tbs)
        except Exception as err:  # noqa: BLE001
            info["error"] = info_lib.error_kind(err)
            failure = _failure_text(err, f"image_search {call.query!r}")
            return ToolResult(body=f"{header}\nImage search failed: {failure}\n{footer}", info=info)
        candidates, seen = [], set()
        for hit in hits:
            if hit.image_url and hit.image_url not in seen:
                seen.add(hit.image_url)
                candidates.append(hit)
        shown: list[core.ImageRecord] = []
        failures: list[str] = []
        kinds: list[str] = []
        pos = 0
        while len(shown) < call.top_k and pos < len(candidates):
            batch = candidates[pos : pos + call.top_k - len(shown)]
            pos += len(batch)
            known = {h.image_url: ledger.images[ledger.keys[h.image_url]] for h in batch if h.image_url in ledger.keys}
            results = await asyncio.gather(*(self._download(h) for h in batch if h.image_url not in known))
            fresh = iter(results)
            for hit in batch:
                outcome = known.get(hit.image_url) or next(fresh)
                if isinstance(outcome, tuple):
                    failures.append(f"{hit.image_url}: {outcome[0]}")
                    kinds.append(outcome[1])
                elif isinstance(outcome, core.ImageRecord):
                    shown.append(outcome)
                else:
                    shown.append(ledger.add(hit.image_url, lambda img_id, h=hit, s=outcome: core.ImageRecord(
                        img_id=img_id, path=s.path, sha256=s.sha256, width=s.width, height=s.height,
                        url=h.image_url, page_url=h.page_url, title=h.title, root_url=h.image_url)))
        lines = [header]
        if not shown:
            lines.append("No usable images found. Try a different query of at most 3 words." if not failures else
                         f"Found {len(failures)} images but none could be used.")
        lines.extend(_format_image(r, links=self.config.show_links) for r in shown)
        if failures:
            lines.append(f"({len(failures)} result(s) skipped: " + "; ".join(failures[:3]) + ")")
        lines.append(footer)
        info.update(num_hits=len(hits), num_failed=len(failures), img_ids=[r.img_id for r in shown],
                    error=kinds[0] if kinds and not shown else None, errors=kinds)
        return ToolResult(body="\n".join(lines), shown=tuple(r.img_id for r in shown), info=info)

    async def _read_one(self, url: str, prompt: str, limit: int) -> tuple[str, str | None]:
        header, footer = f"--- page [{url}] ---", "--- end of page ---"
        try:
            page = await self.backend.fetch_page(url)
        except Exception as err:  # noqa: BLE001
            failure = _failure_text(err, f"web_fetch {url}")
            return f"{header}\nCould not read the page: {failure}\n{footer}", info_lib.error_kind(err)
        meta = f"title: {page.title or '(none)'}" + (f"\ndate: {page.date}" if page.date else "")
        if page.url != url:
            meta = f"final url: {page.url}\n{meta}"
        if not page.text.strip():
            return f"{header}\n{meta}\n\nThe page has no readable text.\n{footer}", None
        if self.reader is not None:
            try:
                answer = await self.reader.answer(page, prompt)
                return f"{header}\n{meta}\n\nAnswer from the page for [{prompt}]:\n{answer}\n{footer}", None
            except Exception as err:  # noqa: BLE001 — fall back to the page text
                log.warning("page summariser failed for %s: %s", url, err)
        return f"{header}\n{meta}\n\n{_clip(page.text, limit)}\n{footer}", None

    async def _web_fetch(self, call: tools.WebFetch) -> ToolResult:
        limit = max(self.config.max_page_chars // len(call.urls), 500)
        outs = await asyncio.gather(*(self._read_one(u, call.prompt, limit) for u in call.urls))
        errors = [e for _, e in outs if e]
        return ToolResult(body="\n\n".join(t for t, _ in outs),
                          info={"tool": tools.WEB_FETCH, "urls": list(call.urls),
                                "error": errors[0] if len(errors) == len(outs) else None, "errors": errors})

    def _find_object(self, call: tools.FindObject, ledger: Ledger) -> ToolResult:
        """Finds the best match for the description in the episode's searched images and crops it."""
        info: dict[str, Any] = {"tool": tools.FIND_OBJECT}
        finder = getattr(self.backend, "object_finder", None)
        if finder is None:
            info["error"] = "unavailable"
            return ToolResult(body="find_object is not available with this backend.", info=info)
        try:
            finder.parse(call.description)
        except ValueError as err:
            info["error"] = "description"
            return ToolResult(body=f"Cannot find an object: {err}", info=info)
        unknown = [i for i in call.img_ids if i not in ledger.images]
        if unknown:
            info["error"] = "unknown_img_id"
            known = ", ".join(sorted(ledger.images)) or "none yet"
            return ToolResult(body=f"Cannot search {', '.join(unknown)}: no such image in this episode "
                                   f"(known ids: {known}).", info=info)
        candidates = [ledger.images[i] for i in call.img_ids] if call.img_ids else \
            [r for i, r in sorted(ledger.images.items()) if r.parent_id is None]
        if not candidates:
            info["error"] = "no_images"
            return ToolResult(body="No images to look in yet: run image_search first.", info=info)
        best = None
        for record in candidates:
            try:
                pixels = self.store.open(record.path, record.sha256)
            except OSError:
                continue
            for found in finder.find(pixels, call.description)[:1]:
                if best is None or found.score > best[1].score:
                    best = (record, found)
        searched = ", ".join(r.img_id for r in candidates)
        info["searched"] = len(candidates)
        if best is None:
            info["error"] = "not_found"
            return ToolResult(body=f"No object matching {call.description!r} in {searched}.", info=info)
        record, found = best
        bbox = finder.crop_box(found, record.width, record.height)
        crop = self._crop(tools.CropImage(img_id=record.img_id, bbox=list(bbox)), ledger)
        info.update(crop.info, tool=tools.FIND_OBJECT, match=found.score, pattern=found.pattern)
        seen = f"{found.colours[0]} with {found.colours[1]} {found.pattern}" if found.pattern else \
            f"{found.colours[0]} and {found.colours[1]}"
        seen += f", {found.trim} trim" if found.trim else ""
        body = f"Best match in {record.img_id} ({seen}, match {found.score:.2f}). {crop.body}"
        return ToolResult(body=body, shown=crop.shown, info=info)

    def _crop(self, call: tools.CropImage, ledger: Ledger) -> ToolResult:
        info: dict[str, Any] = {"tool": tools.CROP_IMAGE, "img_id": call.img_id}
        parent = ledger.images.get(call.img_id)
        if parent is None:
            known = ", ".join(sorted(ledger.images)) or "none yet"
            info["error"] = "unknown_img_id"
            return ToolResult(body=f"Cannot crop {call.img_id}: no such image in this episode (known ids: {known}).",
                              info=info)
        try:
            bbox, box = images.check_bbox(call.bbox, width=parent.width, height=parent.height,
                                          min_side=self.config.min_crop_side)
        except ValueError as err:
            info["error"] = "bbox"
            return ToolResult(body=f"Cannot crop {call.img_id}: {err}", info=info)
        root_box = images.compose_root_box(parent.root_box, box)
        key = f"crop:{parent.root_url or parent.sha256}#{','.join(f'{v:g}' for v in root_box)}"
        if key not in ledger.keys:  # the same region again keeps its id and skips the work
            try:
                stored = self.store.crop(parent.path, parent.sha256, box)
            except OSError as err:
                info["error"] = "image_unreadable"
                return ToolResult(body=f"Cannot crop {call.img_id}: the image file is unreadable ({err})", info=info)
        record = ledger.add(key, lambda img_id: core.ImageRecord(
            img_id=img_id, path=stored.path, sha256=stored.sha256, width=stored.width, height=stored.height,
            page_url=parent.page_url, title=parent.title, parent_id=call.img_id, root_url=parent.root_url,
            root_box=root_box))
        body = (f"{record.img_id}: crop of {call.img_id} at bbox [{', '.join(f'{v:g}' for v in bbox)}], "
                f"{record.width}x{record.height} pixels")
        info.update(new_img_id=record.img_id, root_box=list(root_box))
        return ToolResult(body=body, shown=(record.img_id,), info=info)
