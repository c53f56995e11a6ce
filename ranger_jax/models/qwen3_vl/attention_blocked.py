"""Blocked causal GQA attention that skips key blocks no query of a block can see (`Qwen3VLConfig.attention="blocked"`).

FlashAttention-2 (Dao, 2023, Algorithms 1 and 2) in plain JAX for XLA:CPU. Queries are cut into blocks of `block_q`
tokens and keys into blocks of `block_k` slots. Query block i visits key blocks `j < n_i` only, with
`n_i = max(query_slots in block i) // block_k + 1` computed at run time from the `MaskInfo`: causal training skips
the upper triangle (about half the work at T = 1024) and decoding skips the empty tail of a KV cache. Each visited
block updates an online softmax (running max m, running sum l, unnormalised output), so no [T, S] score matrix is
built, and k/v are never repeated: the G query heads of a kv head ride along as extra rows of the same matmul
(row r of a query block is token r // G, head r % G).

The backward pass is a `custom_vjp` that recomputes each visited block's probabilities from the saved log-sum-exp
(Algorithm 2): `dV += Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ∘ (dP − rowsum(dO ∘ O))`, `dQ += dS K`, `dK += dSᵀ Q`, skipping
the same blocks. Departures from the paper: blocks are visited by a `fori_loop` whose trip count is shared by the
batch (XLA needs one), and a query that sees no slot at all (a left pad) averages the slots of the blocks it visits
instead of producing NaN, like the einsum kernel's fully masked rows (finite, meaningless). Scores, softmax
statistics and accumulators are float32 whatever the compute dtype.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

BLOCK_Q = 256  # query tokens per block (times G query heads = matmul rows)
BLOCK_K = 256  # key slots per block
TRANSPOSE_KEYS_ROWS = 16  # query rows (tokens x G) of a block from which the forward pass transposes keys up front
_MASKED = float(jnp.finfo(jnp.float32).min)  # score of a slot a query may not see (as in the einsum kernel)


def _blocks(size: int, block: int) -> tuple[int, int]:
    """(block length, number of blocks) covering `size` positions; a single short block when size < block."""
    block = min(block, size)
    return block, -(-size // block)


def _pad_axis(x: jax.Array, axis: int, size: int, value: Any) -> jax.Array:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value) if size > x.shape[axis] else x


def _block_queries(x: jax.Array, block: int, count: int) -> jax.Array:
    """[B, T, K, G, X] -> [n, B, K, block*G, X], T padded with zeros to n * block."""
    batch, _, heads_kv, groups, width = x.shape
    x = _pad_axis(x, 1, block * count, 0).reshape(batch, count, block, heads_kv, groups, width)
    return x.transpose(1, 0, 3, 2, 4, 5).reshape(count, batch, heads_kv, block * groups, width)


def _unblock_queries(x: jax.Array, length: int, groups: int) -> jax.Array:
    """[n, B, K, block*G, X] -> [B, T, K, G, X]: the inverse of `_block_queries`, padding dropped."""
    count, batch, heads_kv, rows, width = x.shape
    x = x.reshape(count, batch, heads_kv, rows // groups, groups, width).transpose(1, 0, 3, 2, 4, 5)
    return x.reshape(batch, count * (rows // groups), heads_kv, groups, width)[:, :length]


def _block_slots(query_slots: jax.Array, block: int, count: int) -> jax.Array:
    """[B, T] -> [n, B, block] int32; padded queries sit in slot -1 and see nothing."""
    slots = _pad_axis(query_slots.astype(jnp.int32), 1, block * count, -1)
    return slots.reshape(slots.shape[0], count, block).transpose(1, 0, 2)


def _pad_slots(x: jax.Array, size: int) -> jax.Array:
    """[B, K, S, H] -> [B, K, S', H], slots zero-padded to `size` (a whole number of key blocks)."""
    return _pad_axis(x, 2, size, 0)


def _num_key_blocks(slots: jax.Array, block_k: int, num_blocks: int) -> jax.Array:
    """Key blocks a query block with `slots: [B, bq]` needs: up to its largest slot, at least one, at most all."""
    return jnp.clip(jnp.max(slots) // block_k + 1, 1, num_blocks)


def _block(x, j, block, axis):
    """Block j (of `block` slots) of `x` along `axis`."""
    return jax.lax.dynamic_slice_in_dim(x, j * block, block, axis=axis)


def _scores(q, k, slots, valid, start, groups, scale, *, transposed=True):
    """Masked float32 scores [B, K, bq*G, bk] of one query block against the key block starting at slot `start`.

    `k` is the key block transposed, [B, K, H, bk] (or [B, K, bk, H] with transposed=False): with both operands in
    [rows, contracted] x [contracted, cols] order XLA:CPU runs a plain batched GEMM instead of transposing the
    block on every visit.
    """
    if transposed:
        s = jnp.einsum("BKTH,BKHS->BKTS", q, k, preferred_element_type=jnp.float32) * scale
    else:
        s = jnp.einsum("BKTH,BKSH->BKTS", q, k, preferred_element_type=jnp.float32) * scale
    key_slots = start + jnp.arange(k.shape[3 if transposed else 2], dtype=jnp.int32)
    visible = (key_slots[None, None, :] <= slots[:, :, None]) & valid[:, None, :]  # [B, bq, bk]
    batch, heads_kv, rows, width = s.shape
    s = s.reshape(batch, heads_kv, rows // groups, groups, width)  # rows back to (token, head) for the mask
    return jnp.where(visible[:, None, :, None, :], s, _MASKED).reshape(batch, heads_kv, rows, width)


def _forward(q, k, v, query_slots, kv_valid, scale, block_q, block_k):
    """(out [B, T, K, G, H] in q's dtype, log-sum-exp [nq, B, K, bq*G] float32)."""
    length, groups = q.shape[1], q.shape[3]
    bq, nq = _blocks(length, block_q)
    bk, nk = _blocks(k.shape[2], block_k)
    # keys are transposed once per call when the queries are many (prefill, training); a few query rows (decoding)
    # read them in place rather than copy a whole KV cache per layer and step
    transposed = bq * groups >= TRANSPOSE_KEYS_ROWS
    keys, values = _pad_slots(k, bk * nk), _pad_slots(v, bk * nk)  # [B, K, S', H]
    keys = keys.swapaxes(2, 3) if transposed else keys
    key_axis = 3 if transposed else 2
    valid = _pad_axis(kv_valid.astype(bool), 1, bk * nk, False)

    def query_block(_, inputs):
        q_i, slots_i = inputs  # [B, K, bq*G, H], [B, bq]

        def visit(j, carry):
            m, l, acc = carry
            v_j, valid_j = _block(values, j, bk, 2), _block(valid, j, bk, 1)
            s = _scores(q_i, _block(keys, j, bk, key_axis), slots_i, valid_j, j * bk, groups, scale,
                        transposed=transposed)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p = jnp.exp(s - m_new[..., None])
            correction = jnp.exp(m - m_new)
            pv = jnp.einsum("BKTS,BKSH->BKTH", p.astype(v_j.dtype), v_j, preferred_element_type=jnp.float32)
            return m_new, l * correction + jnp.sum(p, axis=-1), acc * correction[..., None] + pv

        stats = q_i.shape[:3]
        init = (jnp.full(stats, _MASKED, jnp.float32), jnp.zeros(stats, jnp.float32),
                jnp.zeros(q_i.shape, jnp.float32))
        m, l, acc = jax.lax.fori_loop(0, _num_key_blocks(slots_i, bk, nk), visit, init)
        return None, (acc / l[..., None], m + jnp.log(l))  # l >= 1: the row's max contributes exp(0)

    inputs = (_block_queries(q, bq, nq), _block_slots(query_slots, bq, nq))
    _, (out, lse) = jax.lax.scan(query_block, None, inputs)
    return _unblock_queries(out, length, groups).astype(q.dtype), lse


def _backward(q, k, v, query_slots, kv_valid, out, lse, d_out, scale, block_q, block_k):
    """(dq, dk, dv) of `_forward`, recomputing block probabilities from the saved log-sum-exp."""
    length, groups = q.shape[1], q.shape[3]
    num_slots = k.shape[2]
    bq, nq = _blocks(length, block_q)
    bk, nk = _blocks(num_slots, block_k)
    keys = _pad_slots(k, bk * nk)  # [B, K, S', H]
    keys_t, values_t = keys.swapaxes(2, 3), _pad_slots(v, bk * nk).swapaxes(2, 3)  # [B, K, H, S']
    valid = _pad_axis(kv_valid.astype(bool), 1, bk * nk, False)
    # rowsum(dO ∘ O): the softmax Jacobian's correction term of each query row
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)  # [B, T, K, G, 1]

    def query_block(carry, inputs):
        q_i, slots_i, lse_i, do_i, delta_i = inputs
        q_i_t, do_i_t = q_i.swapaxes(2, 3), do_i.swapaxes(2, 3)  # [B, K, H, bq*G], once per query block

        def visit(j, inner):
            # every matmul in [rows, contracted] x [contracted, cols] order (see `_scores`); dK and dV are
            # accumulated transposed, [B, K, H, S'], as Qᵀ dS and dOᵀ P
            dq_i, dk_t, dv_t = inner
            start, valid_j = j * bk, _block(valid, j, bk, 1)
            p = jnp.exp(_scores(q_i, _block(keys_t, j, bk, 3), slots_i, valid_j, start, groups, scale)
                        - lse_i[..., None])
            dp = jnp.einsum("BKTH,BKHS->BKTS", do_i, _block(values_t, j, bk, 3), preferred_element_type=jnp.float32)
            ds = (p * (dp - delta_i) * scale).astype(q_i.dtype)
            dq_i = dq_i + jnp.einsum("BKTS,BKSH->BKTH", ds, _block(keys, j, bk, 2),
                                     preferred_element_type=jnp.float32)
            dk_j = jnp.einsum("BKHT,BKTS->BKHS", q_i_t, ds, preferred_element_type=jnp.float32)
            dv_j = jnp.einsum("BKHT,BKTS->BKHS", do_i_t, p.astype(do_i.dtype), preferred_element_type=jnp.float32)
            dk_t = jax.lax.dynamic_update_slice_in_dim(dk_t, _block(dk_t, j, bk, 3) + dk_j, start, 3)
            dv_t = jax.lax.dynamic_update_slice_in_dim(dv_t, _block(dv_t, j, bk, 3) + dv_j, start, 3)
            return dq_i, dk_t, dv_t

        dq_i = jnp.zeros(q_i.shape, jnp.float32)
        dq_i, dk, dv = jax.lax.fori_loop(0, _num_key_blocks(slots_i, bk, nk), visit, (dq_i, *carry))
        return (dk, dv), dq_i

    inputs = (_block_queries(q, bq, nq), _block_slots(query_slots, bq, nq), lse,
              _block_queries(d_out, bq, nq), _block_queries(delta, bq, nq))
    zeros = jnp.zeros(keys_t.shape, jnp.float32)
    (dk_t, dv_t), dq = jax.lax.scan(query_block, (zeros, zeros), inputs)
    dq = _unblock_queries(dq, length, groups).astype(q.dtype)
    dk = dk_t.swapaxes(2, 3)[:, :, :num_slots].astype(k.dtype)
    dv = dv_t.swapaxes(2, 3)[:, :, :num_slots].astype(v.dtype)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _attention(q, k, v, query_slots, kv_valid, scale, block_q, block_k):
    return _forward(q, k, v, query_slots, kv_valid, scale, block_q, block_k)[0]


def _attention_fwd(q, k, v, query_slots, kv_valid, scale, block_q, block_k):
    out, lse = _forward(q, k, v, query_slots, kv_valid, scale, block_q, block_k)
    return out, (q, k, v, query_slots, kv_valid, out, lse)


def _attention_bwd(scale, block_q, block_k, residuals, d_out):
    q, k, v, query_slots, kv_valid, out, lse = residuals
    dq, dk, dv = _backward(q, k, v, query_slots, kv_valid, out, lse, d_out, scale, block_q, block_k)
    return dq, dk, dv, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def blocked_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask_info: Any, *, scale: float,
                      block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> jax.Array:
    """Causal GQA attention over the key blocks some query of each block can see (`attention.KERNELS["blocked"]`).

    Args:
        q: [B, T, K, G, H] queries, already rotated.
        k: [B, K, S, H] keys, already rotated (heads-major, the KV-cache layout).
        v: [B, K, S, H] values.
        mask_info: `attention.MaskInfo` (query_slots [B, T], kv_valid [B, S]).
        scale: multiplies q.k (head_dim ** -0.5).
        block_q: query tokens per block (T is padded up to a multiple; a shorter T is one block).
        block_k: key slots per block (S likewise).

    Returns:
        [B, T, K, G, H] in q's dtype.
    """
    return _attention(q, k, v, mask_info.query_slots, mask_info.kv_valid, float(scale), int(block_q), int(block_k))
