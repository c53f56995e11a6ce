"""Finding objects of named colours in an image, from its pixels alone.

A small, deterministic perception aid for policies that cannot ground objects themselves (a tiny VLM trained for
minutes): given an image and a description that names colours ("green with orange dots"), it returns the pixel
boxes of the objects painted in those colours, best match first. It reads nothing but pixels and a palette of
named colours (name -> RGB); it knows no entities, names or annotations.

How it works: pixels within `tolerance` of the two named colours form a mask; a morphological closing joins a
pattern's ground and its motif into one region; every connected region holding enough of both colours is a
candidate, scored by how much of its box the two colours cover and by whether the first colour dominates (the
ground colour of an object covers more of it than its motif). Objects of other colours standing next to a match
are not part of its mask, so its box is tight even in a crowded scene.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from PIL import Image
from scipy import ndimage

RGB = tuple[int, int, int]
# Draws a pattern tile: (width, height, ground RGB, motif RGB) -> RGB image of that size.
PatternDrawer = Callable[[int, int, RGB, RGB], Image.Image]

DEFAULT_TOLERANCE = 2  # max per-channel distance of a pixel from a named colour
MIN_COLOUR_PIXELS = 24  # a region needs this many pixels of each colour to count
MIN_BOX_SIDE = 8


@dataclasses.dataclass(frozen=True)
class Found:
    """One object of the asked colours.

    Attributes:
        box: pixel box [x0, y0, x1, y1] (x1, y1 exclusive) in the image's frame.
        colours: the two colour names asked for, ground first.
        pattern: the best-fitting pattern name (None when no pattern drawers were given).
        pattern_fit: fraction of the object's pixels that the best pattern explains.
        coverage: fraction of the box painted in the two colours.
        ground_share: the first colour's share of the two colours' pixels in the region.
        score: ranking score in [0, 1] (higher is a better match).
    """

    box: tuple[int, int, int, int]
    colours: tuple[str, str]
    pattern: str | None
    pattern_fit: float
    coverage: float
    ground_share: float
    score: float


def colour_words(text: str, palette: Mapping[str, RGB]) -> list[str]:
    """The palette's colour names in `text`, in order of appearance, without repeats (whole words, any case)."""
    names = {name.lower(): name for name in palette}
    found = []
    for word in re.findall(r"[A-Za-z]+", text):
        name = names.get(word.lower())
        if name is not None and name not in found:
            found.append(name)
    return found


def _colour_mask(pixels: np.ndarray, rgb: RGB, tolerance: int) -> np.ndarray:
    """[H, W] bool: pixels within `tolerance` of `rgb` in every channel."""
    return np.all(np.abs(pixels - np.asarray(rgb, dtype=np.int16)) <= tolerance, axis=-1)


def fit_pattern(motif: np.ndarray, painted: np.ndarray, ground_rgb: RGB, motif_rgb: RGB,
                patterns: Mapping[str, PatternDrawer]) -> tuple[str | None, float]:
    """The pattern whose tile, drawn over the box, best explains which painted pixels are motif.

    Args:
        motif: [h, w] bool, the motif colour's pixels in the object's box.
        painted: [h, w] bool, pixels of either colour that belong to the object.
    """
    h, w = motif.shape
    total = max(1, int(painted.sum()))
    best, best_fit = None, -1.0
    for name, draw in patterns.items():
        tile = np.asarray(draw(w, h, ground_rgb, motif_rgb).convert("RGB"), dtype=np.int16)
        tile_motif = _colour_mask(tile, motif_rgb, 0) & ~_colour_mask(tile, ground_rgb, 0)
        fit = float(np.sum((tile_motif == motif) & painted)) / total
        if fit > best_fit:
            best, best_fit = name, fit
    return best, round(best_fit, 4)


def find_objects(image: Image.Image, palette: Mapping[str, RGB], colours: Sequence[str], *,
                 pattern: str | None = None, patterns: Mapping[str, PatternDrawer] | None = None,
                 tolerance: int = DEFAULT_TOLERANCE, min_colour_pixels: int = MIN_COLOUR_PIXELS) -> list[Found]:
    """Objects painted in `colours` (ground colour first, then the motif's), best match first.

    Args:
        image: any PIL image (converted to RGB).
        palette: colour name -> RGB of the colours objects are painted in.
        colours: one or two palette names; with one, the object is plain in that colour.
        pattern: the motif's pattern, if known; candidates whose best-fitting pattern differs rank lower.
        patterns: pattern name -> drawer, to recognise patterns (without it, colours alone rank candidates).
        tolerance: max per-channel distance of a pixel from a named colour.
        min_colour_pixels: pixels of each asked colour a region needs.

    Raises:
        ValueError: a colour not in the palette (named), or not one or two colours.
    """
    if pattern is not None and (patterns is None or pattern not in patterns):
        raise ValueError(f"unknown pattern {pattern!r}; known patterns: {sorted(patterns or ())}")
    if not 1 <= len(colours) <= 2:
        raise ValueError(f"find_objects takes one or two colours; got {len(colours)}: {list(colours)!r}")
    for name in colours:
        if name not in palette:
            raise ValueError(f"unknown colour {name!r}; known colours: {sorted(palette)}")
    ground_name = colours[0]
    motif_name = colours[-1]
    pixels = np.asarray(image.convert("RGB"), dtype=np.int16)  # [H, W, 3]
    ground = _colour_mask(pixels, palette[ground_name], tolerance)
    motif = _colour_mask(pixels, palette[motif_name], tolerance) if motif_name != ground_name else ground
    joined = ndimage.binary_closing(ground | motif, structure=np.ones((5, 5), bool), iterations=1)
    labels, count = ndimage.label(joined)
    found = []
    for index, region in enumerate(ndimage.find_objects(labels), start=1):
        if region is None:
            continue
        ys, xs = region
        inside = labels[region] == index
        n_ground = int(np.sum(ground[region] & inside))
        n_motif = int(np.sum(motif[region] & inside & ~ground[region]))
        if n_ground < min_colour_pixels or (motif_name != ground_name and n_motif < min_colour_pixels):
            continue
        h, w = ys.stop - ys.start, xs.stop - xs.start
        if min(h, w) < MIN_BOX_SIDE:
            continue
        coverage = (n_ground + n_motif) / float(h * w)
        ground_share = n_ground / float(n_ground + n_motif)
        dominance = 1.0 if ground_share >= 0.4 else ground_share / 0.4
        score = min(1.0, coverage) * dominance
        seen, fit = None, 0.0
        if patterns and motif_name != ground_name:
            painted = (ground[region] | motif[region]) & inside
            seen, fit = fit_pattern(motif[region] & inside & ~ground[region], painted, palette[ground_name],
                                    palette[motif_name], patterns)
            if pattern is not None and seen != pattern:
                score *= 0.25
        found.append(Found(box=(xs.start, ys.start, xs.stop, ys.stop), colours=(ground_name, motif_name),
                           pattern=seen, pattern_fit=fit, coverage=round(coverage, 4),
                           ground_share=round(ground_share, 4), score=round(score, 4)))
    found.sort(key=lambda f: (-f.score, -(f.box[2] - f.box[0]) * (f.box[3] - f.box[1]), f.box))
    return found


CROP_MARGINS = (0.08, 0.2)  # a crop adds these fractions of the found box's width / height on each side


@dataclasses.dataclass(frozen=True)
class ObjectFinder:
    """Reads a description ("navy with white stripes") and finds matching objects in images, from pixels.

    Args:
        palette: colour name -> RGB of the colours objects are painted in.
        patterns: pattern name -> tile drawer, to recognise motifs (empty: colours only).
        margins: the crop margins (fraction of the found box's width, height) added on each side, since a
            silhouette's coloured pixels rarely reach its box's edges (wheels, handles, soles are other colours).
    """

    palette: Mapping[str, RGB]
    patterns: Mapping[str, PatternDrawer] = dataclasses.field(default_factory=dict)
    margins: tuple[float, float] = CROP_MARGINS

    def parse(self, description: str) -> tuple[list[str], str | None]:
        """The description's colours (at most two, ground first) and its pattern word, if any.

        The first colour named is the ground, unless another is called the ground ("white dots on a navy
        ground", "a navy base", "a navy body").

        Raises:
            ValueError: a description naming no known colour (lists the known ones).
        """
        colours = colour_words(description, self.palette)[:2]
        # "orange dots against a green ground" / "a green base with ...": the colour before ground/base/body is
        # the ground colour wherever it stands.
        said = re.search(r"\b([A-Za-z]+) (?:ground|base|body)\b", description)
        if said and len(colours) == 2 and said.group(1).lower() == colours[1].lower():
            colours.reverse()
        if not colours:
            raise ValueError(f"the description {description[:80]!r} names no colour I can see; "
                             f"known colours: {', '.join(sorted(self.palette))}")
        words = {w.lower() for w in re.findall(r"[A-Za-z]+", description)}
        pattern = next((p for p in self.patterns if p.lower() in words), None)
        return colours, pattern

    def find(self, image: Image.Image, description: str) -> list[Found]:
        """Objects in `image` matching `description`, best first."""
        colours, pattern = self.parse(description)
        return find_objects(image, self.palette, colours, pattern=pattern, patterns=self.patterns or None)

    def crop_box(self, found: Found, width: int, height: int) -> tuple[float, float, float, float]:
        """The normalised [x0, y0, x1, y1] box to crop for `found` in a `width`×`height` image, margins added."""
        x0, y0, x1, y1 = found.box
        mx, my = self.margins[0] * (x1 - x0), self.margins[1] * (y1 - y0)
        return (round(max(0.0, x0 - mx) / width, 4), round(max(0.0, y0 - my) / height, 4),
                round(min(float(width), x1 + mx) / width, 4), round(min(float(height), y1 + my) / height, 4))


def accuracy_on_world(the_world, root, finder: ObjectFinder, *, min_iou: float = 0.5) -> dict[str, float]:
    """How often the top match for each task's target look is the target, over every world image showing it.

    The world's annotations are read here only to grade the finder (the finder itself sees pixels alone).

    Returns:
        {"images": count, "top_match_iou50": share whose top box has IoU >= min_iou with the target's box,
         "crop_passes": share whose crop (margins added) holds >= 80% of the target and no sibling fully}.
    """
    from pathlib import Path

    from ranger_jax.env.sim import world as world_lib

    hits = passes = total = 0
    for task in world_lib.load_tasks(root):
        target = the_world.entities[task.ground_truth["target_id"]]
        look = f"{target.attributes.primary} with {target.attributes.secondary} {target.attributes.pattern}"
        siblings = set(task.ground_truth["sibling_ids"])
        for image in the_world.images.values():
            boxes = {o.entity_id: o.box for o in image.objects}
            if target.id not in boxes:
                continue
            total += 1
            found = finder.find(Image.open(Path(root) / image.file), look)
            if not found:
                continue
            hits += world_lib.box_iou(found[0].box, boxes[target.id]) >= min_iou
            x0, y0, x1, y1 = finder.crop_box(found[0], image.width, image.height)
            region = (x0 * image.width, y0 * image.height, x1 * image.width, y1 * image.height)
            covered = world_lib.box_area(world_lib.box_intersection(boxes[target.id], region))
            clean = all(world_lib.box_area(world_lib.box_intersection(b, region)) < 0.8 * world_lib.box_area(b)
                        for k, b in boxes.items() if k in siblings)
            passes += covered >= 0.8 * world_lib.box_area(boxes[target.id]) and clean
    return {"images": total, "top_match_iou50": round(hits / max(total, 1), 4),
            "crop_passes": round(passes / max(total, 1), 4)}
