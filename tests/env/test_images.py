import hashlib
import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from ranger_jax.env import images


def png_bytes(width, height, seed=0, mode="RGB"):
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def store(tmp_path):
    return images.ImageStore(tmp_path / "store", max_bytes=200_000, max_pixels=1_000_000, min_side=4)


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height, with one tiny compressed row: a decompression-bomb shape."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_add_is_content_addressed_and_deduplicated(store):
    data = png_bytes(40, 30, seed=1)
    stored = store.add(data, source="u1")
    assert (stored.width, stored.height) == (40, 30)
    assert stored.path.endswith(f"{stored.sha256}.png")
    with open(stored.path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == stored.sha256
    assert store.add(data, source="u2") == stored
    assert store.open(stored).mode == "RGB"


def test_non_rgb_images_are_converted_and_alpha_flattened_on_white(store):
    rgba = Image.new("RGBA", (10, 10), (255, 0, 0, 0))
    buffer = io.BytesIO()
    rgba.save(buffer, format="PNG")
    stored = store.add(buffer.getvalue(), source="alpha")
    with Image.open(stored.path) as f:
        assert f.mode == "RGB" and f.getpixel((5, 5)) == (255, 255, 255)
    gray = store.add(png_bytes(12, 12, seed=3, mode="L"), source="gray")
    with Image.open(gray.path) as f:
        assert f.mode == "RGB"
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (1, 2, 3)).save(buffer, format="GIF")
    assert store.add(buffer.getvalue(), source="gif").path.endswith(".png")


@pytest.mark.parametrize("data, match", [
    (b"", "empty"),
    (b"<html><body>not an image</body></html>", "not a readable image"),
    (png_bytes(20, 20)[:60], "not a readable image"),
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * 100, "not a readable image"),
    (png_bytes(2, 40), "minimum side"),
    (_png_header_only(50_000, 50_000), "decompression-bomb guard"),
    (_png_header_only(2_000, 2_000), "4000000 pixels.*decompression-bomb guard"),
    (b"\xff" * 300_000, "too large"),
])
def test_rejections_name_the_source_and_reason(store, data, match):
    with pytest.raises(images.ImageRejected, match=match) as info:
        store.add(data, source="https://x.org/pic")
    assert "https://x.org/pic" in str(info.value)


def test_check_bbox_accepts_and_returns_pixels():
    values, box = images.check_bbox([0.25, 0.5, 0.75, 1], width=200, height=100)
    assert values == (0.25, 0.5, 0.75, 1.0) and box == (50, 50, 150, 100)


@pytest.mark.parametrize("bbox, match", [
    ([0.1, 0.1, 0.5], "4 numbers"),
    ("0,0,1,1", "4 numbers"),
    ([0.1, "a", 0.5, 0.5], "must be numbers"),
    ([0.1, True, 0.5, 0.5], "must be numbers"),
    ([0.1, float("nan"), 0.5, 0.5], "finite"),
    ([-0.1, 0, 0.5, 0.5], r"outside \[0, 1\]"),
    ([100, 200, 500, 600], "0-1000 grid"),
    ([0.5, 0.1, 0.2, 0.6], "inverted"),
    ([0.3, 0.3, 0.3, 0.6], "inverted"),
    ([0.1, 0.1, 0.12, 0.9], "at least 8x8"),
    ([0, 0, 10 ** 400, 1], "finite"),
    ([0, 0, float("inf"), 1], "finite"),
])
def test_check_bbox_errors(bbox, match):
    with pytest.raises(ValueError, match=match):
        images.check_bbox(bbox, width=200, height=100)


def test_crop_of_crop_equals_direct_crop_and_composes_root_box(store):
    root = store.add(png_bytes(120, 90, seed=7), source="root")
    _, box1 = images.check_bbox([0.25, 0.2, 0.75, 0.9], width=root.width, height=root.height)
    first = store.crop(root.path, root.sha256, box1)
    root_box1 = images.compose_root_box(None, box1)
    assert root_box1 == (30.0, 18.0, 90.0, 81.0) and (first.width, first.height) == (60, 63)
    _, box2 = images.check_bbox([0.5, 0.5, 1.0, 1.0], width=first.width, height=first.height)
    second = store.crop(first.path, first.sha256, box2)
    root_box2 = images.compose_root_box(root_box1, box2)
    assert root_box2 == (60.0, 50.0, 90.0, 81.0)
    direct = np.asarray(store.open(root).crop(tuple(int(v) for v in root_box2)))
    with Image.open(second.path) as f:
        assert np.array_equal(np.asarray(f.convert("RGB")), direct)


def test_trusted_files_are_header_checked_and_used_in_place(store, tmp_path):
    data = png_bytes(40, 30, seed=5)
    source = tmp_path / "world.png"
    source.write_bytes(data)
    stored = store.add(data, source="world", trusted_file=str(source))
    assert stored.path == str(source) and stored.sha256 == hashlib.sha256(data).hexdigest()
    assert (stored.width, stored.height) == (40, 30)
    assert not list((tmp_path / "store").rglob("*.png"))  # nothing copied, nothing decoded
    loader = store.pixels(stored)
    assert callable(loader)
    assert np.array_equal(np.asarray(loader()), np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    assert isinstance(store.pixels(stored), Image.Image)  # decoded once, then cached
    assert store.add(data, source="again", trusted_file=str(source)) == stored


@pytest.mark.parametrize("data, kept", [
    (png_bytes(12, 12, seed=3, mode="L"), False),  # not RGB: converted and stored as usual
    (png_bytes(2, 40), None),  # too small: rejected as usual
    (_png_header_only(2_000, 2_000), None),  # over the pixel limit: rejected as usual
    (b"<html>not an image</html>", None),
])
def test_trusted_files_that_fail_the_header_check_take_the_full_path(store, tmp_path, data, kept):
    source = tmp_path / "claimed.png"
    source.write_bytes(data)
    if kept is None:
        with pytest.raises(images.ImageRejected):
            store.add(data, source="claimed", trusted_file=str(source))
        return
    stored = store.add(data, source="claimed", trusted_file=str(source))
    assert stored.path != str(source) and stored.path.startswith(str(tmp_path / "store"))


def test_open_returns_rgb_without_holding_the_file(store, tmp_path):
    path = tmp_path / "gray.png"
    Image.new("L", (9, 7), 100).save(path)
    image = store.open(str(path))
    assert image.mode == "RGB" and image.size == (9, 7) and image.getpixel((0, 0)) == (100, 100, 100)
    assert getattr(image, "fp", None) is None
