"""From a headline to a request: an LLM (live) or a deterministic template (offline) writes what a user would ask.

Two ways to find a target, as Savanna describes:
  - text-oriented (`text_request`): the thing the headline names ("First look: the Zorvan FC 2026 Home kit");
  - image-oriented (`image_request`), used when the text-oriented request proved too easy to find: a thing that is
    visible in the news photo but not named in the headline.
Either gives a `records.Prompt`, or a `Drop` with the reason (`off_topic`, `no_target`, `no_news_image`,
`no_image_target`).

`LLMRequestWriter` asks an OpenAI-compatible model (JSON answers validated, retried with a new seed when unusable;
the image-oriented call shows it the news photo). `TemplateRequestWriter` stands in for it in the offline world: it
reads the release a headline names, and the objects in the page's photos, from the world's annotations (as a
perfect reader would), and words the request with fixed templates. It calls a release "new" only when it is the
newest of its series and variant and came out within `RECENT_DAYS` of the day the user asks; otherwise the request
names its edition, so every request means exactly one thing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import random
from collections.abc import Awaitable, Callable
from typing import Any

from ranger_jax.datagen import calls, records
from ranger_jax.datagen.news import NewsItem
from ranger_jax.env.sim import catalog
from ranger_jax.env.sim import pages as sim_pages
from ranger_jax.env.sim import world as world_lib
from ranger_jax.rewards import judge

RECENT_DAYS = 30  # a release this recent (and the newest of its variant) is asked for as "the new …"
OPENERS = ("Generate an image of", "Create a photo of", "Make a picture of", "Show")
DEFAULT_CONTEXT = "in a natural setting"
_CONTEXTS = {sc.name: sc.contexts for sc in catalog.SUBCATEGORIES}

TEXT_SCHEMA = {"type": "object", "properties": {"relevant": {"type": "boolean"}, "target": {"type": "string"},
                                                 "request": {"type": "string"}, "reason": {"type": "string"}},
               "required": ["relevant", "target", "request", "reason"], "additionalProperties": False}
IMAGE_SCHEMA = {"type": "object", "properties": {"found": {"type": "boolean"}, "target": {"type": "string"},
                                                  "request": {"type": "string"}, "reason": {"type": "string"}},
                "required": ["found", "target", "request", "reason"], "additionalProperties": False}


@dataclasses.dataclass(frozen=True)
class Drop:
    """An item that yields no prompt: the reason (counted in the report) and a detail for people."""

    reason: str
    detail: str = ""


def _validated(flag: str) -> Callable[[Any], dict[str, Any]]:
    """A validator of the writer's JSON: `flag` a boolean; when true, non-empty `target` and `request`."""
    def validate(obj: Any) -> dict[str, Any]:
        if not isinstance(obj, dict) or not isinstance(obj.get(flag), bool):
            raise ValueError(f"writer output must be an object with a boolean {flag!r}, got {str(obj)[:120]!r}")
        if obj[flag]:
            for key in ("target", "request"):
                if not isinstance(obj.get(key), str) or not obj[key].strip():
                    raise ValueError(f"writer output with {flag}=true needs a non-empty {key!r}")
        return {k: obj.get(k) for k in (flag, "target", "request", "reason")}
    return validate


def _prompt(item: NewsItem, *, mode: str, target: str, request: str, today: dt.date, domain: str | None = None,
            subcategory: str | None = None, target_id: str | None = None) -> records.Prompt:
    subcategory = subcategory or item.subcategory
    return records.Prompt(id=records.prompt_id("news", mode, item.link, target), prompt=request.strip(),
                          target=target.strip(), mode=mode, date=item.published, today=today.isoformat(),
                          domain=domain or item.domain, subcategory=subcategory, category=subcategory,
                          source_headline=item.title, source_url=item.link, target_id=target_id)


class LLMRequestWriter:
    """Requests written by an OpenAI-compatible model (see the module docstring).

    Args:
        client: the writer's chat client (a `services.RecordingChat`), the stage's own.
        today: the day the requests are asked on.
        fetch_image: downloads the news photo for image-oriented requests (URL -> bytes); None: none are made.
        max_attempts: calls before an unusable answer drops the item.
    """

    def __init__(self, client: Any, *, today: dt.date,
                 fetch_image: Callable[[str], Awaitable[bytes]] | None = None,
                 max_attempts: int = judge.DEFAULT_MAX_ATTEMPTS):
        self.today, self.fetch_image = today, fetch_image
        self.text_judge = judge.VLMJudge(client, rubric=records.instructions("request_text"),
                                         schema_name="news_request", schema=TEXT_SCHEMA,
                                         validate=_validated("relevant"), max_tokens=1024, max_attempts=max_attempts)
        self.image_judge = judge.VLMJudge(client, rubric=records.instructions("request_image"),
                                          schema_name="news_image_request", schema=IMAGE_SCHEMA,
                                          validate=_validated("found"), max_tokens=1024, max_attempts=max_attempts)

    @staticmethod
    def _describe(item: NewsItem) -> str:
        return (f"Subcategory: {item.subcategory} ({item.domain})\nPublished: {item.published}\n"
                f"Headline: {item.title}\nSnippet: {item.snippet}\nSource: {item.source}")

    async def text_request(self, item: NewsItem) -> records.Prompt | Drop:
        """The request for the thing the headline names, or a Drop (`off_topic`, `writer_failed`)."""
        try:
            verdict = await self.text_judge.ajudge(self._describe(item))
        except judge.JudgeError as err:
            return Drop("writer_failed", str(err))
        value = verdict.value
        if not value["relevant"]:
            return Drop("off_topic", str(value.get("reason") or ""))
        return _prompt(item, mode="text", target=value["target"], request=value["request"], today=self.today)

    async def image_request(self, item: NewsItem, rejected: records.Prompt) -> records.Prompt | Drop:
        """A request for something seen in the news photo, or a Drop (`no_news_image`, `no_image_target`,
        `writer_failed`)."""
        if self.fetch_image is None or not item.image_url:
            return Drop("no_news_image", "the headline has no photo")
        try:
            photo = await self.fetch_image(item.image_url)
        except Exception as err:  # noqa: BLE001 — any download failure just means no photo to look at
            return Drop("no_news_image", f"{item.image_url}: {err}")
        text = f"{self._describe(item)}\nToo easy to find: {rejected.target}\nThe news photo follows."
        try:
            verdict = await self.image_judge.ajudge(text, [photo])
        except judge.JudgeError as err:
            return Drop("writer_failed", str(err))
        value = verdict.value
        if not value["found"]:
            return Drop("no_image_target", str(value.get("reason") or ""))
        return _prompt(item, mode="image", target=value["target"], request=value["request"], today=self.today)


def _seed(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()[:8], "big")


class TemplateRequestWriter:
    """The offline stand-in for the LLM writer (see the module docstring); deterministic.

    Args:
        the_world: the offline world the news came from.
        recorder: where each call is recorded (service "template").
        today: the day the requests are asked on (default the world's `today`).
    """

    def __init__(self, the_world: world_lib.World, recorder: calls.Recorder, *, today: dt.date | None = None,
                 stage: str = "extract"):
        self.world, self.recorder, self.stage = the_world, recorder, stage
        self.today = today or the_world.today
        self._newest: dict[tuple[str, str], str] = {}
        for e in the_world.entities.values():
            if getattr(e, "status", "release") == "release":
                key = (e.family, self._variant(e))
                if key not in self._newest or e.released > self.world.entities[self._newest[key]].released:
                    self._newest[key] = e.id

    @staticmethod
    def _variant(entity: world_lib.Entity) -> str:
        tag = getattr(entity, "tag", "")
        return f"{entity.variant} {tag}" if tag else entity.variant

    def request_for(self, entity: world_lib.Entity) -> str:
        """The request for `entity` (the same text whenever it is asked for)."""
        rng = random.Random(_seed("request", entity.id))
        age = (self.today - dt.date.fromisoformat(entity.released)).days
        recent = 0 <= age <= RECENT_DAYS and self._newest.get((entity.family, self._variant(entity))) == entity.id
        if recent:
            subject = f"the new {entity.family} {self._variant(entity)} {entity.noun}"
        else:
            subject = f"the {entity.family} {entity.edition} {self._variant(entity)} {entity.noun}"
        context = rng.choice(_CONTEXTS.get(entity.subcategory, (DEFAULT_CONTEXT,)))
        return f"{rng.choice(OPENERS)} {subject} {context}."

    def _record(self, kind: str, item: NewsItem, result: records.Prompt | Drop) -> records.Prompt | Drop:
        response = result.to_record() if isinstance(result, records.Prompt) else dataclasses.asdict(result)
        self.recorder.record(stage=self.stage, service="template", endpoint=kind,
                             request={"headline": item.title, "link": item.link, "release_ids": list(item.release_ids)},
                             response=response)
        return result

    def _make(self, item: NewsItem, entity: world_lib.Entity, mode: str) -> records.Prompt:
        return _prompt(item, mode=mode, target=sim_pages.full_name(entity), request=self.request_for(entity),
                       today=self.today, domain=entity.domain, subcategory=entity.subcategory, target_id=entity.id)

    async def text_request(self, item: NewsItem) -> records.Prompt | Drop:
        """The request for the first release the headline names, or a Drop (`no_target`, `off_topic`)."""
        if not item.release_ids or item.release_ids[0] not in self.world.entities:
            return self._record("text", item, Drop("no_target", "the headline names no release"))
        entity = self.world.entities[item.release_ids[0]]
        if entity.subcategory not in item.subcategories:
            return self._record("text", item, Drop("off_topic", f"{entity.name} is {entity.subcategory}, not one of "
                                                                 f"{list(item.subcategories)}"))
        return self._record("text", item, self._make(item, entity, "text"))

    async def image_request(self, item: NewsItem, rejected: records.Prompt) -> records.Prompt | Drop:
        """A request for the largest visible release in the page's photos that the headline does not name, or a
        Drop (`no_news_image`, `no_image_target`)."""
        page = self.world.pages.get(item.link)
        photos = [self.world.images[u] for u in (page.image_urls if page else ()) if u in self.world.images]
        photos = [p for p in photos if not getattr(p, "error", None)]
        if not photos:
            return self._record("image", item, Drop("no_news_image", "the page shows no photo"))
        best, best_area = None, 0.0
        for photo in photos:
            for obj in photo.objects:
                entity = self.world.entities.get(obj.entity_id)
                if entity is None or obj.entity_id in item.release_ids or obj.entity_id == rejected.target_id \
                        or getattr(entity, "status", "release") != "release":
                    continue
                area = world_lib.box_area(obj.box) * float(getattr(obj, "visible", 1.0))
                if area > best_area:
                    best, best_area = entity, area
        if best is None:
            return self._record("image", item, Drop("no_image_target", "the photos show only the named release"))
        return self._record("image", item, self._make(item, best, "image"))

