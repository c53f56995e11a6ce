"""Bidirectional attention confined to contiguous segments, blocked: the vision tower's kernel (one segment per frame).

The P patch rows of all images of a batch form one sequence in which each image frame owns a contiguous run of rows,
and a row may attend exactly to the rows of its own run. A dense [N, P, P] score matrix masked block-diagonally
costs memory quadratic in the number of images: for 16 images of 624 patches in the 8B tower, 6.3 GB of
temporaries per layer forward and 20 GB forward + backward, against 0.42 GB and 1.8 GB here. Rows are cut into
blocks of `block` rows and query block i visits only the key blocks its runs touch: key blocks
`first_i .. first_i + count_i - 1`, where `first_i` holds the first row of the run of the block's first row and the
last visited block holds the last row of the run of its last row. Run boundaries come from the segment ids at run
time, so image sizes may be traced (`image_grid_thw` inside a jit) while every shape stays static.

All query blocks advance together (one batched matmul per step, so the query blocks may stay sharded like the
patches): step t gathers key block `first_i + t` for every block i and updates an online softmax (running max m,
running sum l, unnormalised output), FlashAttention-2 style (Dao, 2023, Algorithm 1). The trip count is the largest
`count_i`, about `largest image / block + 1`; a block past its own range is fully masked. Temporaries are
[P / block, N, block, block] per step, i.e. O(P x N x block), linear in the number of images. In einsum strings
the leading B counts blocks (they play the batch), T and S are rows of a query and a key block.

The backward pass is a `custom_vjp` that recomputes probabilities from the saved log-sum-exp (Algorithm 2) in two
passes that need no scatter: query blocks visit their key blocks for dQ, and key blocks visit their query blocks
for dK and dV (the visiting ranges are the same, attention being symmetric within a run). Scores, softmax
statistics and accumulators are float32 whatever the compute dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

BLOCK = 128  # rows per block (query and key blocks alike)
_MASKED = float(jnp.finfo(jnp.float32).min)  # score of a key a query may not see


def _blocks(size: int, block: int) -> tuple[int, int]:
    """(block length, number of blocks) covering `size` rows; a single short block when size < block."""
    block = min(block, size)
    return block, -(-size // block)


def _runs(segment: jax.Array, size: int) -> jax.Array:
    """[size] int32 run number of each row: contiguous rows of equal segment id share a run, numbered 0, 1, ...;
    rows past the end of `segment` (block padding) form one extra run of their own."""
    segment = segment.astype(jnp.int32)
    change = jnp.concatenate([jnp.ones((1,), bool), segment[1:] != segment[:-1]])
    if size > segment.shape[0]:
        change = jnp.concatenate([change, jnp.arange(size - segment.shape[0]) == 0])
    return jnp.cumsum(change.astype(jnp.int32)) - 1


def _visit_ranges(run: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
    """(first, count): [n] int32 first block and number of blocks holding the runs of each block's rows."""
    lo = jnp.searchsorted(run, run[::block], side="left")  # first row of the run of each block's first row
    hi = jnp.searchsorted(run, run[block - 1::block], side="right")  # one past the run of each block's last row
    first = (lo // block).astype(jnp.int32)
    return first, ((hi - 1) // block).astype(jnp.int32) - first + 1


def _to_blocks(x: jax.Array, block: int, count: int) -> jax.Array:
    """[P, N, X] -> [n, N, block, X], rows zero-padded to n * block."""
    rows, heads, width = x.shape
    x = jnp.pad(x, ((0, block * count - rows), (0, 0), (0, 0)))
    return x.reshape(count, block, heads, width).transpose(0, 2, 1, 3)


def _from_blocks(x: jax.Array, rows: int) -> jax.Array:
    """[n, N, block, X] -> [P, N, X]: the inverse of `_to_blocks`, padding dropped."""
    count, heads, block, width = x.shape
    return x.transpose(0, 2, 1, 3).reshape(count * block, heads, width)[:rows]


def _visible(run_blocks: jax.Array, visited: jax.Array, t: jax.Array, count: jax.Array) -> jax.Array:
    """[n, 1, block, block] bool: row r of block i sees row c of its step-t block `visited[i]` (same run, in range)."""
    same = run_blocks[:, :, None] == run_blocks[visited][:, None, :]
    return (same & (t < count)[:, None, None])[:, None]


class _Layout:
    """Static block geometry and the run-time visiting ranges shared by the forward and backward passes."""

    def __init__(self, segment: jax.Array, rows: int, block: int):
        self.rows = rows
        self.block, self.count = _blocks(rows, block)
        run = _runs(segment, self.block * self.count)
        self.run_blocks = run.reshape(self.count, self.block)  # [n, block]
        self.first, self.span = _visit_ranges(run, self.block)  # [n], [n]
        self.trips = jnp.max(self.span)

    def visited(self, t: jax.Array) -> jax.Array:
        """[n] int32: the block each block visits at step t (clamped; steps past a block's range are masked)."""
        return jnp.minimum(self.first + t, self.count - 1)

    def visible(self, t: jax.Array) -> jax.Array:
        return _visible(self.run_blocks, self.visited(t), t, self.span)


def _loop(layout: _Layout, body, init):
    """`fori_loop(0, trips, body, init)`; a single block is one static step (no loop to compile or run)."""
    if layout.count == 1:
        return body(jnp.int32(0), init)
    return jax.lax.fori_loop(0, layout.trips, body, init)


def _scores(q, k_t, visible, scale):
    """Masked float32 scores [n, N, block, block] of q [n, N, block, H] against transposed keys [n, N, H, block]."""
    s = jnp.einsum("BNTH,BNHS->BNTS", q, k_t, preferred_element_type=jnp.float32) * scale
    return jnp.where(visible, s, _MASKED)


def _forward(q, k, v, segment, scale, block):
    """(out [P, N, H] in q's dtype, log-sum-exp [n, N, block] float32)."""
    layout = _Layout(segment, q.shape[0], block)
    bq, nq = layout.block, layout.count
    q_b = _to_blocks(q, bq, nq)  # [n, N, block, H]
    k_t = _to_blocks(k, bq, nq).swapaxes(2, 3)  # [n, N, H, block]
    v_b = _to_blocks(v, bq, nq)

    def visit(t, carry):
        m, l, acc = carry
        j = layout.visited(t)
        s = _scores(q_b, k_t[j], layout.visible(t), scale)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[..., None])
        correction = jnp.exp(m - m_new)
        pv = jnp.einsum("BNTS,BNSH->BNTH", p.astype(v.dtype), v_b[j], preferred_element_type=jnp.float32)
        return m_new, l * correction + jnp.sum(p, axis=-1), acc * correction[..., None] + pv

    stats = q_b.shape[:3]
    init = (jnp.full(stats, _MASKED, jnp.float32), jnp.zeros(stats, jnp.float32), jnp.zeros(q_b.shape, jnp.float32))
    # every row sees at least itself, so l >= 1 and fully masked early blocks are wiped by the correction
    m, l, acc = _loop(layout, visit, init)
    out = _from_blocks(acc / l[..., None], layout.rows).astype(q.dtype)
    return out, m + jnp.log(l)


def _backward(q, k, v, segment, out, lse, d_out, scale, block):
    """(dq, dk, dv) of `_forward`: a dQ pass over query blocks and a dK/dV pass over key blocks."""
    layout = _Layout(segment, q.shape[0], block)
    bq, nq = layout.block, layout.count
    q_b, k_b, v_b, do_b = (_to_blocks(x, bq, nq) for x in (q, k, v, d_out))  # [n, N, block, H]
    q_t, k_t, v_t, do_t = (x.swapaxes(2, 3) for x in (q_b, k_b, v_b, do_b))  # [n, N, H, block]
    # rowsum(dO ∘ O): the softmax Jacobian's correction term of each query row
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)  # [P, N, 1]
    delta = _to_blocks(delta, bq, nq)[..., 0]  # [n, N, block]

    def visit_keys(t, dq):
        j = layout.visited(t)
        p = jnp.exp(_scores(q_b, k_t[j], layout.visible(t), scale) - lse[..., None])  # [n, N, T, S]
        dp = jnp.einsum("BNTH,BNHS->BNTS", do_b, v_t[j], preferred_element_type=jnp.float32)
        ds = (p * (dp - delta[..., None]) * scale).astype(q.dtype)
        return dq + jnp.einsum("BNTS,BNSH->BNTH", ds, k_b[j], preferred_element_type=jnp.float32)

    def visit_queries(t, carry):
        # block i holds keys now; rows S of block i against queries T of its step-t block j, transposed scores
        dk, dv = carry
        j = layout.visited(t)
        p = jnp.exp(_scores(k_b, q_t[j], layout.visible(t), scale) - lse[j][:, :, None, :])  # [n, N, S, T]
        dv = dv + jnp.einsum("BNST,BNTH->BNSH", p.astype(d_out.dtype), do_b[j], preferred_element_type=jnp.float32)
        dp = jnp.einsum("BNSH,BNHT->BNST", v_b, do_t[j], preferred_element_type=jnp.float32)
        ds = (p * (dp - delta[j][:, :, None, :]) * scale).astype(q.dtype)
        return dk + jnp.einsum("BNST,BNTH->BNSH", ds, q_b[j], preferred_element_type=jnp.float32), dv

    zeros = jnp.zeros(q_b.shape, jnp.float32)
    dq = _loop(layout, visit_keys, zeros)
    dk, dv = _loop(layout, visit_queries, (zeros, zeros))
    return (_from_blocks(dq, layout.rows).astype(q.dtype), _from_blocks(dk, layout.rows).astype(k.dtype),
            _from_blocks(dv, layout.rows).astype(v.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attention(q, k, v, segment, scale, block):
    return _forward(q, k, v, segment, scale, block)[0]


def _attention_fwd(q, k, v, segment, scale, block):
    out, lse = _forward(q, k, v, segment, scale, block)
    return out, (q, k, v, segment, out, lse)


def _attention_bwd(scale, block, residuals, d_out):
    q, k, v, segment, out, lse = residuals
    return (*_backward(q, k, v, segment, out, lse, d_out, scale, block), None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def segment_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment: jax.Array, *, scale: float,
                      block: int = BLOCK) -> jax.Array:
    """Bidirectional attention of each row to the rows of its own segment, in blocks (memory linear in P).

    Args:
        q: [P, N, H] queries, already rotated.
        k: [P, N, H] keys, already rotated.
        v: [P, N, H] values.
        segment: [P] int, one id per row; the rows of a segment must be contiguous (a row attends to the
            contiguous run of equal ids around it).
        scale: multiplies q.k (head_dim ** -0.5).
        block: rows per query and key block (P is padded up to a multiple; a shorter P is one block).

    Returns:
        [P, N, H] in q's dtype.
    """
    return _attention(q, k, v, segment, float(scale), int(block))


def einsum_segment_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment: jax.Array, *,
                             scale: float) -> jax.Array:
    """Reference kernel: the full [N, P, P] score matrix masked to equal segment ids, float32 softmax.

    Same arguments and result as `segment_attention` (for contiguous segments); memory quadratic in P, so only
    for checks on small inputs.
    """
    scores = jnp.einsum("TNH,SNH->NTS", q, k, preferred_element_type=jnp.float32) * scale
    same = segment[:, None] == segment[None, :]  # [T, S]
    probs = jax.nn.softmax(jnp.where(same[None], scores, _MASKED), axis=-1).astype(v.dtype)
    return jnp.einsum("NTS,SNH->TNH", probs, v).astype(q.dtype)
