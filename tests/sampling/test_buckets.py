"""Shape buckets: rounding up, patch buckets per image count, and padding of pixel rows and grids."""

from __future__ import annotations

import numpy as np

from ranger_jax.sampling import buckets


def test_bucket_sizes():
    b = buckets.Buckets(min_length=16, min_patches=64)
    assert [buckets.round_up(n, 16) for n in (1, 16, 17, 100)] == [16, 16, 32, 128]
    assert b.patches(24, 2) == 64 and b.patches(68, 2) == 128 and b.patches(36, 3) == 72
    pixels, grid = buckets.pad_images(np.ones((24, 5), np.float32), np.array([[1, 4, 6]]), num_patches=64,
                                      num_images=4, merge=2)
    assert pixels.shape == (64, 5) and not pixels[24:].any()
    np.testing.assert_array_equal(grid, [[1, 4, 6], [1, 2, 20], [1, 2, 2], [1, 2, 2]])
