"""The offline compositor generator."""
import asyncio
import io

import numpy as np
from PIL import Image

from ranger_jax.clients import compositor, images


def decode(result):
    return np.asarray(Image.open(io.BytesIO(result.image)))


def test_deterministic_and_seed_dependent():
    refs = [Image.new("RGB", (40, 80), "red"), Image.new("RGB", (80, 40), "blue")]
    gen = compositor.CompositorGenerator(size=(256, 256))
    a, b = gen.generate("two things", refs, seed=1), gen.generate("two things", refs, seed=1)
    assert a.ok and a.image == b.image and isinstance(gen, images.Generator)
    assert gen.generate("two things", refs, seed=2).image != a.image
    assert gen.generate("other words", refs, seed=1).image != a.image
    assert a.request == {"generator": "offline-compositor", "prompt": "two things", "seed": 1, "num_references": 2,
                         "num_references_given": 2, "size": "256x256"}


def test_references_are_placed_in_order_and_prompt_rendered():
    colours = [(255, 0, 0), (0, 0, 255), (0, 255, 0), (255, 255, 0), (0, 0, 0)]
    refs = [Image.new("RGB", (30, 30), c) for c in colours]
    result = compositor.CompositorGenerator(size="300x400").generate("A red lighthouse", refs, seed=0)
    pixels = decode(result)
    assert pixels.shape == (400, 300, 3) and result.request["num_references"] == 4
    band_top = 400 - round(400 * compositor.TEXT_BAND_FRACTION)
    cell_w, cell_h = (300 - 8) // 2 - 8, (band_top - 8) // 2 - 8
    centres = [(8 + c * (cell_w + 8) + cell_w // 2, 8 + r * (cell_h + 8) + cell_h // 2) for r in (0, 1) for c in (0, 1)]
    assert [tuple(pixels[y, x]) for x, y in centres] == colours[:4]
    band = pixels[band_top:]
    assert (band.sum(axis=2) < 200).any()  # dark text pixels in the band


def test_text_only_and_failures():
    gen = compositor.CompositorGenerator()
    assert decode(gen.generate("just text")).shape == (512, 512, 3)
    assert gen.generate(" ").error == "bad generation request: prompt is empty"
    assert "not a decodable image" in gen.generate("x", [b"junk"]).error
    assert "size must be" in gen.generate("x", size="0x1").error
    result = asyncio.run(gen.agenerate("async", [Image.new("RGB", (5, 5))], seed=3, size=(64, 64)))
    assert result.ok and decode(result).shape == (64, 64, 3)
