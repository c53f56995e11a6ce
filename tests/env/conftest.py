"""Fixtures for env tests: an in-memory corpus backend (a real `Backend` over dicts) and image bytes."""

from __future__ import annotations

import io
import random

import pytest
from PIL import Image

from ranger_jax.env.backends import base


def png_bytes(width: int, height: int, seed: int = 0, mode: str = "RGB") -> bytes:
    """A noisy PNG (noise keeps it above 1 KB and makes every seed's pixels distinct)."""
    rng = random.Random(seed)
    image = Image.frombytes("RGB", (width, height), bytes(rng.randrange(256) for _ in range(width * height * 3)))
    if mode != "RGB":
        image = image.convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


class MemoryBackend:
    """Search over fixed hit lists; pages and images from dicts; unknown URLs raise BackendError."""

    def __init__(self, *, text=None, images=None, pages=None, blobs=None):
        self.text = text or {}  # query -> [TextHit]
        self.images = images or {}  # query -> [ImageHit]
        self.pages = pages or {}  # url -> Page
        self.blobs = blobs or {}  # url -> bytes
        self.calls: list[tuple[str, str]] = []

    async def text_search(self, query, *, top_k, tbs=None):
        self.calls.append(("text_search", query))
        return self.text.get(query, [])[:top_k]

    async def image_search(self, query, *, top_k, tbs=None):
        self.calls.append(("image_search", query))
        return self.images.get(query, [])[:top_k]

    async def fetch_page(self, url):
        self.calls.append(("fetch_page", url))
        if url not in self.pages:
            raise base.BackendError(f"HTTP 404 from {url}")
        return self.pages[url]

    async def fetch_image(self, url, *, page_url=None):
        self.calls.append(("fetch_image", url))
        if url not in self.blobs:
            raise base.BackendError(f"HTTP 404 from {url}")
        return base.FetchedImage(url=url, data=self.blobs[url], content_type="image/png", page_url=page_url)

    async def aclose(self):
        pass


@pytest.fixture(scope="session")
def make_png():
    return png_bytes


@pytest.fixture(scope="session")
def memory_backend():
    return MemoryBackend


@pytest.fixture(scope="module")
def corpus():
    """Blobs and hits for a small image world: 7 images, one corrupt, one HTML."""
    blobs = {f"https://img.example.com/{i}.png": png_bytes(64 + 8 * i, 48 + 4 * i, seed=i) for i in range(7)}
    blobs["https://img.example.com/corrupt.png"] = b"\x89PNG\r\n\x1a\nthis is not really a png"
    blobs["https://img.example.com/page.html"] = b"<html><body>hello</body></html>"
    hits = [base.ImageHit(title=f"photo {i}", image_url=f"https://img.example.com/{i}.png",
                          page_url=f"https://news.example.com/{i}", position=i + 1) for i in range(7)]
    return {"blobs": blobs, "hits": hits}
