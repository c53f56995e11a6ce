"""An OFFLINE compositor "generator": not a diffusion model, a deterministic collage for the offline world.

It fits the chosen references into a grid on a canvas and renders the prompt in a text band below them, so
what the policy picked is exactly what ends up in the "generated" image (the offline world scores its
references exactly; tests get a real PNG with no server). Same interface as `clients.images.Generator`.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import math
import time
from collections.abc import Sequence

from PIL import Image, ImageDraw, ImageFont

from ranger_jax.clients import media
from ranger_jax.clients.images import GenerationResult, parse_size

DEFAULT_SIZE = (512, 512)
MAX_REFERENCES = 4  # references composed by default (Gen-Searcher's reward accepts 1 to 4)
TEXT_BAND_FRACTION = 0.2  # share of the canvas height given to the prompt text
PADDING = 8
TEXT_COLOUR = (20, 20, 20)
PNG_COMPRESS_LEVEL = 1  # a viewer image: fast zlib (half the encode time of the default level)
RESIZE_REDUCING_GAP = 2.0  # downscale by a whole factor first (box filter), then Lanczos: same look, ~3x faster


def _background(seed: int) -> tuple[int, int, int]:
    """A light background tint chosen by `seed`, so different seeds give different (but fixed) canvases."""
    digest = hashlib.sha256(str(seed).encode("ascii")).digest()
    return 232 + digest[0] % 24, 232 + digest[1] % 24, 232 + digest[2] % 24


def _grid(count: int) -> tuple[int, int]:
    """(columns, rows) for `count` references: 1 → 1×1, 2 → 2×1, 3–4 → 2×2."""
    columns = math.ceil(math.sqrt(count))
    return columns, math.ceil(count / columns)


def _fit(image: Image.Image, box: tuple[int, int]) -> Image.Image:
    """`image` scaled (aspect kept, up or down) to fit inside `box`."""
    scale = min(box[0] / image.width, box[1] / image.height)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, Image.Resampling.LANCZOS, reducing_gap=RESIZE_REDUCING_GAP)


def _wrap(draw: ImageDraw.ImageDraw, text: str, font: ImageFont.FreeTypeFont, width: int,
          max_lines: int) -> list[str]:
    """`text` broken into lines of at most `width` pixels; stops once a line beyond `max_lines` is started."""
    lines: list[str] = []
    for paragraph in text.splitlines() or [""]:
        line = ""
        for word in paragraph.split():
            candidate = f"{line} {word}".strip()
            if line and draw.textlength(candidate, font=font) > width:
                lines.append(line)
                if len(lines) > max_lines:
                    return lines
                line = word
            else:
                line = candidate
        lines.append(line)
        if len(lines) > max_lines:
            return lines
    return lines


def compose(prompt: str, references: Sequence[media.ImageLike], *, seed: int, size: tuple[int, int]) -> Image.Image:
    """The collage: references in a grid above a band with the prompt (cut with "…" when it overflows)."""
    width, height = size
    canvas = Image.new("RGB", size, _background(seed))
    band = max(1, round(height * TEXT_BAND_FRACTION))
    area = (width, height - band)
    if references:
        columns, rows = _grid(len(references))
        cell = ((area[0] - PADDING) // columns - PADDING, (area[1] - PADDING) // rows - PADDING)
        for i, ref in enumerate(references):
            tile = _fit(media.to_rgb(media.load_image(ref)), (max(1, cell[0]), max(1, cell[1])))
            x0 = PADDING + (i % columns) * (cell[0] + PADDING) + (cell[0] - tile.width) // 2
            y0 = PADDING + (i // columns) * (cell[1] + PADDING) + (cell[1] - tile.height) // 2
            canvas.paste(tile, (x0, y0))
    draw = ImageDraw.Draw(canvas)
    font_size = max(8, band // 5)
    font = ImageFont.load_default(size=font_size)
    max_lines = max(1, (band - PADDING) // (font_size + 2))
    lines = _wrap(draw, prompt, font, width - 2 * PADDING, max_lines)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1] + " …"
    top = height - band + PADDING // 2
    for j, line in enumerate(lines):
        draw.text((PADDING, top + j * (font_size + 2)), line, fill=TEXT_COLOUR, font=font)
    return canvas


class CompositorGenerator:
    """Offline, deterministic stand-in for an image generator (see module docstring).

    Args:
        size: default canvas size (width, height) or `"WxH"`.
        max_references: references beyond this count are dropped (recorded in `request`).
    """

    def __init__(self, *, size: str | tuple[int, int] = DEFAULT_SIZE, max_references: int = MAX_REFERENCES):
        self.size = parse_size(size)
        if max_references < 1:
            raise ValueError(f"max_references must be >= 1, got {max_references}")
        self.max_references = max_references

    def generate(self, prompt: str, references: Sequence[media.ImageLike] = (), *, seed: int | None = None,
                 size: str | tuple[int, int] | None = None) -> GenerationResult:
        """Composes one image; bad inputs (empty prompt, undecodable reference) give an `ok=False` result."""
        start = time.monotonic()
        used = list(references)[: self.max_references]
        request = {"generator": "offline-compositor", "prompt": prompt, "seed": 0 if seed is None else int(seed),
                   "num_references": len(used), "num_references_given": len(references)}
        try:
            canvas_size = self.size if size is None else parse_size(size)
            request["size"] = f"{canvas_size[0]}x{canvas_size[1]}"
            if not prompt.strip():
                raise ValueError("prompt is empty")
            image = compose(prompt, used, seed=request["seed"], size=canvas_size)
        except (ValueError, FileNotFoundError) as err:
            return GenerationResult(ok=False, image=None, error=f"bad generation request: {err}",
                                    latency_s=time.monotonic() - start, request=request)
        out = io.BytesIO()
        image.save(out, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
        return GenerationResult(ok=True, image=out.getvalue(), error=None, latency_s=time.monotonic() - start,
                                request=request)

    async def agenerate(self, prompt: str, references: Sequence[media.ImageLike] = (), *, seed: int | None = None,
                        size: str | tuple[int, int] | None = None) -> GenerationResult:
        """Async twin of `generate` (runs in a worker thread)."""
        return await asyncio.to_thread(self.generate, prompt, references, seed=seed, size=size)

    def close(self) -> None:
        """Nothing to release; present so every generator can be closed the same way."""

    async def aclose(self) -> None:
        """Nothing to release."""
