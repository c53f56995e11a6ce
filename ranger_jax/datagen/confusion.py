"""The confusion filter: run the real image search for a request and keep it only when the results are crowded with
things easily confused with the target.

Every result image gets one label:
  - `target`: it shows the exact target well enough to serve as a reference;
  - `confusable`: it shows a look-alike (an earlier edition, another variant, a leak or mock-up, a sibling of the
    same series), alone or with the target lost among them;
  - `other`: anything else; `unavailable`: it could not be downloaded (no one can look at it).
`CrowdRule` decides from the counts: the request is kept (`crowded`) when at least `min_confusable` results are
confusable and they outnumber the target's clean results by `ratio`; otherwise it is dropped as `too_easy` (the target
shows plainly) or `not_crowded` (few look-alikes). The rule is the same live and offline; only the labelling differs:

- `ExactConfusion` (offline world) labels from the world's annotations: `target` when the whole image passes the
  exact search judge as a reference of the target (`env.sim.rewards.check_reference`), `confusable` when a sibling
  (another entity of the target's family) covers at least `confusable_share` of the image.
- `JudgeConfusion` (live) downloads the results through the URL-guarded web fetcher and asks a VLM judge for the
  labels (`datagen/prompts/confusion.md`).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from ranger_jax.datagen import calls, records
from ranger_jax.env import core
from ranger_jax.env.backends import base, offline
from ranger_jax.env.sim import rewards as sim_rewards
from ranger_jax.env.sim import world as world_lib
from ranger_jax.rewards import judge

LABELS = ("target", "confusable", "other", "unavailable")
CONFUSABLE_SHARE = 0.1  # a sibling covering this much of a result image makes it confusable (offline labels)
JUDGE_SCHEMA = {
    "type": "object",
    "properties": {"rationale": {"type": "string"},
                   "labels": {"type": "array", "items": {
                       "type": "object", "properties": {"index": {"type": "integer"},
                                                        "label": {"type": "string",
                                                                  "enum": ["target", "confusable", "other"]}},
                       "required": ["index", "label"], "additionalProperties": False}}},
    "required": ["rationale", "labels"], "additionalProperties": False,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class CrowdRule:
    """When a request's image results count as crowded (see the module docstring)."""

    top_k: int = 10  # results looked at
    min_confusable: int = 3  # at least this many confusable results
    ratio: float = 2.0  # confusable results >= ratio × clean target results

    def __post_init__(self):
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not 1 <= self.top_k <= 20:
            raise ValueError(f"CrowdRule.top_k must be an int in 1..20, got {self.top_k!r}")
        if isinstance(self.min_confusable, bool) or not isinstance(self.min_confusable, int) \
                or not 1 <= self.min_confusable <= self.top_k:
            raise ValueError(f"CrowdRule.min_confusable must be in 1..top_k ({self.top_k}), "
                             f"got {self.min_confusable!r}")
        if not isinstance(self.ratio, (int, float)) or self.ratio < 0:
            raise ValueError(f"CrowdRule.ratio must be a number >= 0, got {self.ratio!r}")

    def verdict(self, labels: tuple[str, ...]) -> tuple[bool, str]:
        """(kept, reason) for the labels of one request's results."""
        counts = collections.Counter(labels)
        if counts["confusable"] >= self.min_confusable and counts["confusable"] >= self.ratio * counts["target"]:
            return True, "crowded"
        return False, "too_easy" if counts["target"] and counts["confusable"] < self.ratio * counts["target"] \
            else "not_crowded"


def evidence(labels: tuple[str, ...], urls: tuple[str, ...]) -> dict[str, Any]:
    """The counts and per-result labels a filter verdict is based on (JSON)."""
    counts = collections.Counter(labels)
    return {"results": len(labels), **{label: counts[label] for label in LABELS}, "labels": list(labels),
            "urls": list(urls)}


class ExactConfusion:
    """Exact labels in the offline world (see the module docstring).

    Args:
        backend: the world's `OfflineBackend` (the image search the naive agent would run).
        recorder: where the searches are recorded (service "world").
        rule: the crowding rule.
        criteria: the exact search judge's thresholds (a clean `target` result must pass them).
        confusable_share: image share a sibling must cover to make a result confusable.
    """

    def __init__(self, backend: offline.OfflineBackend, recorder: calls.Recorder, rule: CrowdRule = CrowdRule(), *,
                 criteria: sim_rewards.Criteria | None = None, confusable_share: float = CONFUSABLE_SHARE):
        self.backend, self.recorder, self.rule = backend, recorder, rule
        self.world = backend.world
        self.criteria = criteria or sim_rewards.Criteria()
        self.confusable_share = confusable_share
        self._families: dict[str, list[str]] = collections.defaultdict(list)
        for entity in self.world.entities.values():
            self._families[entity.family].append(entity.id)

    def siblings(self, target_id: str) -> list[str]:
        """Every other entity of the target's family (editions, variants, leaks and mock-ups)."""
        return [e for e in self._families[self.world.entities[target_id].family] if e != target_id]

    def label(self, image: world_lib.WorldImage, target_id: str, siblings: list[str]) -> str:
        """The exact label of one result image."""
        if getattr(image, "error", None):
            return "unavailable"
        record = core.ImageRecord(img_id="result", path="", sha256="", width=image.width, height=image.height,
                                  url=image.url)
        check = sim_rewards.check_reference(self.world, record, "result", target_id, siblings, self.criteria)
        if check.shows_target:
            return "target"
        area = float(image.width * image.height)
        sibling_set = set(siblings)
        if any(o.entity_id in sibling_set and world_lib.box_area(o.box) / area >= self.confusable_share
               for o in image.objects):
            return "confusable"
        return "other"

    async def judge(self, prompt: records.Prompt, *, stage: str) -> tuple[bool, str, dict[str, Any]]:
        """(kept, reason, evidence) for one offline prompt.

        Raises:
            ValueError: the prompt has no `target_id` in this world.
        """
        if prompt.target_id not in self.world.entities:
            raise ValueError(f"prompt {prompt.id} has target_id {prompt.target_id!r}, which is not in the world at "
                             f"{self.world.root}")
        started = time.monotonic()
        hits = await self.backend.image_search(prompt.prompt, top_k=self.rule.top_k)
        siblings = self.siblings(prompt.target_id)
        labels = tuple(self.label(self.world.images[h.image_url], prompt.target_id, siblings) for h in hits)
        urls = tuple(h.image_url for h in hits)
        self.recorder.record(stage=stage, service="world", endpoint="images",
                             request={"q": prompt.prompt, "num": self.rule.top_k},
                             response={"urls": list(urls), "labels": list(labels)},
                             latency_s=time.monotonic() - started)
        kept, reason = self.rule.verdict(labels)
        return kept, reason, evidence(labels, urls)


def _parse_labels(count: int):
    def validate(obj: Any) -> tuple[str, ...]:
        if not isinstance(obj, Mapping) or not isinstance(obj.get("labels"), list):
            raise ValueError(f"confusion judge output must be an object with a 'labels' list, got {str(obj)[:120]!r}")
        by_index: dict[int, str] = {}
        for item in obj["labels"]:
            if not isinstance(item, Mapping) or item.get("label") not in LABELS[:3]:
                raise ValueError(f"confusion label {item!r:.80} is not one of {LABELS[:3]}")
            index = item.get("index")
            if isinstance(index, bool) or not isinstance(index, int) or not 1 <= index <= count:
                raise ValueError(f"confusion label index {index!r} is outside 1..{count}")
            by_index[index] = item["label"]
        if len(by_index) != count:
            raise ValueError(f"the judge labelled {len(by_index)} of {count} images")
        return tuple(by_index[i] for i in range(1, count + 1))
    return validate


class JudgeConfusion:
    """Live labels from a VLM judge over the downloaded results (see the module docstring).

    Args:
        serper: a `services.RecordingSerper` for the stage (the image search).
        fetch_image: downloads one result (URL, page URL) -> bytes; raises on failure (a `web.WebFetcher`-backed
            function: URL-guarded, size-limited).
        client: the judge's chat client for the stage (`services.RecordingChat`).
        rule: the crowding rule.
    """

    def __init__(self, serper: Any, fetch_image, client: Any, rule: CrowdRule = CrowdRule(),
                 max_attempts: int = judge.DEFAULT_MAX_ATTEMPTS):
        self.serper, self.fetch_image, self.client, self.rule = serper, fetch_image, client, rule
        self.max_attempts = max_attempts

    async def judge(self, prompt: records.Prompt, *, stage: str) -> tuple[bool, str, dict[str, Any]]:
        """(kept, reason, evidence) for one live prompt. Raises base.BackendError or judge.JudgeError."""
        hits = await self.serper.images(prompt.prompt, num=self.rule.top_k)
        hits = hits[: self.rule.top_k]
        pictures: list[bytes | None] = []
        for hit in hits:
            try:
                pictures.append(await self.fetch_image(hit.image_url, hit.page_url))
            except (base.BackendError, ValueError, OSError):
                pictures.append(None)
        shown = [i for i, p in enumerate(pictures) if p is not None]
        labels = ["unavailable"] * len(hits)
        if shown:
            text = (f"Request: {prompt.prompt}\nTarget: {prompt.target}\n"
                    + (f"News headline: {prompt.source_headline}\n" if prompt.source_headline else "")
                    + f"{len(shown)} result images follow, numbered 1 to {len(shown)} in rank order.")
            vlm = judge.VLMJudge(self.client, rubric=records.instructions("confusion"), schema_name="confusion",
                                 schema=JUDGE_SCHEMA, validate=_parse_labels(len(shown)), max_tokens=2048,
                                 max_attempts=self.max_attempts)
            verdict = await vlm.ajudge(text, [pictures[i] for i in shown])
            for i, label in zip(shown, verdict.value):
                labels[i] = label
        labels_t = tuple(labels)
        kept, reason = self.rule.verdict(labels_t)
        return kept, reason, evidence(labels_t, tuple(h.image_url for h in hits))
