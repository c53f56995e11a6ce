"""Shape buckets: rounding up, patch buckets per image count, padding of pixel rows and grids, and fitting
image features and grids to a call."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ranger_jax.sampling import buckets, steps


def test_bucket_sizes():
    b = buckets.Buckets(min_length=16, min_patches=64)
    assert [buckets.round_up(n, 16) for n in (1, 16, 17, 100)] == [16, 16, 32, 128]
    assert b.patches(24, 2) == 64 and b.patches(68, 2) == 128 and b.patches(36, 3) == 72
    pixels, grid = buckets.pad_images(np.ones((24, 5), np.float32), np.array([[1, 4, 6]]), num_patches=64,
                                      num_images=4, merge=2)
    assert pixels.shape == (64, 5) and not pixels[24:].any()
    np.testing.assert_array_equal(grid, [[1, 4, 6], [1, 2, 20], [1, 2, 2], [1, 2, 2]])


def test_image_features_and_grids_fit_the_call():
    """Fitted to a call's rows x tokens: padded with rows no placeholder reads, or cut past the real ones."""
    grid = np.array([[1, 4, 6], [1, 2, 20], [1, 2, 2], [1, 2, 2]])
    np.testing.assert_array_equal(buckets.fit_grids(grid, 6, merge=2), [*grid, [1, 2, 2], [1, 2, 2]])
    np.testing.assert_array_equal(buckets.fit_grids(grid, 2, merge=2), grid[:2])
    embeds, deepstack = jnp.arange(12.0).reshape(4, 3), jnp.arange(24.0).reshape(2, 4, 3)
    grown, grown_deep = steps.fit_image_features(embeds, deepstack, rows=6)
    assert grown.shape == (6, 3) and grown_deep.shape == (2, 6, 3)
    np.testing.assert_array_equal(grown[:4], embeds)
    np.testing.assert_array_equal(grown_deep[:, :4], deepstack)
    assert not np.asarray(grown[4:]).any() and not np.asarray(grown_deep[:, 4:]).any()
    cut, none = steps.fit_image_features(embeds, None, rows=3)
    np.testing.assert_array_equal(cut, embeds[:3])
    assert none is None
    assert buckets.Buckets().fits_images(32, 512) and not buckets.Buckets().fits_images(32, 1024)
    assert not buckets.Buckets(fit_images_up_to=0).fits_images(1, 1)
    with pytest.raises(ValueError, match="Buckets.fit_images_up_to must be an int >= 0, got -1"):
        buckets.Buckets(fit_images_up_to=-1)
    with pytest.raises(ValueError, match="Buckets.min_images must be a positive int, got True"):
        buckets.Buckets(min_images=True)
