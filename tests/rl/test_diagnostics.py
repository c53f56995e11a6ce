"""Gradient agreement and noise scale: statistics checked on gradients with a known signal and noise."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ranger_jax.rl import diagnostics


def noisy_gradients(rng, k, signal, noise_std, dim=20_000):
    direction = rng.standard_normal(dim)
    g = signal * direction / np.linalg.norm(direction)
    return g, [g + noise_std * rng.standard_normal(dim) for _ in range(k)]


def test_signal_and_noise_are_recovered():
    rng = np.random.default_rng(0)
    g, grads = noisy_gradients(rng, 40, signal=1.0, noise_std=0.01)  # tr Σ_b = 20000 · 1e-4 = 2
    out = diagnostics.gradient_agreement(grads, batch_rows=16)
    assert out.num_batches == 40 and out.batch_rows == 16
    assert out.noise_norm_sq == pytest.approx(2.0, rel=0.02)
    assert out.signal_norm_sq == pytest.approx(1.0, abs=0.05)
    assert out.noise_scale == pytest.approx(16 * 2.0 / 1.0, rel=0.06)
    # pairs of batch gradients: |G|² / (|G|² + tr Σ_b) = 1/3; the halves (20 each): 1 / (1 + 2/20) = 0.91
    assert out.mean_pairwise_cosine == pytest.approx(1 / 3, abs=0.02)
    assert out.half_cosine == pytest.approx(1 / 1.1, abs=0.02)
    assert out.mean_gradient_norm == pytest.approx(math.sqrt(3.0), rel=0.02)


def test_pure_noise_has_no_measurable_signal_and_identical_gradients_no_noise():
    rng = np.random.default_rng(1)
    noise = [rng.standard_normal(5000) for _ in range(8)]
    out = diagnostics.gradient_agreement(noise, batch_rows=4)
    assert abs(out.mean_pairwise_cosine) < 0.02 and abs(out.half_cosine) < 0.05
    if out.signal_norm_sq <= 0:
        assert math.isinf(out.noise_scale) and out.as_dict()["noise_scale"] is None
    else:  # a chance positive estimate still says "far more rows than measured"
        assert out.noise_scale > 4 * 8
    same = [np.ones(10)] * 4
    exact = diagnostics.gradient_agreement(same, batch_rows=2)
    assert exact.noise_norm_sq == 0 and exact.noise_scale == 0 and exact.half_cosine == pytest.approx(1.0)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="at least 4 batch gradients"):
        diagnostics.gradient_agreement([np.ones(3)] * 3, batch_rows=1)
    with pytest.raises(ValueError, match=r"different lengths: \[2, 3\]"):
        diagnostics.gradient_agreement([np.ones(3)] * 3 + [np.ones(2)], batch_rows=1)
    with pytest.raises(ValueError, match="non-finite"):
        diagnostics.gradient_agreement([np.ones(3)] * 3 + [np.array([1.0, np.nan, 0.0])], batch_rows=1)
    with pytest.raises(ValueError, match="batch_rows must be a positive int; got 0"):
        diagnostics.gradient_agreement([np.ones(3)] * 4, batch_rows=0)


def test_length_buckets_hold_the_longest_row():
    assert diagnostics.length_buckets([100, 900], headroom=200) == (512, 1024, 2048)
    assert diagnostics.length_buckets([], headroom=0) == (512,)
