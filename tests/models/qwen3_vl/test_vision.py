"""The vision tower stage by stage against transformers: layout, 2-D RoPE, patch + position embedding, every
block, DeepStack mergers and the final merger (scaled-8B geometry: depth 4, taps (1, 2), 6 x 6 position grid);
the blocked segment attention against per-image torch attention (values and gradients), batching images against
encoding each alone, and attention memory growing linearly with the number of images."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from support import tiny_hf
from transformers import vision_utils

from ranger_jax.models.qwen3_vl import attention_segments, load, vision

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


@pytest.mark.parametrize("block", [None, 16])
def test_whole_tower_matches_transformers(traced, monkeypatch, block):
    """Default blocks (the 76 patches fit one) and blocks of 16 rows, which images straddle."""
    case, batch, _, out = traced
    encode = _encode
    if block is not None:
        monkeypatch.setattr(attention_segments, "BLOCK", block)
        encode = nnx.jit(lambda tower, pixels, grid: tower(pixels, grid))  # a fresh trace sees the new BLOCK
    image_embeds, deepstack = encode(case.model.model.visual, batch["pixel_values"], batch["image_grid_thw"])
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


def _torch_segment_attention(q, k, v, sizes, scale, d_out):
    """Attention of each segment alone (torch sdpa, float64) -> (out, dq, dk, dv) as numpy [P, N, H]."""
    tq, tk, tv = (torch.tensor(np.asarray(x), dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    outs, start = [], 0
    for size in sizes:
        rows = slice(start, start + size)
        heads_first = [x[rows].transpose(0, 1) for x in (tq, tk, tv)]  # [N, T, H]
        outs.append(torch.nn.functional.scaled_dot_product_attention(*heads_first, scale=scale).transpose(0, 1))
        start += size
    out = torch.cat(outs)
    out.backward(torch.from_numpy(np.asarray(d_out, np.float64)))
    return tuple(x.detach().numpy() for x in (out, tq.grad, tk.grad, tv.grad))


@pytest.mark.parametrize("block", [8, 128])
def test_segment_attention_and_gradients_match_torch_per_segment(block):
    """Segments of 13, 1, 30, 7, 19 rows straddle blocks of 8 (70 rows padded to 72); 128 is one short block.
    The custom VJP's dq, dk, dv match torch autograd on each segment alone."""
    sizes = [13, 1, 30, 7, 19]
    rng = np.random.default_rng(0)
    q, k, v, d_out = (rng.standard_normal((sum(sizes), 3, 8)).astype(np.float32) for _ in range(4))
    segment = np.repeat(np.arange(len(sizes)), sizes).astype(np.int32)
    scale = 8**-0.5

    @jax.jit
    def run(q, k, v, segment, d_out):
        out, pullback = jax.vjp(lambda q, k, v: attention_segments.segment_attention(
            q, k, v, segment, scale=scale, block=block), q, k, v)
        return (out, *pullback(d_out))

    ours = run(q, k, v, segment, d_out)
    ref = _torch_segment_attention(q, k, v, sizes, scale, d_out)
    for name, a, b in zip(["out", "dq", "dk", "dv"], ours, ref):
        assert _diff(a, b) <= 1e-5, f"{name} (block {block})"


def test_images_of_different_sizes_encode_as_each_alone(checkpoints, monkeypatch):
    """Three images batched (blocks of 8 rows, so images share blocks) give each image's features alone."""
    case = checkpoints("scaled_8b")
    monkeypatch.setattr(attention_segments, "BLOCK", 8)
    encode = nnx.jit(lambda tower, pixels, grid: tower(pixels, grid))  # a fresh trace sees the new BLOCK
    tower = case.model.model.visual
    grids = np.array([[1, 4, 6], [1, 2, 2], [1, 6, 4]], np.int32)
    counts = grids.prod(-1)
    pixels = np.random.default_rng(5).standard_normal((counts.sum(), 1536)).astype(np.float32)
    image_embeds, deepstack = encode(tower, pixels, grids)
    starts = np.cumsum(counts) - counts
    for i, (start, count) in enumerate(zip(starts, counts)):
        alone_embeds, alone_deepstack = encode(tower, pixels[start:start + count], grids[i:i + 1])
        merged = slice(start // 4, (start + count) // 4)
        assert _diff(image_embeds[merged], alone_embeds) <= 1e-5, f"image {i} embeds"
        assert _diff(deepstack[:, merged], alone_deepstack) <= 1e-5, f"image {i} deepstack"


def _temp_bytes(function, *args) -> int:
    return jax.jit(function).lower(*args).compile().memory_analysis().temp_size_in_bytes


def _shapes(jaxpr) -> list[tuple[int, ...]]:
    """Shapes of every intermediate of a jaxpr, inside loops, custom VJPs and remat too."""
    found = []
    for eqn in jaxpr.eqns:
        found += [tuple(var.aval.shape) for var in eqn.outvars if hasattr(var.aval, "shape")]
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr holds its Jaxpr
                if hasattr(sub, "eqns"):
                    found += _shapes(sub)
    return found


def test_attention_memory_grows_linearly_with_images(configs, monkeypatch):
    """2 vs 8 images of 8 x 8 patches (P = 128 vs 512, blocks of 32 rows): the compiled forward pass needs ~4x the
    temporaries, where an [N, P, P] score matrix gives ~15x; and no intermediate of the forward and backward pass
    has two axes of length P."""
    config = configs["scaled_8b"]
    config = dataclasses.replace(config, vision_config=dataclasses.replace(
        config.vision_config, depth=1, deepstack_visual_indexes=(0,)))
    graphdef, state = nnx.split(nnx.eval_shape(lambda: vision.VisionModel(config, rngs=nnx.Rngs(0))))
    monkeypatch.setattr(attention_segments, "BLOCK", 32)

    def tower(state, pixels, grid):
        return nnx.merge(graphdef, state)(pixels, grid)

    def inputs(num_images):
        pixels = jax.ShapeDtypeStruct((num_images * 8 * 8, config.vision_config.patch_features), jnp.float32)
        return pixels, jax.ShapeDtypeStruct((num_images, 3), jnp.int32)

    forward_2, forward_8 = _temp_bytes(tower, state, *inputs(2)), _temp_bytes(tower, state, *inputs(8))
    assert forward_8 / forward_2 < 5, f"forward temporaries {forward_2} -> {forward_8} bytes"
    loss = lambda state, pixels, grid: jnp.sum(tower(state, pixels, grid)[0])  # noqa: E731
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(state, *inputs(8)).jaxpr
    shapes = _shapes(jaxpr)
    assert len(shapes) > 100 and (8 * 8 * 8, 1536) in shapes  # the walk reached the pixel-level gradient
    squares = [shape for shape in shapes if shape.count(8 * 8 * 8) >= 2]
    assert not squares, f"intermediates with two axes of length P: {squares[:3]}"
