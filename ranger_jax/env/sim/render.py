"""PIL rendering of the world's images: one entity as a clean product shot, or several in a crowded scene.

An entity is painted as its subcategory's silhouette (shirt, sneaker, phone, poster, …) filled with its
primary colour, overlaid with its pattern in the secondary colour, and stamped with its emblem text on a
badge, so the four identifying attributes are all visible in the pixels. Drawing uses only the `rng` it is
given, so the same seed gives byte-identical PNGs.
"""

from __future__ import annotations

import functools
import random

from PIL import Image, ImageDraw, ImageFont

from ranger_jax.env.sim import catalog
from ranger_jax.env.sim.world import Entity

SCENE_SIZE = (480, 320)  # width, height of crowded scenes
CLEAN_FILL = 0.82  # a product shot's object spans this fraction of the canvas along its longer side

# Silhouettes as polygons in box-relative coordinates (0–1); shapes not listed are rectangles.
_POLYGONS = {
    "shirt": ((0.3, 0.0), (0.7, 0.0), (1.0, 0.2), (0.88, 0.42), (0.78, 0.34), (0.78, 1.0), (0.22, 1.0),
              (0.22, 0.34), (0.12, 0.42), (0.0, 0.2)),
    "hoodie": ((0.32, 0.12), (0.38, 0.0), (0.62, 0.0), (0.68, 0.12), (1.0, 0.3), (0.88, 0.95), (0.78, 0.9),
               (0.78, 1.0), (0.22, 1.0), (0.22, 0.9), (0.12, 0.95), (0.0, 0.3)),
    "sneaker": ((0.0, 0.5), (0.32, 0.45), (0.5, 0.12), (0.72, 0.12), (0.82, 0.42), (1.0, 0.58), (1.0, 0.86),
                (0.0, 0.86)),
    "bag": ((0.1, 0.32), (0.9, 0.32), (1.0, 1.0), (0.0, 1.0)),
    "car": ((0.0, 0.48), (0.18, 0.42), (0.3, 0.16), (0.7, 0.16), (0.84, 0.42), (1.0, 0.5), (1.0, 0.8),
            (0.0, 0.8)),
}
# Where the emblem badge sits, box-relative.
_EMBLEM_AT = {"shirt": (0.5, 0.52), "hoodie": (0.5, 0.55), "sneaker": (0.45, 0.66), "bag": (0.5, 0.66),
              "car": (0.5, 0.6), "helmet": (0.42, 0.42), "watch": (0.5, 0.5), "phone": (0.5, 0.62),
              "ball": (0.5, 0.5)}
_INK_DARK = (16, 16, 16)
_INK_LIGHT = (250, 250, 250)


@functools.lru_cache(maxsize=64)
def _font(size: int) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def _mask(shape: str, w: int, h: int) -> Image.Image:
    """Silhouette of `shape` at w×h pixels as an 'L' mask."""
    mask = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(mask)
    if shape in _POLYGONS:
        draw.polygon([(x * (w - 1), y * (h - 1)) for x, y in _POLYGONS[shape]], fill=255)
    elif shape == "ball":
        draw.ellipse((0, 0, w - 1, h - 1), fill=255)
    elif shape == "helmet":
        draw.chord((0, 0, w - 1, int(h * 1.5)), 180, 360, fill=255)
        draw.rectangle((0, int(h * 0.74), w - 1, h - 1), fill=255)
    elif shape == "phone":
        draw.rounded_rectangle((0, 0, w - 1, h - 1), radius=max(2, w // 6), fill=255)
    elif shape == "watch":
        draw.rectangle((int(w * 0.3), 0, int(w * 0.7), h - 1), fill=255)
        draw.ellipse((0, int(h * 0.5 - w * 0.5), w - 1, int(h * 0.5 + w * 0.5)), fill=255)
    else:  # panel, square, poster, cover, book, stamp
        draw.rectangle((0, 0, w - 1, h - 1), fill=255)
    return mask


def _pattern(pattern: str, w: int, h: int, primary: tuple, secondary: tuple) -> Image.Image:
    """A w×h tile of `pattern` in `secondary` over a `primary` ground."""
    tile = Image.new("RGB", (w, h), primary)
    draw = ImageDraw.Draw(tile)
    step = max(6, min(w, h) // 6)
    half = step // 2
    if pattern == "stripes":
        for x in range(half // 2, w, step):
            draw.rectangle((x, 0, x + half - 1, h), fill=secondary)
    elif pattern == "hoops":
        for y in range(half // 2, h, step):
            draw.rectangle((0, y, w, y + half - 1), fill=secondary)
    elif pattern == "diagonals":
        for x in range(-h, w, step):
            draw.line((x, h, x + h, 0), fill=secondary, width=max(2, half - 1))
    elif pattern == "checks":
        for y in range(0, h, half):
            for x in range((y // half) % 2 * half, w, step):
                draw.rectangle((x, y, x + half - 1, y + half - 1), fill=secondary)
    elif pattern == "dots":
        r = max(2, step // 4)
        for y in range(half, h, step):
            for x in range(half, w, step):
                draw.ellipse((x - r, y - r, x + r, y + r), fill=secondary)
    elif pattern == "chevrons":
        for y in range(0, h + step, step):
            draw.line((0, y, w // 2, y - half, w, y), fill=secondary, width=max(2, half // 2 + 1), joint="curve")
    elif pattern == "halves":
        draw.rectangle((w // 2, 0, w, h), fill=secondary)
    elif pattern == "plain":
        band = max(3, h // 9)
        draw.rectangle((0, 0, w, band), fill=secondary)
        draw.rectangle((0, h - band, w, h), fill=secondary)
    else:
        raise ValueError(f"unknown pattern {pattern!r}; known: {catalog.PATTERNS}")
    return tile


def _details(draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int]) -> None:
    """Parts that are not patterned: wheels, soles, visors, cameras, handles, perforations, spines."""
    x0, y0, x1, y1 = box
    w, h = x1 - x0, y1 - y0
    if shape == "car":
        r = int(h * 0.17)
        for cx in (x0 + int(w * 0.22), x0 + int(w * 0.78)):
            draw.ellipse((cx - r, y0 + int(h * 0.8) - r, cx + r, y0 + int(h * 0.8) + r), fill=(30, 30, 30))
        draw.polygon([(x0 + w * 0.34, y0 + h * 0.22), (x0 + w * 0.66, y0 + h * 0.22),
                      (x0 + w * 0.76, y0 + h * 0.4), (x0 + w * 0.24, y0 + h * 0.4)], fill=(170, 200, 220))
    elif shape == "sneaker":
        draw.rectangle((x0, y0 + int(h * 0.86), x1 - 1, y1 - 1), fill=(236, 236, 230))
    elif shape == "helmet":
        draw.rectangle((x0 + int(w * 0.55), y0 + int(h * 0.36), x1 - int(w * 0.04), y0 + int(h * 0.6)),
                       fill=(40, 44, 60))
    elif shape == "phone":
        r = max(3, w // 8)
        cx, cy = x0 + w // 4 + r, y0 + h // 10 + r
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=(30, 30, 34), outline=(200, 200, 200))
    elif shape == "bag":
        draw.arc((x0 + int(w * 0.28), y0, x1 - int(w * 0.28), y0 + int(h * 0.62)), 180, 360,
                 fill=(60, 40, 30), width=max(2, w // 30))
    elif shape == "stamp":
        r = max(2, min(w, h) // 28)
        for x in range(x0, x1, 3 * r):
            draw.ellipse((x, y0 - r, x + 2 * r, y0 + r), fill=(255, 255, 255))
            draw.ellipse((x, y1 - r, x + 2 * r, y1 + r), fill=(255, 255, 255))
        for y in range(y0, y1, 3 * r):
            draw.ellipse((x0 - r, y, x0 + r, y + 2 * r), fill=(255, 255, 255))
            draw.ellipse((x1 - r, y, x1 + r, y + 2 * r), fill=(255, 255, 255))
    elif shape == "book":
        draw.rectangle((x0, y0, x0 + max(3, w // 10), y1 - 1), fill=(40, 30, 30))


def silhouette(shape: str, w: int, h: int) -> Image.Image:
    """The 'L' mask (255 inside) of `shape` drawn at w×h pixels: which pixels of its box an object covers."""
    return _mask(shape, w, h)


def trim_width(w: int, h: int) -> int:
    """Width in pixels of the trim outline of an object drawn in a w×h box (entities with a trim colour)."""
    return max(3, round(min(w, h) * 0.07))  # thick enough to survive JPEG's halved colour resolution


def draw_entity(canvas: Image.Image, entity: Entity, shape: str, box: tuple[int, int, int, int]) -> None:
    """Paints `entity` as `shape` into `box` (pixels, [x0, y0, x1, y1]) of `canvas`, in place.

    An entity with a trim colour (version-2 worlds) gets a `trim_width` outline in it: the silhouette is filled
    with the trim colour and the patterned body is drawn over it, inset by the trim's width on every side.
    """
    x0, y0, x1, y1 = box
    w, h = x1 - x0, y1 - y0
    look = entity.attributes
    primary, secondary = catalog.COLOURS[look.primary], catalog.COLOURS[look.secondary]
    px0, py0, pw, ph = x0, y0, w, h
    if look.trim is not None:
        t = trim_width(w, h)
        canvas.paste(catalog.COLOURS[look.trim], (x0, y0, x1, y1), _mask(shape, w, h))
        px0, py0, pw, ph = x0 + t, y0 + t, w - 2 * t, h - 2 * t
    canvas.paste(_pattern(look.pattern, pw, ph, primary, secondary), (px0, py0), _mask(shape, pw, ph))
    draw = ImageDraw.Draw(canvas)
    _details(draw, shape, box)
    fx, fy = _EMBLEM_AT.get(shape, (0.5, 0.5))
    size = max(9, int(min(w, h) * 0.2))
    font = _font(size)
    cx, cy = x0 + fx * w, y0 + fy * h
    left, top, right, bottom = draw.textbbox((cx, cy), look.emblem, font=font, anchor="mm")
    pad = max(2, size // 5)
    draw.rounded_rectangle((left - pad, top - pad, right + pad, bottom + pad), radius=pad, fill=primary,
                           outline=secondary, width=max(1, pad // 2))
    ink = _INK_DARK if catalog.luminance(primary) > 0.55 else _INK_LIGHT
    draw.text((cx, cy), look.emblem, font=font, fill=ink, anchor="mm")


def _backdrop(rng: random.Random, size: tuple[int, int], studio: bool) -> tuple[Image.Image, int]:
    """A background and its floor line: a plain studio sweep, or a muted wall and floor with clutter."""
    w, h = size
    if studio:
        tone = rng.randint(222, 242)
        image = Image.new("RGB", size, (tone, tone, tone - 4))
        floor = int(h * 0.9)
        ImageDraw.Draw(image).rectangle((0, floor, w, h), fill=(tone - 18, tone - 18, tone - 22))
        return image, floor
    wall = tuple(rng.randint(90, 200) for _ in range(3))
    image = Image.new("RGB", size, wall)
    draw = ImageDraw.Draw(image)
    floor = int(h * rng.uniform(0.78, 0.9))
    draw.rectangle((0, floor, w, h), fill=tuple(max(0, c - 50) for c in wall))
    for _ in range(rng.randint(3, 7)):  # windows, shelves, lamps: unannotated clutter in muted tones
        cx, cy = rng.randint(0, w), rng.randint(0, floor)
        rw, rh = rng.randint(12, 70), rng.randint(8, 50)
        tone = tuple(min(255, max(0, c + rng.randint(-40, 40))) for c in wall)
        draw.rectangle((cx - rw, cy - rh, cx + rw, cy + rh), fill=tone)
    return image, floor


def render_clean(entity: Entity, shape: str, aspect: float, rng: random.Random) -> tuple[Image.Image, tuple]:
    """A product shot: `entity` alone, centred on a studio backdrop.

    Returns:
        (image, box) with box the entity's pixel box [x0, y0, x1, y1].
    """
    size = (256, 336) if aspect < 0.8 else (384, 256) if aspect > 1.3 else (320, 320)
    image, _ = _backdrop(rng, size, studio=True)
    cw, ch = size
    if aspect >= cw / ch:
        w = int(cw * CLEAN_FILL)
        h = int(w / aspect)
    else:
        h = int(ch * CLEAN_FILL)
        w = int(h * aspect)
    x0 = (cw - w) // 2 + rng.randint(-6, 6)
    y0 = (ch - h) // 2 + rng.randint(-6, 6)
    box = (x0, y0, x0 + w, y0 + h)
    draw_entity(image, entity, shape, box)
    return image, box


def render_scene(items: list[tuple[Entity, str, float]], rng: random.Random) -> tuple[Image.Image, list[tuple]]:
    """A crowded scene: `items` (entity, shape, aspect) standing side by side on a cluttered backdrop.

    Objects may overlap their neighbours slightly. Returns (image, boxes) with one pixel box per item, in
    the order of `items`.
    """
    w, h = SCENE_SIZE
    image, floor = _backdrop(rng, SCENE_SIZE, studio=False)
    sizes = []
    for _, _, aspect in items:
        oh = h * rng.uniform(0.36, 0.5)
        ow = min(oh * aspect, w * 0.42)
        sizes.append((ow, ow / aspect))
    total = sum(ow for ow, _ in sizes)
    scale = min(1.0, (w * 0.94) / total)
    sizes = [(ow * scale, oh * scale) for ow, oh in sizes]
    gap = (w - sum(ow for ow, _ in sizes)) / (len(items) + 1)
    boxes = []
    x = gap
    for ow, oh in sizes:
        x0 = int(max(0, x + rng.uniform(-0.35, 0.35) * gap))
        x1 = min(w, x0 + int(ow))
        y1 = min(h - 2, int(floor + rng.uniform(-0.04, 0.08) * h))
        y0 = max(0, y1 - int(oh))
        boxes.append((x0, y0, x1, y1))
        x += ow + gap
    for (entity, shape, _), box in zip(items, boxes):
        draw_entity(image, entity, shape, box)
    return image, boxes


def pattern_drawers() -> dict[str, "functools.partial[Image.Image]"]:
    """Pattern name -> `(width, height, ground RGB, motif RGB) -> tile`: how the world paints each motif.

    What a perception model trained on this world's pictures would know about its patterns; used by the
    pixel-only object finder (`ranger_jax.env.perception`).
    """
    return {name: functools.partial(_pattern, name) for name in catalog.PATTERNS}
