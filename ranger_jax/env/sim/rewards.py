"""Exact judgement of one answer in the offline world: search pass/fail, crop quality and text score.

Every reference the policy selects is an `ImageRecord` of its episode: `root_url` names the world image it derives
from and `root_box` the region of that image it shows (the whole image when None). The world's annotations give
every entity's pixel box in that image, so each reference is judged from geometry alone — never from image files,
so the judgement is the same before and after the episode's env is closed. Every reference of the answer counts
(the env's answer parser keeps at most `max_answer_refs`). The thresholds below are the fields of `Criteria`
(defaults in brackets). How these parts make the reward is `ranger_jax.rewards.offline` (`ToolEnv.score`).

For an entity with box O in a reference with region R, let vis = area(O ∩ R). The reference
  - **shows** the entity when coverage = vis / area(O) ≥ COVERAGE_MIN [0.8] (enough of it is visible) and
    share = vis / area(R) ≥ SHARE_MIN [0.3] (it is a main subject, not a detail of a wider scene);
  - is **dominated by a sibling** when some sibling's vis ≥ RIVAL_MAX [0.5] × the target's vis (the generator
    could copy the sibling instead).
In version-2 worlds an object can stand partly behind others: a placement whose recorded `visible` share is
below VISIBLE_MIN [0.6] shows too little of the object to count as showing it (a rival's area counts in full).

**Search pass** ⇔ some reference shows the target and is not dominated by a sibling, and no reference shows a
sibling. So a clean crop of the target passes; a crop of a sibling fails; a whole crowded scene fails (the
target fills well under SHARE_MIN of it); a product shot of the target passes uncropped.

**Two subjects.** A version-2 request may ask for two things at once (`target_ids` holds both; siblings are
those of both families). Then the search passes ⇔ *each* target is shown by some reference and no reference
shows a sibling of either: one subject alone fails, as does a pair with one look-alike. A reference may show
both targets (each must clear the thresholds in it); each reference is reported against the target it shows
best. Crop IoU is the mean over the targets of each one's best IoU.

**Crop IoU** = the best IoU between a reference's region and the target's box over all references whose
world image contains the target (0 when none does).

**Text score** = (key attributes present − sibling-only attributes mentioned) / number of key attributes,
clipped to [0, 1]. Attributes are matched case-insensitively as whole words in `gen_prompt`; key attributes
are matched first and their spans removed, so a key "navy" never counts as a sibling's "navy" elsewhere.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from ranger_jax.env import core
from ranger_jax.env.sim.world import Box, World, box_area, box_intersection, box_iou

@dataclasses.dataclass(frozen=True, kw_only=True)
class Criteria:
    """Thresholds of the search judgement (definitions in the module docstring)."""

    coverage_min: float = 0.8  # COVERAGE_MIN: fraction of an object's box the region must contain
    share_min: float = 0.3  # SHARE_MIN: fraction of the region the object must fill (a whole scene fails)
    rival_max: float = 0.5  # RIVAL_MAX: a sibling this large relative to the target makes it ambiguous
    visible_min: float = 0.6  # VISIBLE_MIN: an object hidden beyond this behind others is not shown

    def __post_init__(self):
        for name in ("coverage_min", "share_min", "rival_max", "visible_min"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"Criteria.{name} must be in (0, 1]; got {value!r}")

    @classmethod
    def from_settings(cls, settings: Mapping) -> "Criteria":
        """The criteria of an environment's `[rewards]` table (`ToolEnv.rewards`); missing keys keep defaults."""
        return cls(**{f.name: settings[f.name] for f in dataclasses.fields(cls) if f.name in settings})


_TRUTH_KEYS = ("target_id", "sibling_ids", "key_attributes", "sibling_only_attributes")


@dataclasses.dataclass(frozen=True)
class ReferenceCheck:
    """How one selected reference relates to the target.

    Attributes:
        img_id: the reference's id in the answer.
        root_url: the world image it derives from (None when the id or the image is unknown).
        region: the pixel region of that image it shows.
        target_coverage: fraction of the target's box inside the region (0 when the target is absent).
        target_share: fraction of the region the target fills.
        rival_ratio: largest visible area of a sibling in the region / the target's visible area.
        shows_target: coverage and share clear their thresholds and no sibling dominates.
        shown_siblings: ids of siblings the reference shows.
        iou: IoU of the region with the target's box (0 when the target is absent).
        target_id: the target this row judges (with two targets: the one the reference shows best).
    """

    img_id: str
    root_url: str | None
    region: Box | None
    target_coverage: float = 0.0
    target_share: float = 0.0
    rival_ratio: float = 0.0
    shows_target: bool = False
    shown_siblings: tuple[str, ...] = ()
    iou: float = 0.0
    target_id: str = ""


@dataclasses.dataclass(frozen=True)
class SimScore:
    """The exact judgement of one answer, with the details that explain it."""

    search_pass: bool
    crop_iou: float
    text_score: float
    references: tuple[ReferenceCheck, ...]
    key_attributes_present: tuple[str, ...]
    key_attributes_missing: tuple[str, ...]
    sibling_attributes_mentioned: tuple[str, ...]
    reason: str
    targets_shown: tuple[str, ...] = ()  # the targets some reference shows (search pass needs them all)


def _find(text: str, phrase: str) -> list[tuple[int, int]]:
    pattern = r"(?<![a-z0-9])" + re.escape(phrase.lower()) + r"(?![a-z0-9])"
    return [m.span() for m in re.finditer(pattern, text)]


def text_match(gen_prompt: str, key: list[str], sibling_only: list[str]) -> tuple[float, tuple, tuple, tuple]:
    """(score, present, missing, sibling-only mentioned) of `gen_prompt` (see the module docstring)."""
    text = gen_prompt.lower()
    present, missing = [], []
    for phrase in key:
        spans = _find(text, phrase)
        (present if spans else missing).append(phrase)
        for start, end in spans:  # mask, so sibling-only phrases cannot match inside a key attribute
            text = text[:start] + " " * (end - start) + text[end:]
    mentioned = [phrase for phrase in sibling_only if _find(text, phrase)]
    score = (len(present) - len(mentioned)) / len(key) if key else 0.0
    return min(1.0, max(0.0, score)), tuple(present), tuple(missing), tuple(mentioned)


def _visible(world_image, entity_id: str, region: Box) -> tuple[float, Box | None, float]:
    """Largest visible area of `entity_id` in `region`, that placement's box (None when absent) and its
    unhidden share."""
    best, best_box, share = 0.0, None, 1.0
    for obj in world_image.objects:
        if obj.entity_id == entity_id:
            vis = box_area(box_intersection(obj.box, region))
            if best_box is None or vis > best:
                best, best_box, share = vis, obj.box, obj.visible
    return best, best_box, share


def check_reference(world: World, record: core.ImageRecord | None, img_id: str, target_id: str,
                    sibling_ids: list[str], criteria: Criteria = Criteria()) -> ReferenceCheck:
    """Judges one reference against the target and its siblings (definitions in the module docstring)."""
    root_url = None if record is None else (record.root_url or record.url)
    image = world.images.get(root_url) if root_url else None
    if image is None:
        return ReferenceCheck(img_id=img_id, root_url=root_url, region=None, target_id=target_id)
    region = tuple(float(v) for v in record.root_box) if record.root_box is not None else (
        0.0, 0.0, float(image.width), float(image.height))
    region_area = box_area(region)
    if region_area <= 0:
        return ReferenceCheck(img_id=img_id, root_url=root_url, region=region, target_id=target_id)
    vis_target, target_box, unhidden = _visible(image, target_id, region)
    shown, rival = [], 0.0
    for sibling in sibling_ids:
        vis, box, sibling_unhidden = _visible(image, sibling, region)
        if box is None:
            continue
        rival = max(rival, vis / max(vis_target, 1.0))
        if vis / box_area(box) >= criteria.coverage_min and vis / region_area >= criteria.share_min \
                and sibling_unhidden >= criteria.visible_min:
            shown.append(sibling)
    if target_box is None:
        return ReferenceCheck(img_id=img_id, root_url=root_url, region=region, rival_ratio=rival,
                              shown_siblings=tuple(shown), target_id=target_id)
    coverage, share = vis_target / box_area(target_box), vis_target / region_area
    shows = coverage >= criteria.coverage_min and share >= criteria.share_min and rival < criteria.rival_max \
        and unhidden >= criteria.visible_min
    return ReferenceCheck(img_id=img_id, root_url=root_url, region=region, target_coverage=coverage,
                          target_share=share, rival_ratio=rival, shows_target=shows, shown_siblings=tuple(shown),
                          iou=box_iou(region, target_box), target_id=target_id)


def _truth(task: core.Task, world: World) -> Mapping:
    truth = task.ground_truth
    if not isinstance(truth, Mapping):
        raise ValueError(f"task {task.id!r} has no offline-world ground truth (got {type(truth).__name__}); "
                         "load tasks with ranger_jax.env.sim.load_tasks")
    missing = [k for k in _TRUTH_KEYS if k not in truth]
    if missing:
        raise ValueError(f"task {task.id!r} ground truth lacks {missing}")
    for entity_id in [truth["target_id"], *truth.get("target_ids", ()), *truth["sibling_ids"]]:
        if entity_id not in world.entities:
            raise ValueError(f"task {task.id!r} names entity {entity_id!r}, which is not in the world at {world.root}")
    return truth


def score(world: World, task: core.Task, answer: core.Answer | None, images: Mapping[str, core.ImageRecord],
          *, criteria: Criteria = Criteria()) -> SimScore:
    """Judges one episode's answer exactly.

    Args:
        world: the loaded world the episode ran in.
        task: the task, as returned by `ranger_jax.env.sim.load_tasks`.
        answer: the parsed answer, or None when the episode ended without one (everything scores 0).
        images: the episode's images by id (`EnvState.images`).
        criteria: thresholds of the search judgement.

    Returns:
        A `SimScore`.

    Raises:
        ValueError: naming the task when its ground truth is missing or names entities the world lacks.
    """
    truth = _truth(task, world)
    key, sibling_only = list(truth["key_attributes"]), list(truth["sibling_only_attributes"])
    targets = list(truth.get("target_ids") or [truth["target_id"]])
    if answer is None:
        return SimScore(False, 0.0, 0.0, (), (), tuple(key), (), reason="no answer")
    text, present, missing, mentioned = text_match(answer.gen_prompt, key, sibling_only)
    by_target = {t: [check_reference(world, images.get(ref.img_id), ref.img_id, t, list(truth["sibling_ids"]),
                                     criteria) for ref in answer.reference_images] for t in targets}
    # each reference is reported against the target it shows best (the only one when there is one target)
    checks = tuple(max((by_target[t][i] for t in targets),
                       key=lambda c: (c.shows_target, c.target_coverage * c.target_share, -targets.index(c.target_id)))
                   for i in range(len(answer.reference_images)))
    shown_targets = tuple(t for t in targets if any(c.shows_target for c in by_target[t]))
    shows = list(dict.fromkeys(by_target[t][i].img_id for i in range(len(answer.reference_images))
                               for t in targets if by_target[t][i].shows_target))
    siblings = sorted({s for c in checks for s in c.shown_siblings})
    passed = len(shown_targets) == len(targets) and not siblings
    if passed:
        reason = f"{', '.join(shows)} shows the target" + ("s" if len(targets) > 1 else "")
    elif shown_targets and not siblings:
        reason = f"target(s) {[t for t in targets if t not in shown_targets]} not shown by any reference"
    elif siblings:
        reason = f"a reference shows sibling(s) {siblings}"
    elif not checks:
        reason = "no reference images"
    elif any(c.target_coverage > 0 for c in checks):
        best = max(checks, key=lambda c: c.target_share)
        reason = (f"target not isolated: best reference {best.img_id} has coverage {best.target_coverage:.2f}, "
                  f"share {best.target_share:.2f}, sibling ratio {best.rival_ratio:.2f}")
    else:
        reason = "no reference contains the target"
    crop_iou = sum(max((c.iou for c in by_target[t]), default=0.0) for t in targets) / len(targets)
    return SimScore(
        search_pass=passed, crop_iou=crop_iou, text_score=text,
        references=checks, key_attributes_present=present, key_attributes_missing=missing,
        sibling_attributes_mentioned=mentioned, reason=reason, targets_shown=shown_targets,
    )
