"""`examples.image_pixels` patches a recorded PNG once: an image seen again returns the array made the first time."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from ranger_jax.data import examples, trajectory


def _image(seed: int, size=(32, 32)) -> trajectory.TrajectoryImage:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (*size[::-1], 3), dtype=np.uint8)).save(buf, format="PNG")
    return trajectory.TrajectoryImage(buf.getvalue(), (1, size[1] // 16, size[0] // 16), 0, "IMG_001")


PATCHING = dict(patch_size=16, merge_size=2, temporal_patch_size=2)


def test_an_image_seen_again_is_patched_once_and_read_only(monkeypatch):
    monkeypatch.setattr(examples, "_PIXEL_MEMO", examples._PixelMemo(2**20))
    calls = []
    real = examples._patched
    monkeypatch.setattr(examples, "_patched", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = examples.image_pixels(_image(0), **PATCHING)
    again = examples.image_pixels(trajectory.TrajectoryImage(_image(0).png, (1, 2, 2), 7, "IMG_002"), **PATCHING)
    assert again is first and len(calls) == 1  # same PNG and patching: another record's copy of it is not decoded
    with pytest.raises(ValueError, match="read-only"):
        first[0, 0] = 1.0
    np.testing.assert_array_equal(first, real(_image(0), **PATCHING, where="image"))
    other = examples.image_pixels(_image(1), **PATCHING)
    assert len(calls) == 2 and not np.array_equal(other, first)
    examples.image_pixels(_image(0), patch_size=16, merge_size=2, temporal_patch_size=1)  # other patching
    assert len(calls) == 3


def test_the_memo_keeps_the_newest_within_its_bytes():
    memo = examples._PixelMemo(max_bytes=3 * 400)
    arrays = {k: np.full((10, 10), k, np.float32) for k in range(4)}  # 400 bytes each
    for k in range(3):
        memo.put((k,), arrays[k])
    assert memo.get((0,)) is arrays[0]  # touched: now the newest
    memo.put((3,), arrays[3])  # over the bound: the least recently used (1) goes
    assert memo.get((1,)) is None and memo.get((0,)) is arrays[0] and memo.get((3,)) is arrays[3]
    assert memo.bytes == 3 * 400
    memo.put((9,), np.zeros((40, 40), np.float32))  # larger than the whole memo: not kept
    assert memo.get((9,)) is None and memo.bytes == 3 * 400


def test_bad_pngs_still_fail_naming_the_image(monkeypatch):
    monkeypatch.setattr(examples, "_PIXEL_MEMO", examples._PixelMemo(2**20))
    wrong_grid = trajectory.TrajectoryImage(_image(2).png, (1, 4, 2), 0, "IMG_003")
    with pytest.raises(ValueError, match=r"record 4 image 0: PNG is 32x32 but grid_thw=\[1, 4, 2\]"):
        examples.image_pixels(wrong_grid, **PATCHING, where="record 4 image 0")
    with pytest.raises(ValueError, match="record 4 image 0: PNG is 32x32"):  # a failure is not remembered
        examples.image_pixels(wrong_grid, **PATCHING, where="record 4 image 0")
