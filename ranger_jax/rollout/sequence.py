"""The token-exact record of one episode: ids, loss mask, sampler log-probs, and the images at their positions.

The training sequence is the concatenation of what the policy was given and what it produced, turn by turn:
rendered prompt segments (mask 0, log-prob 0) and the sampled ids (mask 1, their log-probs). Images are
prepared once (`prepare_image`): resized to the processor's grid, so the PNG recorded on the trajectory, the
pixels an SGLang server receives and the pixels the in-process sampler encodes are the same, and re-running
`preprocess_image` on the recorded PNG gives the policy's `pixel_values` bit for bit. A `PreparedImageCache`
shares that work between the episodes of a run: the same stored image (by content digest) under the same
settings is prepared once — the G samples of a GRPO group mostly see the same search results.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import threading
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image

from ranger_jax.clients import media
from ranger_jax.data import trajectory
from ranger_jax.processing import chat, image as image_lib

QWEN3_VL_MIN_PIXELS = 4 * 32 * 32  # qwen_vl_utils: at least 4 tokens per image
GEN_SEARCHER_MAX_PIXELS = 160_000  # Gen-Searcher training rollouts (fetch_image max_pixels)
DEFAULT_IMAGE_CACHE_BYTES = 512 * 2**20  # ~140 prepared 160k-pixel images (pixel_values dominate)


@dataclasses.dataclass(frozen=True, kw_only=True)
class VisionSettings:
    """How observation images are sized and patched (Qwen3-VL processor settings)."""

    min_pixels: int = QWEN3_VL_MIN_PIXELS  # smallest resized area
    max_pixels: int = GEN_SEARCHER_MAX_PIXELS  # largest resized area (the image token cost grows with it)
    patch_size: int = 16
    merge_size: int = 2  # spatial_merge_size: one placeholder per merge² patches
    temporal_patch_size: int = 2

    def __post_init__(self):
        for name in ("min_pixels", "max_pixels", "patch_size", "merge_size", "temporal_patch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"VisionSettings.{name} must be a positive int; got {value!r}")
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"VisionSettings: min_pixels ({self.min_pixels}) > max_pixels ({self.max_pixels})")

    @property
    def factor(self) -> int:
        """Pixels per merged image token along each side (patch_size * merge_size)."""
        return self.patch_size * self.merge_size


@dataclasses.dataclass(frozen=True, eq=False)
class PreparedImage:
    """One observation image as the policy's processor sees it.

    Attributes:
        img_id: the environment's id for it (`IMG_###`).
        parent_id: for a crop, the id it was cut from.
        image: RGB pixels at the processor's size (a multiple of patch_size · merge_size on each side).
        png: `image` PNG-encoded (lossless), recorded on the trajectory and sent to SGLang.
        pixel_values: [P, I] float32 patch rows (read-only: a cache may share them between episodes).
        grid_thw: [3] int64 (t, h, w) in patches.
        num_tokens: its `<|image_pad|>` placeholders, t·h·w / merge².
    """

    img_id: str | None
    parent_id: str | None
    image: Image.Image
    png: bytes
    pixel_values: np.ndarray
    grid_thw: np.ndarray
    num_tokens: int


def processor_size(height: int, width: int, settings: VisionSettings) -> tuple[int, int]:
    """The (height, width) an image is resized to: the processor's size of it, and of that size again.

    `smart_resize` is not idempotent for thin images: the short side is clamped at one factor, so with factor 32
    and a 4096-pixel budget a 500x33 crop becomes 224x32 (7168 pixels), which the processor would shrink to 160x32
    when it receives the recorded PNG, and that to 128x32. Following it to its fixed point makes the recorded image
    one the processor keeps.
    """
    size = (height, width)
    for _ in range(8):
        target = image_lib.smart_resize(*size, factor=settings.factor, min_pixels=settings.min_pixels,
                                        max_pixels=settings.max_pixels)
        if target == size:
            return size
        size = target
    raise ValueError(f"the processor's resize of {width}x{height} does not settle (min_pixels={settings.min_pixels}, "
                     f"max_pixels={settings.max_pixels})")


def prepare_image(image: Image.Image, settings: VisionSettings, *, img_id: str | None = None,
                  parent_id: str | None = None) -> PreparedImage:
    """Resizes an observation image to the processor's grid once and patches it (see the module docstring).

    Raises:
        ValueError: an image the processor refuses (aspect ratio > 200) or whose resize does not settle
            (`processor_size`), naming the img_id and size.
    """
    rgb = media.to_rgb(image)
    try:
        height, width = processor_size(rgb.height, rgb.width, settings)
    except ValueError as err:
        raise ValueError(f"image {img_id or '(no id)'} of size {rgb.width}x{rgb.height}: {err}") from err
    resized = rgb if rgb.size == (width, height) else rgb.resize((width, height), Image.Resampling.BICUBIC)
    pixel_values, grid = image_lib.preprocess_image(
        resized, min_pixels=settings.min_pixels, max_pixels=settings.max_pixels, patch_size=settings.patch_size,
        merge_size=settings.merge_size, temporal_patch_size=settings.temporal_patch_size)
    if (int(grid[1]) * settings.patch_size, int(grid[2]) * settings.patch_size) != (height, width):
        raise ValueError(f"image {img_id or '(no id)'}: the resized {width}x{height} image is resized again by the "
                         f"processor (min_pixels={settings.min_pixels}, max_pixels={settings.max_pixels}); widen "
                         "the pixel bounds")
    buffer = io.BytesIO()
    resized.save(buffer, format="PNG")
    pixel_values.flags.writeable = False
    return PreparedImage(img_id=img_id, parent_id=parent_id, image=resized, png=buffer.getvalue(),
                         pixel_values=pixel_values, grid_thw=grid,
                         num_tokens=image_lib.image_token_count(grid, merge_size=settings.merge_size))


def _nbytes(prepared: PreparedImage) -> int:
    width, height = prepared.image.size
    return prepared.pixel_values.nbytes + len(prepared.png) + 3 * width * height


def _pixels(image: Image.Image | Callable[[], Image.Image]) -> Image.Image:
    return image if isinstance(image, Image.Image) else image()


class _InFlight:
    """An image one thread is preparing; others with the same key wait for it instead of repeating the work."""

    def __init__(self):
        self.done = threading.Event()
        self.result: PreparedImage | None = None


class PreparedImageCache:
    """Prepared images by content, least recently used dropped first beyond `max_bytes` (thread-safe; a key
    being prepared by one thread is waited for by the others — the G samples of a group ask at the same time).

    Args:
        max_bytes: memory budget (pixel values, PNG and pixels); 0 disables caching.
    """

    def __init__(self, max_bytes: int = DEFAULT_IMAGE_CACHE_BYTES):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"PreparedImageCache max_bytes must be an int >= 0; got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[tuple[str, VisionSettings], PreparedImage] = collections.OrderedDict()
        self._in_flight: dict[tuple[str, VisionSettings], _InFlight] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _lookup(self, entry_key: tuple[str, VisionSettings]) -> tuple[PreparedImage | None, _InFlight | None, bool]:
        """(cached entry, in-flight record, whether this caller prepares it) under the lock."""
        with self._lock:
            cached = self._entries.get(entry_key)
            if cached is not None:
                self._entries.move_to_end(entry_key)
                self.hits += 1
                return cached, None, False
            flight = self._in_flight.get(entry_key)
            if flight is not None:
                return None, flight, False
            flight = self._in_flight[entry_key] = _InFlight()
            return None, flight, True

    def _store(self, entry_key: tuple[str, VisionSettings], prepared: PreparedImage) -> None:
        size = _nbytes(prepared)
        with self._lock:
            if size <= self.max_bytes and entry_key not in self._entries:
                self._entries[entry_key] = prepared
                self._bytes += size
                while self._bytes > self.max_bytes:
                    _, dropped = self._entries.popitem(last=False)
                    self._bytes -= _nbytes(dropped)

    def prepare(self, image: Image.Image | Callable[[], Image.Image], settings: VisionSettings, *, key: str,
                img_id: str | None = None, parent_id: str | None = None) -> PreparedImage:
        """`prepare_image(image, settings, …)`, reusing the work of an earlier or concurrent call with the same key.

        Args:
            image: the pixels, or a loader called only when they must be prepared (a hit decodes nothing).
            key: a digest of `image`'s pixels (e.g. `ImageRecord.sha256`); equal keys must mean equal pixels.
        """
        if self.max_bytes == 0:
            self.misses += 1
            return prepare_image(_pixels(image), settings, img_id=img_id, parent_id=parent_id)
        entry_key = (key, settings)
        cached, flight, owner = self._lookup(entry_key)
        if cached is None and not owner:
            flight.done.wait()
            cached = flight.result
            if cached is not None:
                with self._lock:
                    self.hits += 1
        if cached is not None:
            return dataclasses.replace(cached, img_id=img_id, parent_id=parent_id)
        prepared = None
        try:
            prepared = prepare_image(_pixels(image), settings, img_id=img_id, parent_id=parent_id)
            self._store(entry_key, prepared)
            return prepared
        finally:
            with self._lock:
                self.misses += 1
                if owner:
                    del self._in_flight[entry_key]
            if owner:
                flight.result = prepared  # None when preparing failed: waiters then try themselves
                flight.done.set()


class TokenSequence:
    """The growing training sequence of one episode.

    Args:
        image_pad_id: the tokenizer's `<|image_pad|>` id.
        merge_size: vision `spatial_merge_size`.
    """

    def __init__(self, *, image_pad_id: int, merge_size: int):
        self.image_pad_id, self.merge_size = image_pad_id, merge_size
        self._ids: list[int] = []
        self._mask: list[int] = []
        self._logprobs: list[float] = []
        self.images: list[trajectory.TrajectoryImage] = []
        self.prepared: list[PreparedImage] = []

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def ids(self) -> np.ndarray:
        """[T] int32, the sequence so far."""
        return np.asarray(self._ids, np.int32)

    def append(self, segment: chat.Rendered, images: Sequence[PreparedImage] = ()) -> None:
        """Appends a rendered prompt segment (mask 0, log-prob 0) whose image slots `images` fill, in order.

        Raises:
            ValueError: the segment's image slots and `images` disagree in number, grid or placeholder count.
        """
        if segment.num_images != len(images):
            raise ValueError(f"segment has {segment.num_images} image slots but {len(images)} images were given")
        if np.any(segment.loss_mask):
            raise ValueError("a prompt segment must have loss mask 0 everywhere")
        offset = len(self._ids)
        for (start, count), grid, image in zip(segment.image_spans, segment.image_grid_thw, images):
            if tuple(int(g) for g in grid) != tuple(int(g) for g in image.grid_thw) or count != image.num_tokens:
                raise ValueError(f"image {image.img_id}: slot of {count} pads for grid {grid.tolist()} but the image "
                                 f"has grid {image.grid_thw.tolist()} ({image.num_tokens} pads)")
            self.images.append(trajectory.TrajectoryImage(png=image.png, grid_thw=tuple(image.grid_thw.tolist()),
                                                          token_index=offset + start, img_id=image.img_id,
                                                          parent_id=image.parent_id))
            self.prepared.append(image)
        self._ids.extend(segment.ids.tolist())
        self._mask.extend([0] * len(segment))
        self._logprobs.extend([0.0] * len(segment))

    def copy(self) -> TokenSequence:
        """An independent copy of the sequence so far (an episode forked from another goes on with it)."""
        twin = TokenSequence(image_pad_id=self.image_pad_id, merge_size=self.merge_size)
        twin._ids, twin._mask, twin._logprobs = list(self._ids), list(self._mask), list(self._logprobs)
        twin.images, twin.prepared = list(self.images), list(self.prepared)
        return twin

    def extend_from(self, other: TokenSequence) -> None:
        """Appends what `other` holds beyond this sequence's length (ids, masks, log-probs, images), `other`
        starting with this sequence's ids (an episode taking over another's continuation).

        Raises:
            ValueError: `other` does not start with this sequence's ids.
        """
        start = len(self._ids)
        if len(other._ids) < start or other._ids[:start] != self._ids:
            raise ValueError(f"the sequence to continue from ({len(other._ids)} ids) does not start with this "
                             f"sequence's {start} ids")
        self._ids.extend(other._ids[start:])
        self._mask.extend(other._mask[start:])
        self._logprobs.extend(other._logprobs[start:])
        later = [i for i, image in enumerate(other.images) if image.token_index >= start]
        self.images.extend(other.images[i] for i in later)
        self.prepared.extend(other.prepared[i] for i in later)

    def append_generated(self, token_ids: np.ndarray, logprobs: np.ndarray, *,
                         trained: bool | np.ndarray = True) -> None:
        """Appends sampled ids with loss mask 1 and their sampler log-probs (`trained=False`: the policy's ids as
        context only, mask 0 and log-prob 0, e.g. the greedy turns before a group's branching turn; a [N] bool
        array: per id, e.g. only the ids a decision-sampled turn drew).

        Raises:
            ValueError: a sampled id is `<|image_pad|>` (its run would have no pixels), or the lengths differ.
        """
        token_ids, logprobs = np.asarray(token_ids).reshape(-1), np.asarray(logprobs, np.float32).reshape(-1)
        if token_ids.shape != logprobs.shape:
            raise ValueError(f"{token_ids.size} generated ids but {logprobs.size} log-probs")
        mask = np.broadcast_to(np.asarray(trained, bool), token_ids.shape) if np.ndim(trained) == 0 else \
            np.asarray(trained, bool).reshape(-1)
        if mask.shape != token_ids.shape:
            raise ValueError(f"{token_ids.size} generated ids but {mask.size} trained flags")
        if np.any(token_ids == self.image_pad_id):
            raise ValueError(f"generated ids hold <|image_pad|> ({self.image_pad_id}) at position "
                             f"{int(np.flatnonzero(token_ids == self.image_pad_id)[0])}")
        self._ids.extend(token_ids.astype(np.int64).tolist())
        self._mask.extend(mask.astype(int).tolist())
        self._logprobs.extend(np.where(mask, logprobs, 0.0).tolist())

    def arrays(self) -> dict[str, np.ndarray]:
        """`token_ids` [T] int32, `loss_mask` [T] int8, `sampler_logprobs` [T] float32."""
        return {"token_ids": np.asarray(self._ids, np.int32), "loss_mask": np.asarray(self._mask, np.int8),
                "sampler_logprobs": np.asarray(self._logprobs, np.float32)}
