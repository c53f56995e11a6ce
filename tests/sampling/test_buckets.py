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


def _call_cost(b, lengths, call, *, batch, slots):
    """The documented cost of one append call, restated: rows x padded length, a cache copy per sub-batch row,
    a launch."""
    rows = b.append_rows(len(call))
    copies = rows * (slots // 32) if rows < batch else 0
    return min(rows, batch) * max(b.length(lengths[i]) for i in call) + copies + 32


def test_append_groups_split_rows_of_very_different_lengths():
    b = buckets.Buckets()
    # a 400-token search result beside seven 3-token generation prompts: one call would pad all eight to 512
    assert b.append_groups([3, 400, 3, 3, 3, 3, 3, 3], batch=32, slots=2048) == [[0, 2, 3, 4, 5, 6, 7], [1]]
    assert b.append_groups([100, 120, 70], batch=32, slots=2048) == [[0, 1, 2]]  # one bucket: one call
    assert b.append_groups([10, 20], batch=32, slots=2048) == [[0, 1]]  # 16 vs 32 tokens: not worth a launch
    assert buckets.Buckets(group_appends=False).append_groups([3, 400], batch=32, slots=2048) == [[0, 1]]
    with pytest.raises(ValueError, match="Buckets.group_appends must be a bool, got 1"):
        buckets.Buckets(group_appends=1)


@pytest.mark.parametrize("seed", range(6))
def test_append_groups_is_the_cheapest_split_of_the_length_buckets(seed):
    """Against every split of the sorted length buckets into consecutive calls (brute force)."""
    rng = np.random.default_rng(seed)
    b = buckets.Buckets(min_append_rows=int(rng.choice([1, 2, 8])))
    lengths = [int(n) for n in rng.choice([1, 3, 15, 40, 70, 200, 230, 450, 900], size=int(rng.integers(1, 30)))]
    batch, slots = int(rng.choice([8, 32])), int(rng.choice([512, 2048]))
    calls = b.append_groups(lengths, batch=batch, slots=slots)
    assert sorted(i for call in calls for i in call) == list(range(len(lengths)))
    got = sum(_call_cost(b, lengths, call, batch=batch, slots=slots) for call in calls)
    levels = sorted({b.length(n) for n in lengths})
    best = None
    for cuts in range(1 << (len(levels) - 1)):
        calls_here, current = [], []
        for k, level in enumerate(levels):
            current += [i for i, n in enumerate(lengths) if b.length(n) == level]
            if k == len(levels) - 1 or cuts >> k & 1:
                calls_here.append(current)
                current = []
        cost = sum(_call_cost(b, lengths, call, batch=batch, slots=slots) for call in calls_here)
        best = cost if best is None else min(best, cost)
    assert got == best
    assert got <= _call_cost(b, lengths, list(range(len(lengths))), batch=batch, slots=slots)
