"""Next-token functions against numpy references on fixed logits: top-k/top-p sets, greedy, log-probs, seeds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ranger_jax.sampling import logits

V = 40
_filter = jax.jit(logits.filter_top_k_top_p)
_choose = jax.jit(logits.choose_tokens)


def _reference_keep(row: np.ndarray, k: int, p: float) -> np.ndarray:
    """numpy: the kept ids of one row, top-k (ties with the k-th kept) then top-p over the renormalised rest."""
    order = np.argsort(-row, kind="stable")
    kept = np.ones(row.size, bool)
    if 0 < k < row.size:
        kept = row >= row[order[k - 1]]
    probs = np.where(kept, np.exp(row - row.max()), 0.0)
    probs /= probs.sum()
    ranked = probs[order]
    before = np.cumsum(ranked) - ranked
    chosen = order[(before < p) & (ranked > 0)]
    chosen = np.union1d(chosen, order[:1])
    threshold = row[chosen].min()
    return kept & (row >= threshold)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def test_top_k_top_p_match_numpy_reference():
    rng = np.random.default_rng(0)
    rows = rng.normal(0, 2, (8, V)).astype(np.float32)
    rows[7, [3, 9, 17]] = rows[7].max() + 1.0  # a three-way tie at the top
    settings = [(0, 1.0), (5, 1.0), (0, 0.5), (5, 0.8), (1, 1.0), (V + 3, 0.3), (12, 0.95), (2, 1.0)]
    top_k = np.array([k for k, _ in settings], np.int32)
    top_p = np.array([p for _, p in settings], np.float32)
    out = np.asarray(_filter(jnp.asarray(rows), top_k, top_p))
    for i, (k, p) in enumerate(settings):
        keep = _reference_keep(rows[i], k, p)
        np.testing.assert_array_equal(np.isfinite(out[i]), keep, err_msg=f"row {i}: top_k={k}, top_p={p}")
        np.testing.assert_array_equal(out[i][keep], rows[i][keep])
    assert np.isfinite(out[7]).sum() == 3  # top_k=2 keeps every id tied with the second value
    np.testing.assert_array_equal(np.asarray(jax.jit(logits.first_argmax)(rows)), rows.argmax(-1))  # ties: first
    assert np.isfinite(out[0]).all() and np.isfinite(out[4]).sum() == 1


def _choose_np(row_logits, *, suppressed=(), temperature, top_k=0, top_p=1.0, seeds, counters):
    batch = len(seeds)
    mask = np.zeros(V, bool)
    mask[list(suppressed)] = True
    return _choose(jnp.asarray(row_logits, jnp.float32), suppressed=jnp.asarray(mask),
                   temperature=jnp.full(batch, temperature, jnp.float32), top_k=jnp.full(batch, top_k, jnp.int32),
                   top_p=jnp.full(batch, top_p, jnp.float32), seeds=jnp.asarray(seeds, jnp.uint32),
                   counters=jnp.asarray(counters, jnp.int32))


def test_greedy_skips_suppressed_ids_and_reports_unscaled_logprobs():
    rng = np.random.default_rng(1)
    rows = rng.normal(0, 1, (64, V)).astype(np.float32)
    rows[:, 5] = 10.0  # a vision placeholder is the most likely id
    tokens, logprobs = _choose_np(rows, suppressed=(5, 6), temperature=0.0, seeds=[0] * 64, counters=[0] * 64)
    masked = rows.copy()
    masked[:, [5, 6]] = -np.inf
    np.testing.assert_array_equal(np.asarray(tokens), masked.argmax(-1))
    expected = np.take_along_axis(_log_softmax(rows), masked.argmax(-1)[:, None], -1)[:, 0]
    np.testing.assert_allclose(np.asarray(logprobs), expected, atol=1e-5)


def test_sampling_distribution_logprobs_and_filters():
    """4000 draws of one row (different counters): frequencies follow the filtered softmax, never leave the set,
    and every log-prob is log_softmax(logits / T) over the full vocabulary (suppressed ids included)."""
    rng = np.random.default_rng(2)
    row = rng.normal(0, 1.5, V).astype(np.float32)
    row[6] = row.max() + 2.0  # suppressed although most likely
    n, temperature, k, p = 4000, 0.7, 8, 0.9
    tokens, logprobs = _choose_np(np.tile(row, (n, 1)), suppressed=(6,), temperature=temperature, top_k=k, top_p=p,
                                  seeds=[123] * n, counters=np.arange(n))
    tokens, logprobs = np.asarray(tokens), np.asarray(logprobs)
    scaled = row / temperature
    allowed = scaled.copy()
    allowed[6] = -np.inf
    keep = _reference_keep(allowed, k, p)
    target = np.where(keep, np.exp(allowed - allowed.max()), 0.0)
    target /= target.sum()
    freq = np.bincount(tokens, minlength=V) / n
    assert set(np.unique(tokens)) <= set(np.flatnonzero(keep))
    assert np.abs(freq - target).max() < 0.03, (freq.round(3), target.round(3))
    np.testing.assert_allclose(logprobs, _log_softmax(scaled)[tokens], atol=1e-5)


def test_top_k_one_is_greedy_and_seeds_are_reproducible():
    rng = np.random.default_rng(3)
    rows = rng.normal(0, 1, (64, V)).astype(np.float32)
    greedy, _ = _choose_np(rows, temperature=0.0, seeds=np.arange(64), counters=np.zeros(64))
    top1, _ = _choose_np(rows, temperature=1.3, top_k=1, seeds=np.arange(64), counters=np.zeros(64))
    np.testing.assert_array_equal(np.asarray(top1), np.asarray(greedy))

    flat = np.zeros((64, V), np.float32)  # uniform: the draw is all randomness
    a, _ = _choose_np(flat, temperature=1.0, seeds=np.arange(64), counters=np.full(64, 7))
    b, _ = _choose_np(flat, temperature=1.0, seeds=np.arange(64), counters=np.full(64, 7))
    c, _ = _choose_np(flat, temperature=1.0, seeds=np.arange(64) + 1000, counters=np.full(64, 7))
    d, _ = _choose_np(flat, temperature=1.0, seeds=np.arange(64), counters=np.full(64, 8))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.mean(np.asarray(a) != np.asarray(c)) > 0.8 and np.mean(np.asarray(a) != np.asarray(d)) > 0.8
    # a row's draw depends only on its own seed and counter, not on its neighbours
    e, _ = _choose_np(flat, temperature=1.0, seeds=np.r_[np.arange(32), np.arange(32) + 500],
                      counters=np.full(64, 7))
    np.testing.assert_array_equal(np.asarray(e)[:32], np.asarray(a)[:32])


def test_uncertain_rows_and_argmax_where_not_drawn():
    """`uncertain` is p_max < threshold on the raw softmax (suppressed ids removed; >= 1 counts every row); rows
    told not to draw take the argmax at any temperature and report the tempered log-probability."""
    rng = np.random.default_rng(4)
    rows = rng.normal(0, 2, (6, V)).astype(np.float32)
    rows[0, 3] = 30.0  # near-certain
    rows[1, 5] = 30.0  # near-certain on a suppressed id: the rest is uncertain
    suppressed = np.zeros(V, bool)
    suppressed[5] = True
    masked = np.where(suppressed[None], -np.inf, rows.astype(np.float64))
    p_max = 1.0 / np.exp(masked - masked.max(-1, keepdims=True)).sum(-1)  # softmax of the most likely id
    for threshold in (0.05, 0.3, 0.9, 1.0):
        got = np.asarray(jax.jit(logits.uncertain)(jnp.asarray(rows), jnp.asarray(suppressed),
                                                   jnp.full(6, threshold, jnp.float32)))
        expected = (p_max < threshold) | (threshold >= 1.0)
        np.testing.assert_array_equal(got, expected, err_msg=f"threshold {threshold}")
    assert not np.asarray(logits.uncertain(jnp.asarray(rows[:1]), jnp.asarray(suppressed), jnp.full(1, 0.99)))[0]
    draw = jnp.asarray([True, False, True, False, False, True])
    tokens, logprobs = _choose(jnp.asarray(rows), suppressed=jnp.asarray(suppressed),
                               temperature=jnp.full(6, 2.0, jnp.float32), top_k=jnp.zeros(6, jnp.int32),
                               top_p=jnp.ones(6, jnp.float32), seeds=jnp.arange(6, dtype=jnp.uint32),
                               counters=jnp.zeros(6, jnp.int32), draw=draw)
    tokens = np.asarray(tokens)
    argmax = masked.argmax(-1)
    np.testing.assert_array_equal(tokens[~np.asarray(draw)], argmax[~np.asarray(draw)])
    np.testing.assert_allclose(np.asarray(logprobs), _log_softmax(rows / 2.0)[np.arange(6), tokens], atol=1e-5)
    many = [np.asarray(_choose(jnp.asarray(rows), suppressed=jnp.asarray(suppressed),
                               temperature=jnp.full(6, 2.0, jnp.float32), top_k=jnp.zeros(6, jnp.int32),
                               top_p=jnp.ones(6, jnp.float32), seeds=jnp.full(6, s, jnp.uint32),
                               counters=jnp.zeros(6, jnp.int32), draw=draw)[0]) for s in range(20)]
    assert len({int(m[2]) for m in many}) > 1 and len({int(m[3]) for m in many}) == 1  # drawn vs argmax rows
