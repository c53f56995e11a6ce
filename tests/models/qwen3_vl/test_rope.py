"""`get_rope_index` against transformers' `Qwen3VLModel.get_rope_index`, plus a hand-computed case."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from support import tiny_hf

from ranger_jax.models.qwen3_vl import get_rope_index

_rope_index = jax.jit(get_rope_index, static_argnames=("image_token_id", "spatial_merge_size"))


def _reference(hf, batch):
    with torch.no_grad():
        positions, deltas = hf.model.get_rope_index(
            torch.from_numpy(batch["input_ids"]), torch.from_numpy(batch["mm_token_type_ids"]),
            image_grid_thw=None if batch["image_grid_thw"] is None else torch.from_numpy(batch["image_grid_thw"]),
            attention_mask=torch.from_numpy(batch["attention_mask"]))
    return positions.numpy(), deltas.numpy()[:, 0]


@pytest.mark.parametrize("name", ["scaled_8b", "tied", "minimal"])
def test_positions_and_deltas_match_transformers_with_images(checkpoints, image_batch, name):
    case = checkpoints(name)
    batch = image_batch(case.config)
    positions, deltas = _rope_index(batch["input_ids"], batch["image_grid_thw"], batch["attention_mask"],
                                    image_token_id=case.config.image_token_id, spatial_merge_size=2)
    ref_positions, ref_deltas = _reference(case.hf, batch)
    assert positions.shape == (3, *batch["input_ids"].shape) and positions.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(positions), ref_positions, err_msg="MRoPE positions")
    np.testing.assert_array_equal(np.asarray(deltas), ref_deltas, err_msg="rope deltas")


def test_text_only_padded_matches_transformers(checkpoints, text_batch):
    case = checkpoints("minimal")
    batch = text_batch(case.config)
    positions, deltas = get_rope_index(batch["input_ids"], None, batch["attention_mask"],
                                       image_token_id=case.config.image_token_id, spatial_merge_size=2)
    ref_positions, ref_deltas = _reference(case.hf, batch)
    np.testing.assert_array_equal(np.asarray(positions), ref_positions)
    np.testing.assert_array_equal(np.asarray(deltas), ref_deltas)
    assert not np.asarray(deltas).any()


def test_hand_computed_layout():
    """2 text tokens, an image of 4 x 6 patches (2 x 3 tokens), 1 text token, then one right pad."""
    image, pad = 5, 0
    ids = np.array([[7, 8] + [image] * 6 + [9, pad]])
    mask = np.array([[1] * 9 + [0]])
    positions, deltas = get_rope_index(ids, np.array([[1, 4, 6]]), mask, image_token_id=image, spatial_merge_size=2)
    expected = np.array([
        [0, 1, 2, 2, 2, 2, 2, 2, 5, 0],  # t: the image's tokens share its start
        [0, 1, 2, 2, 2, 3, 3, 3, 5, 0],  # h: rows of the 2 x 3 token grid
        [0, 1, 2, 3, 4, 2, 3, 4, 5, 0],  # w: columns; text resumes at start + max(2, 3)
    ])
    np.testing.assert_array_equal(np.asarray(positions)[:, 0], expected)
    assert int(deltas[0]) == 5 + 1 - 9


def test_adjacent_images_without_separator_each_take_their_grid():
    """Two images back to back: the second starts at the first's start + max(h, w) (transformers cannot split them)."""
    image = 5
    ids = np.array([[7] + [image] * 2 + [image] * 4 + [8]])
    positions, deltas = get_rope_index(ids, np.array([[1, 2, 4], [1, 4, 4]]), None, image_token_id=image,
                                       spatial_merge_size=2)
    expected = np.array([
        [0, 1, 1, 3, 3, 3, 3, 5],
        [0, 1, 1, 3, 3, 4, 4, 5],
        [0, 1, 2, 3, 4, 3, 4, 5],
    ])
    np.testing.assert_array_equal(np.asarray(positions)[:, 0], expected)
    assert int(deltas[0]) == 5 + 1 - 8


def test_multi_frame_grid_uses_temporal_positions():
    """grid t = 2 (e.g. 4 frames at temporal patch 2): t index advances per frame, the next text still by max(h, w)."""
    image = 5
    ids = np.array([[7] + [image] * 4 + [8]])
    positions, _ = get_rope_index(ids, np.array([[2, 2, 4]]), None, image_token_id=image, spatial_merge_size=2)
    np.testing.assert_array_equal(np.asarray(positions)[:, 0], [[0, 1, 1, 2, 2, 3], [0, 1, 1, 1, 1, 3],
                                                                [0, 1, 2, 1, 2, 3]])


def test_matches_transformers_on_random_layouts(checkpoints):
    """Random rows (text runs, images of random grids, random padding sides) against transformers."""
    case = checkpoints("tied")
    rng = np.random.default_rng(7)
    rows, sides = [], []
    for _ in range(4):
        parts = []
        for _ in range(rng.integers(1, 4)):
            parts.append(int(rng.integers(1, 4)))
            if rng.random() < 0.7:
                parts.append((2 * int(rng.integers(1, 4)), 2 * int(rng.integers(1, 4))))
        rows.append(parts)
        sides.append(["left", "right"][int(rng.integers(2))])
    batch = tiny_hf.make_batch(case.config, rows, padding_side=sides, seed=8)
    positions, deltas = get_rope_index(batch["input_ids"], batch["image_grid_thw"], batch["attention_mask"],
                                       image_token_id=case.config.image_token_id, spatial_merge_size=2)
    ref_positions, ref_deltas = _reference(case.hf, batch)
    np.testing.assert_array_equal(np.asarray(positions), ref_positions)
    np.testing.assert_array_equal(np.asarray(deltas), ref_deltas)
