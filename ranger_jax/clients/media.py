"""Image encoding for the wire: PIL/bytes/paths in, RGB pixels, PNG/JPEG bytes and `data:` URLs out.

Every client that sends images (chat judges, the SGLang policy server, image generators) goes through these
functions, so "what the server saw" is one rule: alpha flattened on white, RGB, optional longest-side cap.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
from pathlib import Path
from typing import Union

from PIL import Image

ImageLike = Union[Image.Image, bytes, bytearray, str, os.PathLike]

FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
DEFAULT_JPEG_QUALITY = 95
_DATA_URL = re.compile(r"^data:(image/[a-zA-Z0-9.+-]+);base64,(.*)$", re.DOTALL)


def load_image(image: ImageLike) -> Image.Image:
    """Opens `image` (PIL image, encoded bytes, or a file path) without converting it.

    Raises:
        ValueError: the bytes or file are not a decodable image (the message names the path or size).
    """
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, (bytes, bytearray)):
        try:
            opened = Image.open(io.BytesIO(bytes(image)))
            opened.load()
        except (OSError, Image.DecompressionBombError) as err:
            raise ValueError(f"{len(image)} bytes are not a decodable image: {err}") from err
        return opened
    path = Path(image)
    if not path.is_file():
        raise FileNotFoundError(f"image file {path} does not exist")
    try:
        with Image.open(path) as opened:
            opened.load()
            return opened.copy()
    except (OSError, Image.DecompressionBombError) as err:
        raise ValueError(f"{path} is not a decodable image: {err}") from err


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` as RGB, transparent pixels composited on white (palette transparency included)."""
    if image.mode == "RGB":
        return image
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        canvas = Image.new("RGB", rgba.size, (255, 255, 255))
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        return canvas
    return image.convert("RGB")


def fit_longest_side(image: Image.Image, max_side: int | None) -> Image.Image:
    """Downscales `image` (aspect kept, Lanczos) so that its longest side is at most `max_side`."""
    if max_side is None or max(image.size) <= max_side:
        return image
    if max_side < 1:
        raise ValueError(f"max_side must be >= 1, got {max_side}")
    scale = max_side / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, Image.Resampling.LANCZOS)


def encode_image(image: ImageLike, *, fmt: str = "PNG", max_side: int | None = None,
                 quality: int = DEFAULT_JPEG_QUALITY) -> bytes:
    """Encodes `image` as RGB `fmt` bytes (PNG lossless; JPEG/WEBP at `quality`), longest side ≤ `max_side`.

    Raises:
        ValueError: unknown `fmt` (the message lists the known ones) or undecodable input.
    """
    fmt = fmt.upper()
    if fmt == "JPG":
        fmt = "JPEG"
    if fmt not in FORMATS:
        raise ValueError(f"unknown image format {fmt!r}; known: {sorted(FORMATS)}")
    rgb = fit_longest_side(to_rgb(load_image(image)), max_side)
    out = io.BytesIO()
    if fmt == "PNG":
        rgb.save(out, format="PNG")
    else:
        rgb.save(out, format=fmt, quality=quality)
    return out.getvalue()


def png_bytes(image: ImageLike) -> bytes:
    """Lossless RGB PNG of `image`; PNG input that is already RGB is returned unchanged (byte-exact)."""
    if isinstance(image, (bytes, bytearray)) and bytes(image[:8]) == b"\x89PNG\r\n\x1a\n":
        if load_image(image).mode == "RGB":
            return bytes(image)
    return encode_image(image, fmt="PNG")


def data_url(image: ImageLike, *, fmt: str = "PNG", max_side: int | None = None,
             quality: int = DEFAULT_JPEG_QUALITY) -> str:
    """`data:image/<fmt>;base64,…` URL of `image` re-encoded by `encode_image`."""
    fmt = "JPEG" if fmt.upper() == "JPG" else fmt.upper()
    payload = encode_image(image, fmt=fmt, max_side=max_side, quality=quality)
    return f"data:{FORMATS.get(fmt, 'image/png')};base64,{base64.b64encode(payload).decode('ascii')}"


def decode_data_url(url: str) -> tuple[str, bytes]:
    """(mime type, bytes) of a base64 `data:image/…` URL.

    Raises:
        ValueError: not a base64 image data URL, or the payload is not valid base64.
    """
    match = _DATA_URL.match(url)
    if match is None:
        raise ValueError(f"not a base64 image data URL: {url[:60]!r}")
    try:
        return match.group(1), base64.b64decode(match.group(2), validate=True)
    except binascii.Error as err:
        raise ValueError(f"data URL payload is not valid base64: {err}") from err


def decode_base64_image(payload: str) -> bytes:
    """Bytes of a base64 image payload (a bare string or a data URL), checked to decode as an image.

    Raises:
        ValueError: invalid base64, or bytes that are not a decodable image.
    """
    if payload.startswith("data:"):
        data = decode_data_url(payload)[1]
    else:
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error as err:
            raise ValueError(f"image payload is not valid base64: {err}") from err
    load_image(data)
    return data
