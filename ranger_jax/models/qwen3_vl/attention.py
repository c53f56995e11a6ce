"""Causal GQA attention kernels for the text decoder, chosen by name through `KERNELS` (`Qwen3VLConfig.attention`).

A kernel is `kernel(q, k, v, mask_info, *, scale) -> out` with
`q: [B, T, K, G, H]`, `k, v: [B, K, S, H]`, `out: [B, T, K, G, H]` in the compute dtype. Query heads are grouped
under their key/value head (head n = k * G + g, as transformers' `repeat_kv`), so k/v are never repeated.

`MaskInfo` describes the mask instead of materialising it: query t of row b sits in kv slot `query_slots[b, t]`
and may attend to slot s iff `s <= query_slots[b, t]` and `kv_valid[b, s]`. Without a cache the slots are the
token indices (S = T); with a KV cache they are cache slots, so one kernel serves prefill, decode and training, and
a blocked kernel can skip key blocks above the largest query slot of a query block.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ranger_jax.models.qwen3_vl import attention_blocked


class MaskInfo(NamedTuple):
    """Causal + key-padding mask, as slots (a pytree, so it passes through jit)."""

    query_slots: jax.Array  # [B, T] int32, kv slot of each query token
    kv_valid: jax.Array  # [B, S] bool, slots holding real tokens (False for pads and empty cache slots)


def causal_mask_info(attention_mask: jax.Array | None, batch: int, length: int) -> MaskInfo:
    """MaskInfo for a full sequence without a cache: query t sits in slot t.

    Args:
        attention_mask: [B, T] int or bool, 0 at pads (left or right); None = no pads.
        batch: B.
        length: T.
    """
    query_slots = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    if attention_mask is None:
        kv_valid = jnp.ones((batch, length), dtype=bool)
    else:
        kv_valid = jnp.asarray(attention_mask).astype(bool)
    return MaskInfo(query_slots=query_slots, kv_valid=kv_valid)


def allowed(mask_info: MaskInfo, num_slots: int) -> jax.Array:
    """[B, T, S] bool: may query t attend to slot s."""
    slots = jnp.arange(num_slots, dtype=jnp.int32)
    causal = slots[None, None, :] <= mask_info.query_slots[:, :, None]
    return causal & mask_info.kv_valid[:, None, :]


def einsum_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask_info: MaskInfo, *, scale: float) -> jax.Array:
    """Reference kernel: scores for every (query, slot) pair, masked, float32 softmax.

    Args:
        q: [B, T, K, G, H] queries, already rotated.
        k: [B, K, S, H] keys, already rotated (heads-major, the KV-cache layout).
        v: [B, K, S, H] values.
        mask_info: which slots each query may see.
        scale: multiplies q.k (head_dim ** -0.5).

    Returns:
        [B, T, K, G, H] in v's dtype. A query with no visible slot (a left pad) averages all slots instead of NaN.
    """
    # both matmuls batch over (B, K) with their operands in [rows, contracted] order, so XLA:CPU runs them as
    # plain batched GEMMs; an output in [B, T, K, G, H] order would make it compute (PV)ᵀ through a slow path
    q = q.transpose(0, 2, 3, 1, 4)  # [B, K, G, T, H]
    scores = jnp.einsum("BKGTH,BKSH->BKGTS", q, k, preferred_element_type=jnp.float32) * scale
    visible = allowed(mask_info, k.shape[2])[:, None, None, :, :]  # [B, 1, 1, T, S]
    scores = jnp.where(visible, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("BKGTS,BKSH->BKGTH", probs, v)
    return out.transpose(0, 3, 1, 2, 4)  # [B, T, K, G, H]


# "blocked" (attention_blocked.py) skips key blocks no query of a block can see and never builds [T, S] scores
KERNELS = {"einsum": einsum_attention, "blocked": attention_blocked.blocked_attention}
