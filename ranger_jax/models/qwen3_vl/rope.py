"""Interleaved multimodal RoPE (MRoPE) of the Qwen3-VL text decoder, and `get_rope_index`, its 3-D positions.

Everything here is a pure, jittable function of arrays with static shapes; nothing is cached on a module (unlike
`self.rope_deltas` in transformers). Reference: `Qwen3VLTextRotaryEmbedding` and `Qwen3VLModel.get_rope_index` in
transformers `modeling_qwen3_vl.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ranger_jax.models.qwen3_vl import config as config_lib


def inverse_frequencies(theta: float, dim: int) -> jax.Array:
    """[dim / 2] float32 `1 / theta ** (arange(0, dim, 2) / dim)`."""
    exponents = jnp.arange(0, dim, 2, dtype=jnp.float32) / dim
    return 1.0 / (jnp.float32(theta) ** exponents)


def rotate_half(x: jax.Array) -> jax.Array:
    """`[-x2, x1]` for `x = [x1, x2]` split in halves on the last axis (not pairwise)."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """`x * cos + rotate_half(x) * sin`; cos/sin broadcast against x."""
    return x * cos + rotate_half(x) * sin


def mrope_cos_sin(positions: jax.Array, text_config: config_lib.TextConfig,
                  dtype: jnp.dtype) -> tuple[jax.Array, jax.Array]:
    """cos and sin of interleaved MRoPE.

    Args:
        positions: [3, B, T] int32, rows (t, h, w); equal rows give plain 1-D RoPE.
        text_config: supplies head_dim, rope_theta and mrope_section.
        dtype: the activation dtype cos/sin are cast to (computed in float32).

    Returns:
        cos, sin: [B, T, H] each. Frequency slot j takes its angle from the axis
        `config.interleaved_mrope_axes(mrope_section)[j]` (THWTHW…TT), then the H/2 slots are doubled.
    """
    inv_freq = inverse_frequencies(text_config.rope_theta, text_config.head_dim)
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [3, B, T, H/2]
    axes = np.asarray(config_lib.interleaved_mrope_axes(text_config.mrope_section, text_config.head_dim // 2))
    freqs = jnp.where(axes == 0, freqs[0], jnp.where(axes == 1, freqs[1], freqs[2]))  # [B, T, H/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)  # [B, T, H]
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def get_rope_index(input_ids: jax.Array, image_grid_thw: jax.Array | None = None,
                   attention_mask: jax.Array | None = None, *, image_token_id: int,
                   spatial_merge_size: int) -> tuple[jax.Array, jax.Array]:
    """3-D MRoPE positions of a padded batch, for any number of images per sequence.

    Per sequence, over attended tokens only: a text token takes the next position on all three rows; an image
    with patch grid (t, h, w) gets `(start + t_idx, start + h_idx, start + w_idx)` over its `t * h/m * w/m`
    placeholder tokens in row-major order, and the next start is `start + max(h/m, w/m)` (not the token count).
    Pads get 0. Images are consumed from `image_grid_thw` in order of appearance over the whole batch, as in
    transformers (each image's placeholders must be contiguous; `Qwen3VL` checks that at its boundary).

    Args:
        input_ids: [B, T] int, images expanded to their placeholder tokens.
        image_grid_thw: [num_images, 3] int (t, h, w in patches), or None for text only.
        attention_mask: [B, T], 0 at pads (left or right); None = all attended.
        image_token_id: the placeholder id (`<|image_pad|>`).
        spatial_merge_size: m, patches per merged token along each side.

    Returns:
        positions: [3, B, T] int32.
        rope_deltas: [B] int32, `max position + 1 - number of attended tokens`; a token decoded after `n` attended
            tokens of its row sits at position `n + rope_delta` on all three rows.
    """
    batch, length = input_ids.shape
    mask = (jnp.ones((batch, length), bool) if attention_mask is None
            else jnp.asarray(attention_mask).astype(bool))
    if image_grid_thw is None or image_grid_thw.shape[0] == 0:
        is_image = jnp.zeros((batch, length), bool)
    else:
        is_image = (input_ids == image_token_id) & mask
    step = (mask & ~is_image).astype(jnp.int32)  # a text token advances the position by one
    t_pos = h_pos = w_pos = jnp.cumsum(step, axis=1) - 1

    if image_grid_thw is not None and image_grid_thw.shape[0] > 0:
        grid = jnp.asarray(image_grid_thw).astype(jnp.int32)
        grid_t, grid_h, grid_w = grid[:, 0], grid[:, 1] // spatial_merge_size, grid[:, 2] // spatial_merge_size
        tokens = grid_t * grid_h * grid_w  # [num_images]
        ends = jnp.cumsum(tokens)
        ordinal = (jnp.cumsum(is_image.reshape(-1)) - 1).reshape(batch, length)  # index among all image tokens
        image = jnp.clip(jnp.searchsorted(ends, ordinal, side="right"), 0, grid.shape[0] - 1)
        k = ordinal - (ends[image] - tokens[image])  # index inside its image
        height, width = grid_h[image], grid_w[image]
        advance = jnp.maximum(height, width)
        step = step + jnp.where(is_image & (k == 0), advance, 0)  # an image advances by max(h/m, w/m), at its start
        inclusive = jnp.cumsum(step, axis=1)
        text = inclusive - 1
        start = inclusive - advance  # only an image's first token advanced, so this is its start
        t_pos = jnp.where(is_image, start + k // (height * width), text)
        h_pos = jnp.where(is_image, start + (k // width) % height, text)
        w_pos = jnp.where(is_image, start + k % width, text)

    positions = jnp.stack([t_pos, h_pos, w_pos]).astype(jnp.int32)
    positions = jnp.where(mask[None], positions, 0)
    highest = jnp.max(jnp.where(mask[None], positions, -1), axis=(0, 2))
    rope_deltas = (highest + 1 - jnp.sum(mask, axis=1)).astype(jnp.int32)
    return positions, rope_deltas
