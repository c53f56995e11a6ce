"""Qwen3-VL image preprocessing: smart resize, normalisation and merge-block patch order.

Bit-for-bit the pipeline of transformers' `Qwen2VLImageProcessorPil` run with the Qwen3-VL settings
(patch 16, temporal patch 2, merge 2, mean = std = 0.5, bicubic):

1. convert to RGB; any transparency is composited onto white (`transformers.image_transforms.convert_to_rgb`);
2. `smart_resize` to multiples of `patch_size * merge_size`, then a PIL bicubic resize;
3. rescale by 1/255 (in float64, stored as float32), then `(x - 0.5) / 0.5` in float32;
4. a still image is one temporal patch (repeated `temporal_patch_size` times), rows are patches in
   `merge_size x merge_size` block order, each row flattened as (C, T, patch, patch).

Shapes: `P` patches, `I = 3 * temporal_patch_size * patch_size**2` features per patch (1536 for Qwen3-VL).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from PIL import Image

MAX_ASPECT_RATIO = 200  # Qwen2/3-VL reject longer strips
RESCALE_FACTOR = 1 / 255
IMAGE_MEAN = 0.5  # Qwen3-VL: mean = std = 0.5 per channel (not the CLIP values of the Qwen2-VL class)
IMAGE_STD = 0.5


def smart_resize(height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Target (height, width): multiples of `factor`, area within [min_pixels, max_pixels], aspect kept.

    Args:
        height: source height in pixels (>= 1).
        width: source width in pixels (>= 1).
        factor: `patch_size * merge_size` (32 for Qwen3-VL): one LLM token covers factor x factor pixels.
        min_pixels: smallest allowed area of the result.
        max_pixels: largest allowed area of the result.

    Returns:
        (resized_height, resized_width), each a positive multiple of `factor`.

    Raises:
        ValueError: on a non-positive size or factor, `min_pixels > max_pixels`, or an aspect ratio above 200.
    """
    if height < 1 or width < 1:
        raise ValueError(f"image size must be positive, got height={height}, width={width}")
    if factor < 1:
        raise ValueError(f"factor must be positive, got {factor}")
    if not 1 <= min_pixels <= max_pixels:
        raise ValueError(f"need 1 <= min_pixels <= max_pixels, got min_pixels={min_pixels}, max_pixels={max_pixels}")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise ValueError(
            f"image {height}x{width} (HxW) has aspect ratio {ratio:.1f} > {MAX_ASPECT_RATIO}, which Qwen3-VL "
            "rejects; crop or pad it first"
        )
    # Python's round (half to even) on purpose: it is what the reference uses.
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _to_rgb_pil(image: Image.Image | np.ndarray) -> Image.Image:
    """An RGB PIL image; alpha (an A band or palette/colour-key transparency) is composited onto white."""
    if isinstance(image, Image.Image):
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            rgba = image.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, rgba).convert("RGB")
        return image.convert("RGB")
    if not isinstance(image, np.ndarray):
        raise TypeError(f"image must be a PIL.Image.Image or a numpy array, got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise TypeError(f"image arrays must be uint8 HxWxC (C in 1, 3, 4) or HxW, got dtype {image.dtype}")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise ValueError(f"image arrays must be HxW or HxWxC with C in (1, 3, 4), got shape {image.shape}")
    if image.shape[2] == 1:
        image = np.repeat(image, 3, axis=2)
    elif image.shape[2] == 4:
        alpha = image[..., 3:4] / 255
        image = np.round(alpha * image[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    return Image.fromarray(np.ascontiguousarray(image))


def preprocess_image(
    image: Image.Image | np.ndarray,
    *,
    min_pixels: int,
    max_pixels: int,
    patch_size: int = 16,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
) -> tuple[np.ndarray, np.ndarray]:
    """Pixel patches and patch grid of one still image, as Qwen3-VL's vision tower takes them.

    Args:
        image: a PIL image of any mode, or a uint8 array `[H, W]`, `[H, W, 1]`, `[H, W, 3]` (RGB) or
            `[H, W, 4]` (RGBA).
        min_pixels: smallest resized area (Qwen3-VL default 65536; HF `size["shortest_edge"]`).
        max_pixels: largest resized area (Gen-Searcher uses 160000; HF `size["longest_edge"]`).
        patch_size: vision patch side in pixels.
        merge_size: patches merged per side into one LLM token.
        temporal_patch_size: frames per temporal patch; a still image fills all of them.

    Returns:
        pixel_values: `[P, 3 * temporal_patch_size * patch_size**2] float32`, rows in merge-block order.
        grid_thw: `[3] int64`, (1, resized_height / patch_size, resized_width / patch_size); P = prod(grid_thw).

    Raises:
        TypeError: for an unsupported image type or array dtype.
        ValueError: for a bad array shape, an empty image, or an aspect ratio above 200.
    """
    rgb = _to_rgb_pil(image)
    width, height = rgb.size
    factor = patch_size * merge_size
    resized_height, resized_width = smart_resize(
        height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels
    )
    resized = rgb.resize((resized_width, resized_height), resample=Image.Resampling.BICUBIC)
    pixels = np.asarray(resized)  # [H, W, 3] uint8
    pixels = (pixels.astype(np.float64) * RESCALE_FACTOR).astype(np.float32)
    pixels = (pixels - np.float32(IMAGE_MEAN)) / np.float32(IMAGE_STD)
    pixels = pixels.transpose(2, 0, 1)  # [3, H, W]

    grid_h, grid_w = resized_height // patch_size, resized_width // patch_size
    channels = pixels.shape[0]
    patches = pixels.reshape(
        channels, grid_h // merge_size, merge_size, patch_size, grid_w // merge_size, merge_size, patch_size
    )
    patches = patches.transpose(1, 4, 2, 5, 0, 3, 6)  # [gh/m, gw/m, m, m, C, p, p]
    patches = np.broadcast_to(
        patches[:, :, :, :, :, None], (*patches.shape[:5], temporal_patch_size, *patches.shape[5:])
    )  # [gh/m, gw/m, m, m, C, T, p, p]
    pixel_values = np.ascontiguousarray(
        patches.reshape(grid_h * grid_w, channels * temporal_patch_size * patch_size * patch_size)
    )
    return pixel_values, np.array([1, grid_h, grid_w], dtype=np.int64)


def preprocess_images(
    images: Sequence[Image.Image | np.ndarray],
    *,
    min_pixels: int,
    max_pixels: int,
    patch_size: int = 16,
    merge_size: int = 2,
    temporal_patch_size: int = 2,
) -> tuple[np.ndarray, np.ndarray]:
    """`preprocess_image` over several images, concatenated in order (the model's batch layout).

    Args:
        images: images in order of appearance in the token sequence(s).
        min_pixels, max_pixels, patch_size, merge_size, temporal_patch_size: as for `preprocess_image`.

    Returns:
        pixel_values: `[P, I] float32`, every image's patches in order (P = 0 for no images).
        image_grid_thw: `[num_images, 3] int64`.
    """
    features = 3 * temporal_patch_size * patch_size * patch_size
    if not images:
        return np.zeros((0, features), np.float32), np.zeros((0, 3), np.int64)
    outs = [
        preprocess_image(
            image,
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            patch_size=patch_size,
            merge_size=merge_size,
            temporal_patch_size=temporal_patch_size,
        )
        for image in images
    ]
    return np.concatenate([o[0] for o in outs], axis=0), np.stack([o[1] for o in outs])


def image_token_count(grid_thw: Sequence[int] | np.ndarray, *, merge_size: int = 2) -> int:
    """Number of `<|image_pad|>` placeholders for one image: t * h * w / merge_size**2.

    Raises:
        ValueError: if grid_thw is not 3 positive ints with h and w divisible by merge_size.
    """
    grid = [int(x) for x in np.asarray(grid_thw).reshape(-1)]
    if len(grid) != 3 or min(grid) < 1 or grid[1] % merge_size or grid[2] % merge_size:
        raise ValueError(
            f"grid_thw must be 3 positive ints (t, h, w) with h and w divisible by merge_size={merge_size}, "
            f"got {grid}"
        )
    return grid[0] * grid[1] * grid[2] // (merge_size * merge_size)
