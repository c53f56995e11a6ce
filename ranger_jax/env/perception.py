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

Photographs (lit and JPEG-compressed pictures, as in version-2 offline worlds) keep almost no pixel at a named
colour. For a photograph (`is_photograph`: many distinct colours, where a flat drawing has a few hundred) the
finder first estimates the light: per-channel gains g = s·(1 + c_r, 1, 1 + c_b) that bring the most pixels
within `LIGHT_FIT` of a palette colour (a coarse-to-fine search over s, then c_r and c_b), divides them out, and
then gives each pixel the palette colour within `PHOTO_TOLERANCE` (none when farther); a thin motif blurred into
its ground counts when nearer the motif colour than the ground's (`MOTIF_BLUR`). A description may also name a
trim colour ("navy with white hoops, lime trim"): the ring just outside a candidate is checked for it; a
candidate without it ranks lower, and one with it is the whole outlined silhouette.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import re
import threading
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
PHOTO_COLOURS = 0.01  # distinct colours per pixel above which an image is a photograph (a drawing has a few hundred)
LIGHT_FIT = 12  # a pixel fits a palette colour under a light when every channel is within this
PHOTO_TOLERANCE = 28  # photographs: a pixel within this (per channel) of a palette colour, under the estimated
# light, has that colour; painted colours are at least 56 apart, so no pixel has two
TRIM_MIN = 0.05  # share of a candidate's outer ring in the named trim colour for the trim to count as seen
TRIM_MISS = 0.3  # score factor of a candidate without the named trim
MOTIF_BLUR = 80  # photographs: a pixel within this of the motif colour and nearer it than the ground is motif
_SAMPLES = 640  # pixels sampled to estimate the light


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
        trim: the trim colour asked for, when it covers at least TRIM_MIN of the ring around the region (else None).
    """

    box: tuple[int, int, int, int]
    colours: tuple[str, str]
    pattern: str | None
    pattern_fit: float
    coverage: float
    ground_share: float
    score: float
    trim: str | None = None


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
    """[H, W] bool: pixels [H, W, 3] (int16) within `tolerance` of `rgb` in every channel (channel by channel: a
    reduction over a last axis of 3 is several times slower in numpy)."""
    out = np.abs(pixels[..., 0] - np.int16(rgb[0])) <= tolerance
    for channel in (1, 2):
        out &= np.abs(pixels[..., channel] - np.int16(rgb[channel])) <= tolerance
    return out


def _fits(samples: np.ndarray, palette: np.ndarray, gains: np.ndarray) -> np.ndarray:
    """[G] how many of `samples` [N, 3] lie within LIGHT_FIT of a palette colour [K, 3] under each of `gains`
    [G, 3]."""
    lit = np.minimum(palette[None] * gains[:, None, :], 255.0).astype(np.float32)  # [G, K, 3]
    distance = np.abs(samples[None, :, None, :] - lit[:, None]).max(axis=3).min(axis=2)  # [G, N]
    return np.count_nonzero(distance <= LIGHT_FIT, axis=1)


_LIGHT_STEPS = (  # (which of s, c_r, c_b to set, values): coarse absolute values first, then fine offsets
    (0, np.arange(0.64, 1.27, 0.03)), (1, np.arange(-0.075, 0.076, 0.025)), (2, np.arange(-0.075, 0.076, 0.025)),
    (0, np.arange(-0.02, 0.021, 0.01)), (1, np.arange(-0.01, 0.011, 0.01)), (2, np.arange(-0.01, 0.011, 0.01)))
_LIGHTS: collections.OrderedDict[bytes, np.ndarray] = collections.OrderedDict()  # picture digest -> gains
_LIGHTS_KEPT = 512
_LIGHTS_LOCK = threading.Lock()


def _search_light(pixels: np.ndarray, colours: np.ndarray) -> np.ndarray:
    flat = pixels.reshape(-1, 3)
    samples = flat[:: max(1, len(flat) // _SAMPLES)].astype(np.float32)  # [N, 3]
    best = np.array([1.0, 0.0, 0.0])  # s, c_r, c_b
    for step, (which, values) in enumerate(_LIGHT_STEPS):
        options = np.tile(best, (len(values), 1))  # [G, 3]
        options[:, which] = values if step < 3 else best[which] + values
        gains = options[:, :1] * np.stack([1.0 + options[:, 1], np.ones(len(options)), 1.0 + options[:, 2]], axis=1)
        fits = _fits(samples, colours, gains)
        # the most fitting pixels; among ties the gain nearest 1
        best = options[max(range(len(options)), key=lambda i: (fits[i], -abs(options[i, 0] - 1.0)))]
    s, red, blue = best
    return np.array([s * (1.0 + red), s, s * (1.0 + blue)])


def estimate_light(pixels: np.ndarray, palette: Mapping[str, RGB]) -> np.ndarray:
    """Per-channel gains [3] of the light a picture [H, W, 3] was taken under (see the module docstring);
    remembered per picture (an episode looks at the same pictures again)."""
    colours = np.asarray(list(palette.values()), dtype=np.float64)
    digest = hashlib.blake2b(np.ascontiguousarray(pixels).tobytes() + colours.tobytes(), digest_size=16).digest()
    with _LIGHTS_LOCK:
        if (known := _LIGHTS.get(digest)) is not None:
            _LIGHTS.move_to_end(digest)
            return known.copy()
    gains = _search_light(pixels, colours)
    with _LIGHTS_LOCK:
        _LIGHTS[digest] = gains
        while len(_LIGHTS) > _LIGHTS_KEPT:
            _LIGHTS.popitem(last=False)
    return gains.copy()


def is_photograph(pixels: np.ndarray) -> bool:
    """Whether an image [H, W, 3] is a photograph: more than PHOTO_COLOURS distinct colours per pixel (lighting and
    compression leave few pixels alike; a drawing in flat colours has a few hundred colours in all)."""
    rgb = pixels.astype(np.uint32)
    codes = (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]
    return len(np.unique(codes)) > PHOTO_COLOURS * codes.size


def _read(image: Image.Image, palette: Mapping[str, RGB]) -> tuple[np.ndarray, bool]:
    """(pixel values [H, W, 3] float32, whether a photograph): a photograph's values have its light divided out."""
    pixels = np.asarray(image.convert("RGB"), dtype=np.int16)  # [H, W, 3]
    if not is_photograph(pixels):
        return pixels.astype(np.float32), False
    return pixels.astype(np.float32) / estimate_light(pixels, palette).astype(np.float32), True


def _planes(values: np.ndarray) -> np.ndarray:
    """[3, H, W] contiguous channel planes of pixel values [H, W, 3]."""
    return np.ascontiguousarray(np.moveaxis(values, -1, 0))


def _distance(planes: np.ndarray, rgb: RGB) -> np.ndarray:
    """[H, W] largest per-channel distance of each pixel (channel planes [3, H, W] float32) from `rgb`."""
    out = np.abs(planes[0] - np.float32(rgb[0]))
    for channel in (1, 2):
        np.maximum(out, np.abs(planes[channel] - np.float32(rgb[channel])), out=out)
    return out


def colour_masks(image: Image.Image, palette: Mapping[str, RGB], names: Sequence[str], *,
                 tolerance: int = DEFAULT_TOLERANCE) -> dict[str, np.ndarray]:
    """{name: [H, W] bool} pixels of each named colour: within `tolerance` of it in a drawn picture, or within
    PHOTO_TOLERANCE of it under the estimated light in a photograph (`is_photograph`)."""
    values, photo = _read(image, palette)
    limit = PHOTO_TOLERANCE if photo else tolerance
    planes = _planes(values)
    return {name: _distance(planes, palette[name]) <= limit for name in names}


def _close(mask: np.ndarray, size: int) -> np.ndarray:
    """`ndimage.binary_closing` of `mask` by a size x size square (outside the image counts as background), as a
    max then a min filter: the same pixels, about three times faster."""
    dilated = ndimage.maximum_filter(mask.view(np.uint8), size=size, mode="constant", cval=0)
    return ndimage.minimum_filter(dilated, size=size, mode="constant", cval=0).astype(bool)


def _ring_share(region_mask: np.ndarray, box: tuple[int, int, int, int], mask: np.ndarray, width: int) -> float:
    """Share of the ring of `width` pixels just outside a region that `mask` covers."""
    x0, y0, x1, y1 = box
    h, w = region_mask.shape
    ys, xs = slice(max(0, y0 - width), min(h, y1 + width)), slice(max(0, x0 - width), min(w, x1 + width))
    inside = region_mask[ys, xs]
    ring = ndimage.binary_dilation(inside, iterations=width) & ~inside
    total = int(ring.sum())
    return float((mask[ys, xs] & ring).sum()) / total if total else 0.0


def _outline_box(region_mask: np.ndarray, box: tuple[int, int, int, int], trim: np.ndarray, width: int
                 ) -> tuple[int, int, int, int]:
    """The box of a region together with the trim outline that touches it (the outline's connected pieces that
    meet the region's ring, within half the region's size around it)."""
    x0, y0, x1, y1 = box
    h, w = region_mask.shape
    mx, my = (x1 - x0) // 2, (y1 - y0) // 2
    ys, xs = slice(max(0, y0 - my), min(h, y1 + my)), slice(max(0, x0 - mx), min(w, x1 + mx))
    near = ndimage.binary_dilation(region_mask[ys, xs], iterations=width)
    pieces, count = ndimage.label(trim[ys, xs], structure=np.ones((3, 3), bool))
    touching = np.unique(pieces[near & (pieces > 0)])
    if touching.size == 0:
        return box
    outline = np.isin(pieces, touching)
    rows, cols = np.nonzero(outline)
    return (min(x0, xs.start + int(cols.min())), min(y0, ys.start + int(rows.min())),
            max(x1, xs.start + int(cols.max()) + 1), max(y1, ys.start + int(rows.max()) + 1))


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
                 tolerance: int = DEFAULT_TOLERANCE, min_colour_pixels: int = MIN_COLOUR_PIXELS,
                 trim: str | None = None, trim_inset: Callable[[int, int], int] | None = None) -> list[Found]:
    """Objects painted in `colours` (ground colour first, then the motif's), best match first.

    Args:
        image: any PIL image (converted to RGB); photographs are read under their estimated light.
        palette: colour name -> RGB of the colours objects are painted in.
        colours: one or two palette names; with one, the object is plain in that colour.
        pattern: the motif's pattern, if known; candidates whose best-fitting pattern differs rank lower.
        patterns: pattern name -> drawer, to recognise patterns (without it, colours alone rank candidates).
        tolerance: max per-channel distance of a pixel from a named colour (drawn pictures).
        min_colour_pixels: pixels of each asked colour a region needs.
        trim: the colour of the object's outline, if known; candidates without it around them rank lower, and
            a candidate with it is the whole outlined silhouette (its pattern is fitted inside the outline).
        trim_inset: (width, height) of an outlined object -> the outline's width in pixels, as the world draws it
            (None: 0), so the pattern is fitted where it was laid.

    Raises:
        ValueError: a colour not in the palette (named), or not one or two colours.
    """
    if pattern is not None and (patterns is None or pattern not in patterns):
        raise ValueError(f"unknown pattern {pattern!r}; known patterns: {sorted(patterns or ())}")
    if not 1 <= len(colours) <= 2:
        raise ValueError(f"find_objects takes one or two colours; got {len(colours)}: {list(colours)!r}")
    for name in [*colours, *([trim] if trim else [])]:
        if name not in palette:
            raise ValueError(f"unknown colour {name!r}; known colours: {sorted(palette)}")
    ground_name = colours[0]
    motif_name = colours[-1]
    values, photo = _read(image, palette)
    limit = PHOTO_TOLERANCE if photo else tolerance
    planes = _planes(values)
    to_ground = _distance(planes, palette[ground_name])
    ground = to_ground <= limit
    to_motif = _distance(planes, palette[motif_name])
    motif = to_motif <= limit if motif_name != ground_name else ground
    # thin motif lines blur into their ground in a photograph: nearer the motif than the ground counts as motif
    motif_seen = (to_motif <= MOTIF_BLUR) & (to_motif < to_ground) if photo and motif_name != ground_name else motif
    trim_mask = _distance(planes, palette[trim]) <= limit if trim else None
    joined = _close(ground | motif, 5)
    labels, count = ndimage.label(joined)
    found = []
    for index, region in enumerate(ndimage.find_objects(labels), start=1):
        if region is None:
            continue
        ys, xs = region
        inside = labels[region] == index
        n_ground = int(np.sum(ground[region] & inside))
        n_motif = int(np.sum(motif_seen[region] & inside & ~ground[region]))
        if n_ground < min_colour_pixels or (motif_name != ground_name and n_motif < min_colour_pixels):
            continue
        h, w = ys.stop - ys.start, xs.stop - xs.start
        if min(h, w) < MIN_BOX_SIDE:
            continue
        coverage = (n_ground + n_motif) / float(h * w)
        ground_share = n_ground / float(n_ground + n_motif)
        dominance = 1.0 if ground_share >= 0.4 else ground_share / 0.4
        score = min(1.0, coverage) * dominance
        box = (xs.start, ys.start, xs.stop, ys.stop)
        frame, frame_inside = region, inside  # where the pattern tile is laid: the region, or the outlined body
        seen_trim = None
        if trim:
            region_mask = np.zeros(labels.shape, dtype=bool)
            region_mask[region] = inside
            ring = max(4, round(min(h, w) * 0.1))  # wider than any trim outline
            if _ring_share(region_mask, box, trim_mask, ring) >= TRIM_MIN:
                seen_trim = trim
                # the outline encloses the whole silhouette, parts in other colours (windows, wheels) included
                box = _outline_box(region_mask, box, trim_mask, ring)
                inset = trim_inset(box[2] - box[0], box[3] - box[1]) if trim_inset else 0
                frame = (slice(box[1] + inset, max(box[1] + inset + 1, box[3] - inset)),
                         slice(box[0] + inset, max(box[0] + inset + 1, box[2] - inset)))
                frame_inside = np.ones((frame[0].stop - frame[0].start, frame[1].stop - frame[1].start), bool)
            else:
                score *= TRIM_MISS
        seen, fit = None, 0.0
        if patterns and motif_name != ground_name:
            painted = (ground[frame] | motif_seen[frame]) & frame_inside
            seen, fit = fit_pattern(motif_seen[frame] & frame_inside & ~ground[frame], painted, palette[ground_name],
                                    palette[motif_name], patterns)
            if pattern is not None and seen != pattern:
                score *= 0.25
        found.append(Found(box=box, colours=(ground_name, motif_name),
                           pattern=seen, pattern_fit=fit, coverage=round(coverage, 4),
                           ground_share=round(ground_share, 4), score=round(score, 4), trim=seen_trim))
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
        trim_inset: the width of an object's trim outline as the world draws it (`find_objects`).
    """

    palette: Mapping[str, RGB]
    patterns: Mapping[str, PatternDrawer] = dataclasses.field(default_factory=dict)
    margins: tuple[float, float] = CROP_MARGINS
    trim_inset: Callable[[int, int], int] | None = None

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

    def parse_trim(self, description: str) -> str | None:
        """The trim colour a description names ("…, lime trim"): a third colour, right before "trim"."""
        colours = colour_words(description, self.palette)
        said = re.search(r"\b([A-Za-z]+) trim\b", description)
        if said is None or len(colours) < 3:
            return None
        name = next((c for c in colours if c.lower() == said.group(1).lower()), None)
        return name if name is not None and name not in colours[:2] else None

    def find(self, image: Image.Image, description: str) -> list[Found]:
        """Objects in `image` matching `description`, best first."""
        colours, pattern = self.parse(description)
        return find_objects(image, self.palette, colours, pattern=pattern, patterns=self.patterns or None,
                            trim=self.parse_trim(description), trim_inset=self.trim_inset)

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
