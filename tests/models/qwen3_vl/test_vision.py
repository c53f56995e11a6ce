"""The vision tower stage by stage against transformers: layout, 2-D RoPE, patch + position embedding, every
block, DeepStack mergers and the final merger (scaled-8B geometry: depth 4, taps (1, 2), 6 x 6 position grid)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import torch
from flax import nnx
from support import tiny_hf
from transformers import vision_utils

from ranger_jax.models.qwen3_vl import load, vision

ATOL = 1e-4

_block = nnx.jit(lambda block, x, cos, sin, segment: block(x, cos, sin, segment))
_merge = nnx.jit(lambda merger, x: merger(x))
_embed = nnx.jit(lambda tower, pixels, layout: tower.patch_embed(pixels) + tower.position_embeddings(layout))
_encode = nnx.jit(lambda tower, pixels, grid: tower(pixels, grid))
_layout = jax.jit(vision.patch_layout, static_argnums=(1, 2))


@pytest.fixture(scope="module")
def traced(checkpoints, image_batch):
    """HF tower run once with hooks recording each block's input, RoPE tables and output."""
    case = checkpoints("scaled_8b")
    batch = image_batch(case.config)
    tower = case.hf.model.visual
    records = []
    hooks = [block.register_forward_hook(
        lambda module, args, kwargs, out: records.append((args[0], kwargs["position_embeddings"], out)),
        with_kwargs=True) for block in tower.blocks]
    with torch.no_grad():
        out = tower(torch.from_numpy(batch["pixel_values"]), grid_thw=torch.from_numpy(batch["image_grid_thw"]))
    for hook in hooks:
        hook.remove()
    return case, batch, records, out


def _np(x) -> np.ndarray:
    return x.detach().float().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _diff(ours, ref) -> float:
    return float(np.abs(_np(ours) - _np(ref)).max())


def test_patch_layout_and_rope_match_transformers(traced):
    case, batch, records, _ = traced
    grid = batch["image_grid_thw"]
    layout = _layout(grid, batch["pixel_values"].shape[0], 2)
    ref = vision_utils.get_vision_position_ids(torch.from_numpy(grid), 2).numpy()
    np.testing.assert_array_equal(np.stack([layout.row, layout.col], -1), ref, err_msg="vision patch (row, col)")
    cu = vision_utils.get_vision_cu_seqlens(torch.from_numpy(grid)).numpy()
    np.testing.assert_array_equal(np.bincount(np.asarray(layout.segment)), np.diff(cu), err_msg="vision segments")
    cos, sin = vision.vision_rotary(layout, case.config.vision_config)
    ref_cos, ref_sin = records[0][1]
    assert _diff(cos, ref_cos) <= 1e-5 and _diff(sin, ref_sin) <= 1e-5, "vision 2-D RoPE"


def test_patch_and_position_embedding_match_transformers(traced):
    case, batch, records, _ = traced
    layout = _layout(batch["image_grid_thw"], batch["pixel_values"].shape[0], 2)
    ours = _embed(case.model.model.visual, batch["pixel_values"], layout)
    assert _diff(ours, records[0][0]) <= ATOL, "patch embed + interpolated position embedding"


def test_every_vision_block_matches_transformers(traced):
    case, batch, records, _ = traced
    layout = _layout(batch["image_grid_thw"], batch["pixel_values"].shape[0], 2)
    cos, sin = vision.vision_rotary(layout, case.config.vision_config)
    for i, (block, (x_in, _, x_out)) in enumerate(zip(case.model.model.visual.blocks, records)):
        ours = _block(block, _np(x_in), cos, sin, layout.segment)
        assert _diff(ours, x_out) <= ATOL, f"vision block {i}"


def test_deepstack_and_final_mergers_match_transformers(traced):
    case, batch, records, out = traced
    tower = case.model.model.visual
    taps = case.config.vision_config.deepstack_visual_indexes
    assert len(out.deepstack_features) == len(taps) == 2
    for j, block in enumerate(taps):
        ours = _merge(tower.deepstack_merger_list[j], _np(records[block][2]))
        assert _diff(ours, out.deepstack_features[j]) <= ATOL, f"deepstack merger {j} (block {block})"
    assert _diff(_merge(tower.merger, _np(records[-1][2])), out.pooler_output) <= ATOL, "final merger"


def test_whole_tower_matches_transformers(traced):
    case, batch, _, out = traced
    image_embeds, deepstack = _encode(case.model.model.visual, batch["pixel_values"], batch["image_grid_thw"])
    assert image_embeds.shape == (batch["pixel_values"].shape[0] // 4, case.config.text_config.hidden_size)
    assert _diff(image_embeds, out.pooler_output) <= ATOL, "image_embeds"
    assert _diff(deepstack, torch.stack(out.deepstack_features)) <= ATOL, "deepstack features"


def test_unsorted_deepstack_taps_follow_block_order(tmp_path, configs):
    """Taps (2, 0): transformers emits features in block order, each from its list position's merger."""
    config = configs["tied"]
    config = dataclasses.replace(config, vision_config=dataclasses.replace(config.vision_config,
                                                                           deepstack_visual_indexes=(2, 0)))
    hf = tiny_hf.save_checkpoint(config, tmp_path, seed=4)
    batch = tiny_hf.make_batch(config, [[(2, 4)]], seed=4)
    with torch.no_grad():
        out = hf.model.visual(torch.from_numpy(batch["pixel_values"]),
                              grid_thw=torch.from_numpy(batch["image_grid_thw"]))
    _, deepstack = _encode(load(tmp_path).model.visual, batch["pixel_values"], batch["image_grid_thw"])
    assert _diff(deepstack, torch.stack(out.deepstack_features)) <= ATOL
