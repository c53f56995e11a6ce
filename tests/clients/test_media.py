"""Image encoding helpers shared by the clients."""
import base64
import io

import pytest
from PIL import Image

from ranger_jax.clients import media


def test_to_rgb_flattens_alpha_and_palette_transparency_on_white():
    rgba = Image.new("RGBA", (2, 1), (255, 0, 0, 0))
    rgba.putpixel((1, 0), (0, 0, 255, 255))
    rgb = media.to_rgb(rgba)
    assert rgb.mode == "RGB" and rgb.getpixel((0, 0)) == (255, 255, 255) and rgb.getpixel((1, 0)) == (0, 0, 255)
    palette = Image.new("P", (1, 1), 0)
    palette.info["transparency"] = 0
    assert media.to_rgb(palette).getpixel((0, 0)) == (255, 255, 255)


def test_encode_caps_longest_side_and_keeps_aspect():
    data = media.encode_image(Image.new("RGB", (400, 100), "red"), fmt="jpg", max_side=100)
    out = Image.open(io.BytesIO(data))
    assert out.format == "JPEG" and out.size == (100, 25)
    with pytest.raises(ValueError, match=r"unknown image format 'GIF'; known"):
        media.encode_image(Image.new("RGB", (1, 1)), fmt="gif")


def test_png_bytes_passes_rgb_png_through_byte_exact(tmp_path):
    buf = io.BytesIO()
    Image.new("RGB", (3, 3), "green").save(buf, "PNG", compress_level=0)
    raw = buf.getvalue()
    assert media.png_bytes(raw) == raw
    path = tmp_path / "a.png"
    path.write_bytes(raw)
    assert Image.open(io.BytesIO(media.png_bytes(path))).getpixel((1, 1)) == (0, 128, 0)


def test_data_url_roundtrip_and_errors(tmp_path):
    url = media.data_url(Image.new("RGB", (2, 2), "blue"))
    mime, data = media.decode_data_url(url)
    assert mime == "image/png" and Image.open(io.BytesIO(data)).getpixel((0, 0)) == (0, 0, 255)
    assert media.decode_base64_image(url.split(",", 1)[1]) == data
    with pytest.raises(ValueError, match="not a base64 image data URL"):
        media.decode_data_url("http://example.com/a.png")
    with pytest.raises(ValueError, match="not valid base64"):
        media.decode_base64_image("@@@")
    with pytest.raises(ValueError, match=r"4 bytes are not a decodable image"):
        media.decode_base64_image(base64.b64encode(b"abcd").decode())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        media.load_image(tmp_path / "missing.png")
    (tmp_path / "bad.png").write_bytes(b"nope")
    with pytest.raises(ValueError, match="bad.png is not a decodable image"):
        media.load_image(tmp_path / "bad.png")


def test_fit_longest_side_rejects_a_zero_cap():
    with pytest.raises(ValueError, match="max_side must be >= 1, got 0"):
        media.fit_longest_side(Image.new("RGB", (2, 2)), 0)
    assert media.fit_longest_side(Image.new("RGB", (2, 2)), None).size == (2, 2)
