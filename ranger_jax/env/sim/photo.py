"""Pictures of version-2 worlds: crowded scenes with occlusion, varied scale, lighting and JPEG noise, re-hosts.

Objects are painted as in version 1 (`render.draw_entity`, now with a trim outline). What changes is the camera:
  - scenes hold 2-5 objects at several depths and sizes; neighbours overlap, and whatever is drawn later hides
    what is behind it. Each object's `visible` share (its silhouette pixels that nothing covers) is recorded;
  - pictures come in several sizes, and product shots fill more or less of theirs;
  - each picture has its own lighting (a brightness gain and a warm or cool cast) and is served as a JPEG of its
    own quality, so no pixel keeps the exact colour it was painted in;
  - a re-host decodes another picture, trims a margin that cuts no object, scales it down and re-encodes it.
Backgrounds and clutter use muted tones that no lighting in range can turn into a painted colour, so a colour
that reads as "navy" after correcting for the light belongs to an object. Every draw comes from the `rng` given.
"""

from __future__ import annotations

import bisect
import io
import random

import numpy as np
from PIL import Image, ImageDraw

from ranger_jax.env.sim import catalog, render
from ranger_jax.env.sim.world import Entity

GAIN = {"studio": (0.9, 1.08), "scene": (0.78, 1.15), "leak": (0.7, 0.95)}  # brightness gain ranges
CAST = 0.05  # largest red / blue cast (fraction of the gain)
QUALITY = {"studio": (70, 92), "scene": (60, 90), "leak": (45, 65), "rehost": (50, 80)}  # JPEG quality ranges
SCENE_WIDTHS = (400, 480, 560, 640)
MAX_OVERLAP = 0.45  # neighbours overlap by at most this share of the narrower one's width
FRONT_OVERLAP = 0.2  # ... and by at most this much next to the object a picture is about (it stays croppable)
_PALETTE = np.array(list(catalog.COLOURS.values()), dtype=np.float64)  # [16, 3]


def is_muted(rgb: tuple[int, int, int]) -> bool:
    """Whether no gain in 0.6-1.7 with a cast of up to 30% makes `rgb` one of the painted colours."""
    colour = np.asarray(rgb, dtype=np.float64)
    if np.min(np.max(np.abs(_PALETTE - colour), axis=1)) < 40:
        return False
    ratios = colour / np.maximum(_PALETTE, 8.0)  # [16, 3]
    spread = ratios.max(axis=1) / np.maximum(ratios.min(axis=1), 1e-6)
    level = ratios.mean(axis=1)
    return not np.any((spread < 1.3) & (level > 0.6) & (level < 1.7))


def _muted_table() -> list[tuple[int, int, int]]:
    """Every muted colour on a grid of step 6, darkest first (by mean level)."""
    grid = np.arange(36, 236, 6)
    r, g, b = np.meshgrid(grid, grid, grid, indexing="ij")
    colours = np.stack([r.ravel(), g.ravel(), b.ravel()], axis=1).astype(np.float64)  # [N, 3]
    spread_ok = colours.max(axis=1) - colours.min(axis=1) <= 56  # muted: channels within 56 levels of each other
    near = np.min(np.max(np.abs(colours[:, None, :] - _PALETTE[None]), axis=2), axis=1) >= 40
    ratios = colours[:, None, :] / np.maximum(_PALETTE[None], 8.0)  # [N, 16, 3]
    spread = ratios.max(axis=2) / np.maximum(ratios.min(axis=2), 1e-6)
    level = ratios.mean(axis=2)
    liftable = np.any((spread < 1.3) & (level > 0.6) & (level < 1.7), axis=1)
    keep = colours[spread_ok & near & ~liftable].astype(int)
    return sorted((tuple(int(v) for v in c) for c in keep), key=lambda c: (sum(c), c))


_MUTED = _muted_table()
_MUTED_LEVELS = [sum(c) / 3 for c in _MUTED]


def _muted(rng: random.Random, low: int, high: int) -> tuple[int, int, int]:
    """A muted colour (`is_muted`) whose mean level is in [low, high]."""
    start, stop = bisect.bisect_left(_MUTED_LEVELS, low), bisect.bisect_right(_MUTED_LEVELS, high)
    return _MUTED[rng.randrange(start, stop)]


def _backdrop(rng: random.Random, size: tuple[int, int], studio: bool) -> tuple[Image.Image, int]:
    """A background in muted tones and its floor line: a studio sweep, or a wall and floor with clutter."""
    w, h = size
    wall = _muted(rng, 150, 200) if studio else _muted(rng, 80, 190)
    image = Image.new("RGB", size, wall)
    draw = ImageDraw.Draw(image)
    floor = int(h * (0.9 if studio else rng.uniform(0.78, 0.9)))
    draw.rectangle((0, floor, w, h), fill=_muted(rng, 60, 150))
    if not studio:
        for _ in range(rng.randint(3, 7)):
            cx, cy = rng.randint(0, w), rng.randint(0, floor)
            rw, rh = rng.randint(12, 70), rng.randint(8, 50)
            draw.rectangle((cx - rw, cy - rh, cx + rw, cy + rh), fill=_muted(rng, 70, 200))
    return image, floor


def _camera(image: Image.Image, rng: random.Random, light: str, quality: str) -> bytes:
    """The picture under its own lighting (each channel scaled by the gain and its cast), as JPEG bytes of a
    drawn quality."""
    gain = rng.uniform(*GAIN[light])
    cast = (1 + rng.uniform(-CAST, CAST), 1.0, 1 + rng.uniform(-CAST, CAST))
    levels = np.arange(256, dtype=np.float64)[None, :] * (np.asarray(cast)[:, None] * gain)  # [3, 256]
    lut = np.clip(np.rint(levels), 0, 255).astype(np.int64).ravel().tolist()
    lit = image.point(lut)
    buffer = io.BytesIO()
    lit.save(buffer, "JPEG", quality=rng.randint(*QUALITY[quality]))
    return buffer.getvalue()


def clean_shot(entity: Entity, shape: str, aspect: float, rng: random.Random, *, light: str = "studio"
               ) -> tuple[bytes, tuple, tuple[int, int]]:
    """A product shot of `entity` alone on a studio backdrop: (JPEG bytes, its box, (width, height))."""
    base = (256, 336) if aspect < 0.8 else (384, 256) if aspect > 1.3 else (320, 320)
    scale = rng.uniform(0.8, 1.25)
    size = (int(base[0] * scale), int(base[1] * scale))
    image, _ = _backdrop(rng, size, studio=True)
    cw, ch = size
    fill = rng.uniform(0.65, 0.85)
    w, h = (int(cw * fill), int(cw * fill / aspect)) if aspect >= cw / ch else (int(ch * fill * aspect), int(ch * fill))
    x0 = (cw - w) // 2 + rng.randint(-8, 8)
    y0 = (ch - h) // 2 + rng.randint(-8, 8)
    box = (x0, y0, x0 + w, y0 + h)
    render.draw_entity(image, entity, shape, box)
    return _camera(image, rng, light, "studio"), box, size


def _layout(sizes: list[tuple[float, float]], w: int, h: int, floor: int, rng: random.Random,
            front: int | None) -> list[tuple]:
    """Boxes for objects of `sizes` standing left to right, neighbours overlapping by up to MAX_OVERLAP of the
    narrower one's width (FRONT_OVERLAP next to `front`); a crowd of three or more mostly overlaps."""
    total = sum(ow for ow, _ in sizes)
    slack = w * 0.96 - total
    overlaps = []
    for i, ((a, _), (b, _)) in enumerate(zip(sizes, sizes[1:])):
        most = FRONT_OVERLAP if front in (i, i + 1) else MAX_OVERLAP
        crowded = slack < 0 or rng.random() < (0.8 if len(sizes) >= 3 else 0.4)
        overlaps.append(rng.uniform(0.05, most) * min(a, b) if crowded else 0.0)
    need = total - sum(overlaps)
    scale = min(1.0, (w * 0.96) / need)
    gap = max(0.0, (w - need * scale) / (len(sizes) + 1))
    boxes, x = [], gap
    for i, (ow, oh) in enumerate(sizes):
        ow, oh = ow * scale, oh * scale
        x0 = int(max(0, min(w - ow, x + rng.uniform(-0.3, 0.3) * gap)))
        y1 = min(h - 2, int(floor + rng.uniform(-0.06, 0.08) * h))
        boxes.append((x0, max(0, y1 - int(oh)), min(w, x0 + int(ow)), y1))
        x = x0 + ow + gap - (overlaps[i] * scale if i < len(overlaps) else 0.0)
    return boxes


def scene(items: list[tuple[Entity, str, float]], rng: random.Random, *, front: int | None = None,
          light: str = "scene") -> tuple[bytes, list[tuple], list[float], tuple[int, int]]:
    """A crowded scene of `items` (entity, shape, aspect), objects at several depths, some hiding others.

    Args:
        front: index of the item drawn last (in front of all); None: a random drawing order.

    Returns:
        (JPEG bytes, one pixel box per item, one visible share per item, (width, height)).
    """
    w = rng.choice(SCENE_WIDTHS)
    h = int(w * rng.uniform(0.62, 0.72))
    image, floor = _backdrop(rng, (w, h), studio=False)
    sizes = []
    for _, _, aspect in items:
        oh = h * rng.uniform(0.3, 0.52)
        ow = min(oh * aspect, w * 0.4)
        sizes.append((ow, ow / aspect))
    boxes = _layout(sizes, w, h, floor, rng, front)
    order = list(range(len(items)))
    rng.shuffle(order)
    if front is not None:
        order.remove(front)
        order.append(front)
    masks = []
    for i in range(len(items)):
        x0, y0, x1, y1 = boxes[i]
        full = np.zeros((h, w), dtype=bool)
        full[y0:y1, x0:x1] = np.asarray(render.silhouette(items[i][1], x1 - x0, y1 - y0)) > 0
        masks.append(full)
    visible = [1.0] * len(items)
    for rank, i in enumerate(order):
        entity, shape, _ = items[i]
        render.draw_entity(image, entity, shape, boxes[i])
        later = np.zeros((h, w), dtype=bool)
        for j in order[rank + 1:]:
            later |= masks[j]
        own = max(1, int(masks[i].sum()))
        visible[i] = round(float((masks[i] & ~later).sum()) / own, 4)
    return _camera(image, rng, light, "leak" if light == "leak" else "scene"), boxes, visible, (w, h)


def rehost(source_jpeg: bytes, boxes: list[tuple], rng: random.Random) -> tuple[bytes, list[tuple], tuple[int, int]]:
    """A copy of a picture: a margin that cuts no object trimmed, scaled down, re-encoded.

    Returns:
        (JPEG bytes, the boxes in the copy's pixels, (width, height)).
    """
    with Image.open(io.BytesIO(source_jpeg)) as decoded:
        image = decoded.convert("RGB")
    w, h = image.size
    ux0, uy0 = min(b[0] for b in boxes), min(b[1] for b in boxes)
    ux1, uy1 = max(b[2] for b in boxes), max(b[3] for b in boxes)
    left = rng.randint(0, max(0, min(int(w * 0.06), int(ux0))))
    top = rng.randint(0, max(0, min(int(h * 0.06), int(uy0))))
    right = w - rng.randint(0, max(0, min(int(w * 0.06), int(w - ux1))))
    bottom = h - rng.randint(0, max(0, min(int(h * 0.06), int(h - uy1))))
    factor = rng.uniform(0.6, 1.0)
    size = (max(16, int((right - left) * factor)), max(16, int((bottom - top) * factor)))
    fx, fy = size[0] / (right - left), size[1] / (bottom - top)
    copy = image.crop((left, top, right, bottom)).resize(size, Image.BILINEAR)
    moved = [(round((b[0] - left) * fx, 2), round((b[1] - top) * fy, 2), round((b[2] - left) * fx, 2),
              round((b[3] - top) * fy, 2)) for b in boxes]
    buffer = io.BytesIO()
    copy.save(buffer, "JPEG", quality=rng.randint(*QUALITY["rehost"]))
    return buffer.getvalue(), moved, size
