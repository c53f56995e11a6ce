"""The Qwen3-VL vision tower: patch embed, interpolated learned positions, 2-D RoPE, blocks, DeepStack taps, merger.

Mirrors `Qwen3VLVisionModel` in transformers `modeling_qwen3_vl.py`. All images of a batch run as one sequence of
P patch rows with static shapes: per-patch metadata (image/frame segment, row, column) is computed from `grid_thw`
with array ops, attention is confined to each frame by the blocked segment kernel of `attention_segments` (each
block of patch rows visits only the key blocks of its own frames, so memory grows linearly with the number of
images), and the learned position table is bilinearly resampled per image by gathers. The whole tower is therefore
jittable with only `P` and the number of images static; `grid_thw` may be traced.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from ranger_jax.models.qwen3_vl import attention_segments, layers, rope
from ranger_jax.models.qwen3_vl import config as config_lib
from ranger_jax.parallel import rules
from ranger_jax.parallel.rules import constrain


class PatchLayout(NamedTuple):
    """Where each of the P patch rows sits (rows come in spatial-merge-block order)."""

    segment: jax.Array  # [P] int32, one id per (image, frame): attention stays inside a segment
    row: jax.Array  # [P] int32, patch row in its image
    col: jax.Array  # [P] int32, patch column in its image
    height: jax.Array  # [P] int32, patch rows of its image
    width: jax.Array  # [P] int32, patch columns of its image


def patch_layout(grid_thw: jax.Array, num_patches: int, merge: int) -> PatchLayout:
    """Decodes each patch row's image, frame, row and column from `grid_thw: [num_images, 3]`.

    Inside a frame, rows are ordered (block_row, block_col, in_row, in_col) with merge x merge blocks, the order
    of `preprocess_image` and transformers' `get_vision_position_ids`.
    """
    grid = grid_thw.astype(jnp.int32)
    frames, height, width = grid[:, 0], grid[:, 1], grid[:, 2]
    counts = frames * height * width
    ends = jnp.cumsum(counts)
    index = jnp.arange(num_patches, dtype=jnp.int32)
    image = jnp.clip(jnp.searchsorted(ends, index, side="right"), 0, grid.shape[0] - 1)
    inside = index - (ends[image] - counts[image])
    h, w = height[image], width[image]
    frame = inside // (h * w)
    within = inside % (h * w)
    blocks_w = w // merge
    row = (within // (merge * merge * blocks_w)) * merge + (within // merge) % merge
    col = ((within // (merge * merge)) % blocks_w) * merge + within % merge
    segment = (jnp.cumsum(frames) - frames)[image] + frame
    return PatchLayout(segment=segment, row=row, col=col, height=h, width=w)


def _axis_taps(index: jax.Array, size: jax.Array, side: int) -> tuple[jax.Array, jax.Array]:
    """Bilinear taps (floor, floor + 1, clamped) and weights on one axis, corners aligned (`linspace(0, side-1)`)."""
    src = index.astype(jnp.float32) * (side - 1) / jnp.maximum(size - 1, 1).astype(jnp.float32)
    floor = jnp.floor(src)
    offsets = jnp.arange(2, dtype=jnp.float32)
    taps = jnp.clip(floor[:, None] + offsets, 0, side - 1).astype(jnp.int32)  # [P, 2]
    weights = jnp.maximum(1.0 - jnp.abs(src[:, None] - floor[:, None] - offsets), 0.0)  # [P, 2]
    return taps, weights


def vision_rotary(layout: PatchLayout, vision_config: config_lib.VisionConfig) -> tuple[jax.Array, jax.Array]:
    """cos, sin: [P, head_dim] float32 of the axial 2-D RoPE: `[freq(row) | freq(col)]`, doubled."""
    inv_freq = rope.inverse_frequencies(vision_config.rope_theta, vision_config.head_dim // 2)
    freqs = jnp.concatenate([layout.row[:, None] * inv_freq, layout.col[:, None] * inv_freq], axis=-1)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


class VisionPatchEmbed(nnx.Module):
    """Conv3d with kernel = stride = (temporal, patch, patch), as a matmul over flattened patches."""

    def __init__(self, config: config_lib.Qwen3VLConfig, *, rngs: nnx.Rngs):
        v = config.vision_config
        self.proj = layers.Linear((v.patch_features,), (v.hidden_size,), ("patch_features",), ("vision_embed",),
                                  use_bias=True, std=v.initializer_range, dtype=config.compute_dtype,
                                  param_dtype=config.parameter_dtype, rngs=rngs)

    def __call__(self, pixel_values: jax.Array) -> jax.Array:
        """pixel_values: [P, I] (flatten order C, T, H, W) -> [P, C]."""
        return self.proj(pixel_values)


class VisionMLP(nnx.Module):
    """The tower blocks' MLP: fc1, activation, fc2 (`linear_fc1` / `linear_fc2` in HF)."""

    def __init__(self, config: config_lib.Qwen3VLConfig, *, rngs: nnx.Rngs):
        v = config.vision_config
        kw = dict(use_bias=True, std=v.initializer_range, dtype=config.compute_dtype,
                  param_dtype=config.parameter_dtype, rngs=rngs)
        self.act = v.hidden_act
        self.linear_fc1 = layers.Linear((v.hidden_size,), (v.intermediate_size,), ("vision_embed",), ("vision_mlp",),
                                        **kw)
        self.linear_fc2 = layers.Linear((v.intermediate_size,), (v.hidden_size,), ("vision_mlp",), ("vision_embed",),
                                        **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        """x: [P, C] -> [P, C]."""
        hidden = config_lib.ACTIVATIONS[self.act](self.linear_fc1(x))  # [P, F]
        return self.linear_fc2(constrain(hidden, "patches", "vision_mlp"))


class VisionAttention(nnx.Module):
    """Bidirectional attention confined to each image frame, fused qkv, 2-D RoPE in float32.

    Attention runs through `attention_segments.segment_attention` in blocks of `attention_segments.BLOCK` patch
    rows: no [N, P, P] score matrix is built, and gradients flow through its custom VJP.
    """

    def __init__(self, config: config_lib.Qwen3VLConfig, *, rngs: nnx.Rngs):
        v = config.vision_config
        c, n, h = v.hidden_size, v.num_heads, v.head_dim
        kw = dict(use_bias=True, std=v.initializer_range, dtype=config.compute_dtype,
                  param_dtype=config.parameter_dtype, rngs=rngs)
        self.scale = h**-0.5
        # output rows of torch's fused qkv are [q | k | v], each num_heads x head_dim
        self.qkv = layers.Linear((c,), (3, n, h), ("vision_embed",), ("qkv", "vision_heads", "head_dim"), **kw)
        self.proj = layers.Linear((n, h), (c,), ("vision_heads", "head_dim"), ("vision_embed",), **kw)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, segment: jax.Array) -> jax.Array:
        """x: [P, C], cos/sin: [P, H] float32, segment: [P] (rows of a segment contiguous) -> [P, C]."""
        qkv = self.qkv(x)  # [P, 3, N, H]
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        cos, sin = cos[:, None, :], sin[:, None, :]
        q = rope.apply_rotary(q.astype(jnp.float32), cos, sin).astype(x.dtype)
        k = rope.apply_rotary(k.astype(jnp.float32), cos, sin).astype(x.dtype)
        q = constrain(q, "patches", "vision_heads", "head_dim")
        out = attention_segments.segment_attention(q, k, v, segment, scale=self.scale,
                                                   block=attention_segments.BLOCK)  # [P, N, H]
        return self.proj(constrain(out, "patches", "vision_heads", "head_dim"))


class VisionBlock(nnx.Module):
    """Pre-norm block: `x += attn(LN1(x))`, `x += mlp(LN2(x))`."""

    def __init__(self, config: config_lib.Qwen3VLConfig, *, rngs: nnx.Rngs):
        v = config.vision_config
        norm = dict(eps=1e-6, param_dtype=config.parameter_dtype)
        self.norm1 = layers.LayerNorm(v.hidden_size, ("vision_embed",), **norm)
        self.norm2 = layers.LayerNorm(v.hidden_size, ("vision_embed",), **norm)
        self.attn = VisionAttention(config, rngs=rngs)
        self.mlp = VisionMLP(config, rngs=rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, segment: jax.Array) -> jax.Array:
        """x: [P, C] -> [P, C]."""
        with jax.named_scope("vision_attention"):
            x = constrain(x + self.attn(self.norm1(x), cos, sin, segment), "patches", "vision_embed")
        with jax.named_scope("vision_mlp"):
            x = constrain(x + self.mlp(self.norm2(x)), "patches", "vision_embed")
        return x


class VisionPatchMerger(nnx.Module):
    """Concatenates each merge x merge block of patches and projects it to the LM width with an exact-GELU MLP.

    `use_postshuffle_norm=False` (final merger): LayerNorm over C per patch, then concatenate.
    `use_postshuffle_norm=True` (DeepStack mergers): concatenate, then LayerNorm over merge**2 * C.
    """

    def __init__(self, config: config_lib.Qwen3VLConfig, *, use_postshuffle_norm: bool, rngs: nnx.Rngs):
        v = config.vision_config
        merged = v.merged_size
        self.use_postshuffle_norm = use_postshuffle_norm
        self.merged_size = merged
        if use_postshuffle_norm:
            self.norm = layers.LayerNorm(merged, ("vision_merged",), eps=1e-6, param_dtype=config.parameter_dtype)
        else:
            self.norm = layers.LayerNorm(v.hidden_size, ("vision_embed",), eps=1e-6,
                                         param_dtype=config.parameter_dtype)
        kw = dict(use_bias=True, std=v.initializer_range, dtype=config.compute_dtype,
                  param_dtype=config.parameter_dtype, rngs=rngs)
        self.linear_fc1 = layers.Linear((merged,), (merged,), ("vision_merged",), ("vision_mlp",), **kw)
        self.linear_fc2 = layers.Linear((merged,), (v.out_hidden_size,), ("vision_mlp",), ("embed",), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        """x: [P, C] -> [M, D] with M = P / merge**2."""
        if self.use_postshuffle_norm:
            x = self.norm(x.reshape(-1, self.merged_size))
        else:
            x = self.norm(x).reshape(-1, self.merged_size)
        x = constrain(x, "patches", "vision_merged")
        hidden = jax.nn.gelu(self.linear_fc1(x), approximate=False)
        return self.linear_fc2(constrain(hidden, "patches", "vision_mlp"))


def _run_block(block: VisionBlock, x, cos, sin, segment):
    return block(x, cos, sin, segment)


class VisionModel(nnx.Module):
    """The whole tower: `(pixel_values, grid_thw) -> (image_embeds, deepstack)`."""

    def __init__(self, config: config_lib.Qwen3VLConfig, *, rngs: nnx.Rngs):
        v = config.vision_config
        self.config = config
        self.num_grid_per_side = math.isqrt(v.num_position_embeddings)
        self.patch_embed = VisionPatchEmbed(config, rngs=rngs)
        self.pos_embed = layers.Embedding(v.num_position_embeddings, v.hidden_size, ("vision_pos", "vision_embed"),
                                          std=v.initializer_range, dtype=jnp.float32,
                                          param_dtype=config.parameter_dtype, rngs=rngs)
        self.blocks = nnx.List([VisionBlock(config, rngs=rngs) for _ in range(v.depth)])
        self.merger = VisionPatchMerger(config, use_postshuffle_norm=False, rngs=rngs)
        self.deepstack_merger_list = nnx.List([VisionPatchMerger(config, use_postshuffle_norm=True, rngs=rngs)
                                               for _ in v.deepstack_visual_indexes])

    def position_embeddings(self, layout: PatchLayout) -> jax.Array:
        """[P, C] float32: the learned side x side table bilinearly resampled to each image's (h, w) grid."""
        side = self.num_grid_per_side
        h_taps, h_weights = _axis_taps(layout.row, layout.height, side)
        w_taps, w_weights = _axis_taps(layout.col, layout.width, side)
        index = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)  # [P, 4]
        weight = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4)  # [P, 4]
        return jnp.sum(self.pos_embed(index) * weight[:, :, None], axis=1)

    def __call__(self, pixel_values: jax.Array, grid_thw: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Encodes all images of a batch.

        Args:
            pixel_values: [P, I] patch rows of all images in order (`preprocess_image` layout).
            grid_thw: [num_images, 3] int (t, h, w) in patches; sum of t * h * w = P.

        Returns:
            image_embeds: [M, D] with M = P / spatial_merge_size**2, one row per image placeholder token.
            deepstack: [L_ds, M, D], the DeepStack features in block order.
        """
        v = self.config.vision_config
        dtype = self.config.compute_dtype
        with rules.use_rules(self.config.sharding_rules):
            layout = patch_layout(grid_thw, pixel_values.shape[0], v.spatial_merge_size)
            cos, sin = vision_rotary(layout, v)
            with jax.named_scope("patch_embed"):
                x = self.patch_embed(pixel_values)
                x = constrain(x + self.position_embeddings(layout).astype(dtype), "patches", "vision_embed")
            policy = config_lib.REMAT_POLICIES[self.config.remat]
            run = _run_block if self.config.remat == "none" else nnx.remat(_run_block, policy=policy)
            taps = v.deepstack_visual_indexes
            deepstack = []
            for i, block in enumerate(self.blocks):
                x = run(block, x, cos, sin, layout.segment)
                if i in taps:
                    with jax.named_scope("deepstack_merger"):
                        deepstack.append(self.deepstack_merger_list[taps.index(i)](x))
            with jax.named_scope("merger"):
                image_embeds = self.merger(x)
        if deepstack:
            return image_embeds, jnp.stack(deepstack)
        return image_embeds, jnp.zeros((0, *image_embeds.shape), image_embeds.dtype)
