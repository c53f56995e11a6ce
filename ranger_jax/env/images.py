"""The content-addressed image store: verified RGB images on disk, crops with exact root boxes.

Downloads are checked before decoding (byte size, header pixel count against a decompression-bomb limit), verified
with PIL, converted to RGB and stored under their SHA-256. A crop is cut from the stored pixels of its parent and
stored losslessly (PNG), so a crop of a crop is the same pixels as one crop of the root; its `root_box` is the
pixel box in the root download, composed through every level.

Trusted files (`add(..., trusted_file=…)`, only from a backend that generated the image and matched its SHA-256,
i.e. the offline world) skip the full decode: the header is still checked (format, RGB, size limits), the store
refers to that file instead of copying it, and `pixels` hands out a loader that decodes on first use.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import io
import math
import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

from PIL import Image

DEFAULT_MAX_IMAGE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_IMAGE_PIXELS = 40_000_000  # ~ 6300 x 6300; more is a decompression bomb for our purposes
DEFAULT_MIN_IMAGE_SIDE = 4
DEFAULT_MIN_CROP_SIDE = 8
_KEEP_FORMATS = {"JPEG": "jpg", "PNG": "png"}  # stored as served when already RGB
_DECODED_CACHE_SIZE = 256


class ImageRejected(ValueError):
    """Bytes that are not an acceptable image; the message says why."""


@dataclasses.dataclass(frozen=True)
class StoredImage:
    """A verified RGB image file in the store."""

    path: str
    sha256: str
    width: int
    height: int


def _flatten_to_rgb(image: Image.Image) -> Image.Image:
    """RGB pixels, with any transparency composited on white."""
    if image.mode == "RGB":
        return image
    if image.mode == "P" and "transparency" in image.info or image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def crop_pixels(width: int, height: int, bbox: tuple[float, float, float, float]) -> tuple[int, int, int, int]:
    """The integer pixel box `[x0, y0, x1, y1)` a normalised bbox selects in a `width`×`height` image."""
    x0, y0, x1, y1 = bbox
    return (
        min(max(round(x0 * width), 0), width),
        min(max(round(y0 * height), 0), height),
        min(max(round(x1 * width), 0), width),
        min(max(round(y1 * height), 0), height),
    )


def compose_root_box(parent_root_box: tuple[float, float, float, float] | None,
                     box: tuple[int, int, int, int]) -> tuple[float, float, float, float]:
    """The root-image pixel box of `box` (pixels of the parent), given the parent's own root box (None = root)."""
    ox, oy = (parent_root_box[0], parent_root_box[1]) if parent_root_box is not None else (0.0, 0.0)
    return (ox + box[0], oy + box[1], ox + box[2], oy + box[3])


class ImageStore:
    """Verified RGB images on disk, named by the SHA-256 of their bytes.

    Thread-safe; one store may serve many episodes and event loops at once.

    Args:
        directory: where files go (`<sha[:2]>/<sha>.<ext>`).
        max_bytes: encoded size limit of an incoming image.
        max_pixels: width × height limit, checked from the header before decoding.
        min_side: smaller images (tracking pixels) are refused.
    """

    def __init__(self, directory: str | Path, *, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
                 max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS, min_side: int = DEFAULT_MIN_IMAGE_SIDE):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.max_pixels = max_pixels
        self.min_side = min_side
        self._lock = threading.Lock()
        self._by_input: dict[str, StoredImage] = {}  # sha256 of the bytes as received -> stored file
        self._decoded: collections.OrderedDict[str, Image.Image] = collections.OrderedDict()
        self._folders: set[Path] = set()

    def _write(self, data: bytes, ext: str, width: int, height: int) -> StoredImage:
        sha = hashlib.sha256(data).hexdigest()
        path = self.directory / sha[:2] / f"{sha}.{ext}"
        if not path.exists():
            if path.parent not in self._folders:
                path.parent.mkdir(exist_ok=True)
                self._folders.add(path.parent)
            # temporary name + os.replace: never a half-written file under the final name; no fsync, since a
            # content-addressed file lost in a crash is simply written again
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return StoredImage(path=str(path), sha256=sha, width=width, height=height)

    def _remember(self, sha: str, image: Image.Image) -> None:
        with self._lock:
            self._decoded[sha] = image
            self._decoded.move_to_end(sha)
            while len(self._decoded) > _DECODED_CACHE_SIZE:
                self._decoded.popitem(last=False)

    def _decode(self, data: bytes, source: str) -> tuple[Image.Image, str]:
        """Checked, verified, fully decoded RGB pixels of `data` and its format name."""
        if len(data) > self.max_bytes:
            raise ImageRejected(f"image from {source} is too large: {len(data)} bytes (limit {self.max_bytes})")
        if not data:
            raise ImageRejected(f"image from {source} is empty")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                probe = Image.open(io.BytesIO(data))
                width, height = probe.size
                fmt = probe.format or ""
                if width * height > self.max_pixels:
                    raise ImageRejected(
                        f"image from {source} is {width}x{height} = {width * height} pixels, over the limit of "
                        f"{self.max_pixels} (decompression-bomb guard)"
                    )
                probe.verify()
                image = Image.open(io.BytesIO(data))
                image.load()
        except ImageRejected:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
            raise ImageRejected(f"image from {source} trips the decompression-bomb guard: {err}") from err
        except Exception as err:  # PIL raises many types for corrupt data (OSError, SyntaxError, ValueError, ...)
            raise ImageRejected(f"bytes from {source} are not a readable image ({type(err).__name__}: {err})") from err
        if min(width, height) < self.min_side:
            raise ImageRejected(f"image from {source} is only {width}x{height} pixels (minimum side {self.min_side})")
        return image, fmt

    def _trusted(self, data: bytes, sha: str, path: str) -> StoredImage | None:
        """`path` as a stored image when its header is a single-frame RGB PNG or JPEG within the limits, else None."""
        if len(data) > self.max_bytes:
            return None
        try:
            with Image.open(io.BytesIO(data)) as probe:
                ok = probe.format in _KEEP_FORMATS and probe.mode == "RGB" and getattr(probe, "n_frames", 1) == 1
                width, height = probe.size
        except Exception:  # noqa: BLE001 — anything odd goes through the full check instead
            return None
        if not ok or width * height > self.max_pixels or min(width, height) < self.min_side:
            return None
        return StoredImage(path=path, sha256=sha, width=width, height=height)

    def add(self, data: bytes, *, source: str, trusted_file: str | None = None) -> StoredImage:
        """Stores downloaded bytes as a verified RGB image.

        Args:
            data: the encoded image as served.
            source: URL or name used in error messages.
            trusted_file: a file holding exactly `data` that its backend generated and vouches for
                (`base.FetchedImage.trusted_file`); if its header passes, it is used in place without decoding.

        Raises:
            ImageRejected: too many bytes or pixels, corrupt, not an image, or too small.
        """
        input_sha = hashlib.sha256(data).hexdigest()
        with self._lock:
            if (known := self._by_input.get(input_sha)) is not None:
                return known
        if trusted_file is not None and (stored := self._trusted(data, input_sha, trusted_file)) is not None:
            with self._lock:
                self._by_input[input_sha] = stored
            return stored
        image, fmt = self._decode(data, source)
        rgb = _flatten_to_rgb(image)
        if rgb is image and fmt in _KEEP_FORMATS and getattr(image, "n_frames", 1) == 1:
            stored = self._write(data, _KEEP_FORMATS[fmt], rgb.width, rgb.height)
        else:
            buffer = io.BytesIO()
            rgb.save(buffer, format="PNG")
            stored = self._write(buffer.getvalue(), "png", rgb.width, rgb.height)
        self._remember(stored.sha256, rgb)
        with self._lock:
            self._by_input[input_sha] = stored
        return stored

    def open(self, stored: StoredImage | str, sha256: str | None = None) -> Image.Image:
        """The decoded RGB pixels of a stored image (shared; treat as read-only)."""
        path, sha = (stored.path, stored.sha256) if isinstance(stored, StoredImage) else (stored, sha256)
        if sha is not None:
            with self._lock:
                if (image := self._decoded.get(sha)) is not None:
                    self._decoded.move_to_end(sha)
                    return image
        image = Image.open(path)
        image.load()  # a single-frame file is closed once loaded
        if image.mode != "RGB":  # stored files are RGB already; convert also detaches from the file
            with image:
                image = image.convert("RGB")
        if sha is not None:
            self._remember(sha, image)
        return image

    def pixels(self, stored: StoredImage | str, sha256: str | None = None) -> Image.Image | Callable[[], Image.Image]:
        """The decoded pixels when the store holds them, else a loader that decodes them (`open`) when called."""
        path, sha = (stored.path, stored.sha256) if isinstance(stored, StoredImage) else (stored, sha256)
        if sha is not None:
            with self._lock:
                if (image := self._decoded.get(sha)) is not None:
                    return image
        return functools.partial(self.open, path, sha)

    def crop(self, path: str, sha256: str, box: tuple[int, int, int, int]) -> StoredImage:
        """Cuts pixel box `box` out of a stored image and stores it losslessly."""
        parent = self.open(path, sha256)
        piece = parent.crop(box)
        buffer = io.BytesIO()
        piece.save(buffer, format="PNG", compress_level=1)
        stored = self._write(buffer.getvalue(), "png", piece.width, piece.height)
        self._remember(stored.sha256, piece)
        return stored


def check_bbox(bbox: object, *, width: int, height: int, min_side: int = DEFAULT_MIN_CROP_SIDE
               ) -> tuple[tuple[float, float, float, float], tuple[int, int, int, int]]:
    """Validates a policy-supplied normalised bbox and returns it with its pixel box.

    Raises:
        ValueError: with a message for the policy (wrong shape or type, out of [0, 1], inverted, too small).
    """
    if not isinstance(bbox, (list, tuple)) or len(bbox) != 4:
        raise ValueError(f"bbox must be a list of 4 numbers [x0, y0, x1, y1] in 0-1; got {bbox!r}")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox):
        raise ValueError(f"bbox values must be numbers; got {bbox!r}")
    try:
        values = tuple(float(v) for v in bbox)
    except OverflowError:  # an int beyond float range
        values = (math.inf,)
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"bbox values must be finite; got {bbox!r}")
    x0, y0, x1, y1 = values
    if min(values) < 0.0 or max(values) > 1.0:
        hint = (" (it looks like pixels or a 0-1000 grid; divide by the image size or by 1000)"
                if max(values) > 1.0 else "")
        raise ValueError(f"bbox {list(bbox)} is outside [0, 1]; coordinates are fractions of width and height{hint}")
    if x1 <= x0 or y1 <= y0:
        raise ValueError(f"bbox {list(bbox)} is empty or inverted; need x0 < x1 and y0 < y1")
    box = crop_pixels(width, height, values)
    if box[2] - box[0] < min_side or box[3] - box[1] < min_side:
        raise ValueError(
            f"bbox {list(bbox)} selects only {box[2] - box[0]}x{box[3] - box[1]} pixels of a {width}x{height} image; "
            f"a crop needs at least {min_side}x{min_side}"
        )
    return values, box
