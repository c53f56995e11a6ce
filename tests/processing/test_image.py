"""preprocess_image against transformers' Qwen2VLImageProcessorPil with the Qwen3-VL settings."""

import numpy as np
import pytest
from PIL import Image
from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf_image

from ranger_jax.processing import image as image_lib

MIN_PIXELS, MAX_PIXELS = 65536, 160000


def hf_processor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=16, merge_size=2, temporal_patch_size=2):
    return hf_image.Qwen2VLImageProcessorPil(
        patch_size=patch_size,
        merge_size=merge_size,
        temporal_patch_size=temporal_patch_size,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
    )


def random_image(rng, height, width, mode="RGB"):
    channels = {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2}[mode]
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode)


def assert_same_as_hf(image, **settings):
    reference = hf_processor(**settings)(images=[image], return_tensors="np")
    pixel_values, grid_thw = image_lib.preprocess_image(
        image,
        min_pixels=settings.get("min_pixels", MIN_PIXELS),
        max_pixels=settings.get("max_pixels", MAX_PIXELS),
        **{k: v for k, v in settings.items() if k not in ("min_pixels", "max_pixels")},
    )
    assert pixel_values.dtype == np.float32
    assert grid_thw.tolist() == reference["image_grid_thw"][0].tolist()
    assert pixel_values.shape == reference["pixel_values"].shape
    np.testing.assert_array_equal(pixel_values, reference["pixel_values"])
    return pixel_values, grid_thw


@pytest.mark.parametrize(
    "height, width",
    [(37, 91), (333, 517), (4000, 30), (2, 300), (64, 96), (1000, 700), (48, 80), (511, 513)],
)
def test_rgb_sizes_match_reference(height, width):
    rng = np.random.default_rng(height * 10007 + width)
    assert_same_as_hf(random_image(rng, height, width))


@pytest.mark.parametrize("mode", ["RGBA", "L", "LA", "P", "P+transparency", "CMYK", "1"])
def test_modes_match_reference(mode):
    rng = np.random.default_rng(7)
    if mode.startswith("P"):
        image = random_image(rng, 45, 80, "L").convert("P")
        if mode == "P+transparency":
            image.info["transparency"] = int(np.asarray(image)[0, 0])
    elif mode in ("CMYK", "1"):
        image = random_image(rng, 45, 80).convert(mode)
    else:
        image = random_image(rng, 45, 80, mode)
    assert_same_as_hf(image)


def test_alpha_is_composited_on_white():
    rgba = np.zeros((64, 64, 4), np.uint8)  # fully transparent black
    pixel_values, _ = image_lib.preprocess_image(rgba, min_pixels=4096, max_pixels=4096)
    np.testing.assert_array_equal(pixel_values, np.ones_like(pixel_values))  # white -> (1 - 0.5) / 0.5


@pytest.mark.parametrize("shape", [(50, 70, 3), (50, 70, 4), (50, 70, 1)])
def test_uint8_arrays_match_reference(shape):
    rng = np.random.default_rng(sum(shape))
    assert_same_as_hf(rng.integers(0, 256, shape, dtype=np.uint8))


def test_2d_array_is_grayscale():
    # transformers takes no 2-D arrays; ours reads them as a PIL "L" image would be read.
    pixels = np.random.default_rng(1).integers(0, 256, (50, 70), dtype=np.uint8)
    ours = image_lib.preprocess_image(pixels, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    reference, _ = assert_same_as_hf(Image.fromarray(pixels, "L"))
    np.testing.assert_array_equal(ours[0], reference)


@pytest.mark.parametrize(
    "settings",
    [
        dict(min_pixels=4096, max_pixels=8192),
        dict(min_pixels=200_000, max_pixels=1_000_000),
        dict(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=3136, max_pixels=100_352),
        dict(patch_size=16, merge_size=1, temporal_patch_size=1, min_pixels=1024, max_pixels=50_000),
    ],
)
def test_other_settings_match_reference(settings):
    rng = np.random.default_rng(3)
    assert_same_as_hf(random_image(rng, 300, 200), **settings)


def test_smart_resize_matches_reference_on_many_sizes():
    rng = np.random.default_rng(0)
    sizes = [(int(h), int(w)) for h, w in rng.integers(1, 3000, (400, 2)) if max(h, w) / min(h, w) <= 200]
    sizes += [(48, 48), (80, 80), (16, 16), (1, 1), (1, 200), (200, 1)]  # halves round to even; tiny inputs
    for min_pixels, max_pixels in [(65536, 16777216), (65536, 160000), (1, 1024), (3136, 12845056)]:
        for height, width in sizes:
            expected = hf_image.smart_resize(height, width, 32, min_pixels=min_pixels, max_pixels=max_pixels)
            got = image_lib.smart_resize(height, width, factor=32, min_pixels=min_pixels, max_pixels=max_pixels)
            assert got == expected, (height, width, min_pixels, max_pixels)


def test_patch_rows_follow_merge_block_order():
    # Rows 0..3 are the 2x2 patches of the top-left merge block, in (row, col) order, each flattened (C, T, p, p).
    rng = np.random.default_rng(11)
    pixels = rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)
    pixel_values, grid_thw = image_lib.preprocess_image(pixels, min_pixels=6144, max_pixels=6144)
    assert grid_thw.tolist() == [1, 4, 6]
    normalised = (pixels.astype(np.float64) / 255).astype(np.float32)
    normalised = (normalised - np.float32(0.5)) / np.float32(0.5)
    rows = pixel_values.reshape(24, 3, 2, 16, 16)
    np.testing.assert_array_equal(rows[:, :, 0], rows[:, :, 1])  # the still image fills both frames
    for row, (py, px) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3)]):
        patch = normalised[py * 16:(py + 1) * 16, px * 16:(px + 1) * 16].transpose(2, 0, 1)
        np.testing.assert_array_equal(rows[row, :, 0], patch)


def test_batch_helper_concatenates_in_order():
    rng = np.random.default_rng(5)
    images = [random_image(rng, 37, 91), random_image(rng, 333, 517), random_image(rng, 120, 64, "RGBA")]
    pixel_values, grid_thw = image_lib.preprocess_images(images, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    reference = hf_processor()(images=images, return_tensors="np")
    np.testing.assert_array_equal(grid_thw, reference["image_grid_thw"])
    np.testing.assert_array_equal(pixel_values, reference["pixel_values"])
    empty_values, empty_grid = image_lib.preprocess_images([], min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    assert empty_values.shape == (0, 1536) and empty_grid.shape == (0, 3)


def test_image_token_count():
    assert image_lib.image_token_count([1, 4, 6]) == 6
    assert image_lib.image_token_count(np.array([1, 24, 24])) == 144
    assert image_lib.image_token_count([2, 6, 4], merge_size=2) == 12
    with pytest.raises(ValueError, match=r"grid_thw must be 3 positive ints .* got \[1, 3, 4\]"):
        image_lib.image_token_count([1, 3, 4])


def test_extreme_aspect_ratio_is_rejected_like_reference():
    image = Image.new("RGB", (300, 1))  # 1 high, 300 wide
    with pytest.raises(ValueError, match="aspect ratio"):
        hf_processor()(images=[image], return_tensors="np")
    with pytest.raises(ValueError, match=r"image 1x300 \(HxW\) has aspect ratio 300.0 > 200"):
        image_lib.preprocess_image(image, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    with pytest.raises(ValueError, match=r"image 4500x20 \(HxW\)"):
        image_lib.preprocess_image(np.zeros((4500, 20, 3), np.uint8), min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)


def test_bad_inputs_name_the_problem():
    with pytest.raises(TypeError, match="dtype float32"):
        image_lib.preprocess_image(np.zeros((8, 8, 3), np.float32), min_pixels=1, max_pixels=4096)
    with pytest.raises(ValueError, match=r"got shape \(8, 8, 5\)"):
        image_lib.preprocess_image(np.zeros((8, 8, 5), np.uint8), min_pixels=1, max_pixels=4096)
    with pytest.raises(TypeError, match="got list"):
        image_lib.preprocess_image([[0]], min_pixels=1, max_pixels=4096)
    with pytest.raises(ValueError, match="min_pixels=5000, max_pixels=4096"):
        image_lib.preprocess_image(np.zeros((8, 8, 3), np.uint8), min_pixels=5000, max_pixels=4096)
    with pytest.raises(ValueError, match="height=0, width=5"):
        image_lib.smart_resize(0, 5, factor=32, min_pixels=1, max_pixels=4096)
