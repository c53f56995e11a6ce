"""Observation images prepared once: the recorded PNG re-preprocesses to the policy's pixels, bit for bit."""

import concurrent.futures
import io
import threading

import numpy as np
import pytest
from PIL import Image

from ranger_jax.processing import image_token_count, preprocess_image
from ranger_jax.rollout import sequence

SETTINGS = sequence.VisionSettings(min_pixels=4096, max_pixels=40_000)


def noisy(size, mode="RGB", seed=0):
    rng = np.random.default_rng(seed)
    channels = len(mode)
    return Image.fromarray(rng.integers(0, 255, (size[1], size[0], channels), dtype=np.uint8).squeeze(), mode)


@pytest.mark.parametrize("size", [(333, 217), (64, 64), (900, 40), (31, 500)])
def test_recorded_png_gives_the_policys_pixels(size):
    original = noisy(size)
    prepared = sequence.prepare_image(original, SETTINGS, img_id="IMG_004", parent_id="IMG_001")
    reread = Image.open(io.BytesIO(prepared.png))
    assert reread.mode == "RGB" and reread.size == prepared.image.size
    assert reread.size[0] % 32 == 0 and reread.size[1] % 32 == 0
    again, grid = preprocess_image(reread, min_pixels=SETTINGS.min_pixels, max_pixels=SETTINGS.max_pixels)
    np.testing.assert_array_equal(again, prepared.pixel_values)
    np.testing.assert_array_equal(grid, prepared.grid_thw)
    direct, direct_grid = preprocess_image(original, min_pixels=SETTINGS.min_pixels, max_pixels=SETTINGS.max_pixels)
    np.testing.assert_array_equal(direct, prepared.pixel_values)  # the same pixels as preprocessing the original
    assert prepared.num_tokens == image_token_count(grid) <= SETTINGS.max_pixels // 1024
    assert (prepared.img_id, prepared.parent_id) == ("IMG_004", "IMG_001")


@pytest.mark.parametrize("size", [(300, 40), (40, 300), (192, 32), (500, 33), (1000, 70), (45, 45)])
def test_a_thin_image_is_recorded_at_a_size_the_processor_keeps(size):
    # smart_resize clamps a short side at 32 pixels, so its result can be over max_pixels and shrink again
    tight = sequence.VisionSettings(min_pixels=1024, max_pixels=4096)
    prepared = sequence.prepare_image(noisy(size), tight, img_id="IMG_006")
    reread = Image.open(io.BytesIO(prepared.png))
    again, grid = preprocess_image(reread, min_pixels=1024, max_pixels=4096)
    np.testing.assert_array_equal(again, prepared.pixel_values)
    np.testing.assert_array_equal(grid, prepared.grid_thw)
    width, height = prepared.image.size
    assert sequence.processor_size(height, width, tight) == (height, width) and width * height <= 4096
    assert prepared.num_tokens == image_token_count(grid) <= 4


def test_transparency_is_flattened_once():
    rgba = noisy((120, 80), "RGBA", seed=2)
    prepared = sequence.prepare_image(rgba, SETTINGS)
    assert Image.open(io.BytesIO(prepared.png)).mode == "RGB"
    again, _ = preprocess_image(Image.open(io.BytesIO(prepared.png)), min_pixels=4096, max_pixels=40_000)
    np.testing.assert_array_equal(again, prepared.pixel_values)


def test_settings_and_refusals():
    with pytest.raises(ValueError, match=r"min_pixels \(50000\) > max_pixels \(40000\)"):
        sequence.VisionSettings(min_pixels=50_000, max_pixels=40_000)
    with pytest.raises(ValueError, match="VisionSettings.merge_size must be a positive int; got 0"):
        sequence.VisionSettings(merge_size=0)
    with pytest.raises(ValueError, match="image IMG_009 of size 2000x4: .*aspect ratio"):
        sequence.prepare_image(noisy((2000, 4)), SETTINGS, img_id="IMG_009")


def test_prepared_image_cache_reuses_work_by_content_within_its_budget():
    cache = sequence.PreparedImageCache(max_bytes=10 * 2**20)
    first = cache.prepare(noisy((333, 217)), SETTINGS, key="sha-a", img_id="IMG_001")
    again = cache.prepare(noisy((333, 217)), SETTINGS, key="sha-a", img_id="IMG_007", parent_id="IMG_002")
    assert (cache.hits, cache.misses, len(cache)) == (1, 1, 1)
    assert again.png == first.png and again.pixel_values is first.pixel_values  # shared, hence read-only
    assert (again.img_id, again.parent_id) == ("IMG_007", "IMG_002") and first.img_id == "IMG_001"
    with pytest.raises(ValueError, match="read-only"):
        first.pixel_values[0, 0] = 1.0
    other = sequence.VisionSettings(min_pixels=1024, max_pixels=16_384)
    assert cache.prepare(noisy((333, 217)), other, key="sha-a").num_tokens < first.num_tokens  # settings are keyed
    size = first.pixel_values.nbytes + len(first.png) + 3 * first.image.width * first.image.height
    small = sequence.PreparedImageCache(max_bytes=size)
    for key in ("a", "b", "a"):
        small.prepare(noisy((333, 217)), SETTINGS, key=key)
    assert (small.hits, small.misses, len(small)) == (0, 3, 1)  # "b" pushed "a" out: least recently used first
    off = sequence.PreparedImageCache(max_bytes=0)
    off.prepare(noisy((64, 64)), SETTINGS, key="x")
    off.prepare(noisy((64, 64)), SETTINGS, key="x")
    assert (off.hits, len(off)) == (0, 0)
    with pytest.raises(ValueError, match="max_bytes must be an int >= 0; got -1"):
        sequence.PreparedImageCache(max_bytes=-1)


def test_concurrent_requests_for_one_image_prepare_it_once():
    cache = sequence.PreparedImageCache()
    barrier = threading.Barrier(4)

    def ask(index):
        barrier.wait()
        return cache.prepare(noisy((333, 217)), SETTINGS, key="same", img_id=f"IMG_00{index}")

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(ask, range(4)))
    assert (cache.misses, cache.hits) == (1, 3) and len({r.png for r in results}) == 1
    assert [r.img_id for r in results] == ["IMG_000", "IMG_001", "IMG_002", "IMG_003"]
    with pytest.raises(ValueError, match="aspect ratio"):  # a failure is not cached: the next caller tries again
        cache.prepare(noisy((2000, 4)), SETTINGS, key="strip")
    with pytest.raises(ValueError, match="aspect ratio"):
        cache.prepare(noisy((2000, 4)), SETTINGS, key="strip")
    assert cache.misses == 3


def test_a_cache_hit_never_loads_the_pixels():
    cache = sequence.PreparedImageCache()
    loads = []

    def loader():
        loads.append(1)
        return noisy((100, 70))

    first = cache.prepare(loader, SETTINGS, key="lazy")
    second = cache.prepare(loader, SETTINGS, key="lazy", img_id="IMG_002")
    assert len(loads) == 1 and second.png == first.png and second.img_id == "IMG_002"


def test_generated_ids_can_be_trained_per_id():
    seq = sequence.TokenSequence(image_pad_id=99, merge_size=2)
    seq.append_generated(np.array([5, 6, 7]), np.array([-0.1, -0.2, -0.3]), trained=False)
    seq.append_generated(np.array([8, 9, 10]), np.array([-0.4, -0.5, -0.6]), trained=np.array([False, True, False]))
    seq.append_generated(np.array([11]), np.array([-0.7]))
    arrays = seq.arrays()
    np.testing.assert_array_equal(arrays["token_ids"], [5, 6, 7, 8, 9, 10, 11])
    np.testing.assert_array_equal(arrays["loss_mask"], [0, 0, 0, 0, 1, 0, 1])
    np.testing.assert_allclose(arrays["sampler_logprobs"], [0, 0, 0, 0, -0.5, 0, -0.7])
    with pytest.raises(ValueError, match="2 generated ids but 3 trained flags"):
        seq.append_generated(np.array([1, 2]), np.array([0.0, 0.0]), trained=np.array([True, False, True]))


def test_a_sequence_takes_over_the_continuation_of_one_that_starts_like_it():
    lead = sequence.TokenSequence(image_pad_id=99, merge_size=2)
    lead.append_generated(np.array([5, 6]), np.array([-0.1, -0.2]))
    follower = lead.copy()
    lead.append_generated(np.array([7, 8]), np.array([-0.3, -0.4]), trained=np.array([True, False]))
    follower.extend_from(lead)
    for name, values in lead.arrays().items():
        np.testing.assert_array_equal(follower.arrays()[name], values, err_msg=name)
    other = sequence.TokenSequence(image_pad_id=99, merge_size=2)
    other.append_generated(np.array([5, 9, 1]), np.array([0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match=r"the sequence to continue from \(4 ids\) does not start with this "
                                         r"sequence's 3 ids"):
        other.extend_from(lead)
