"""Model FLOPs: the formula of `flops.text_flops` worked out by hand for the tiny config, and `mfu`."""

from __future__ import annotations

import pytest

from ranger_jax.models.qwen3_vl import Qwen3VLConfig, flops


def test_text_flops_by_hand_for_the_tiny_config():
    t = Qwen3VLConfig.tiny().text_config  # D 32, N 4, K 2, H 8, F 64, V 256, 2 layers
    assert (t.hidden_size, t.num_attention_heads, t.num_key_value_heads, t.head_dim) == (32, 4, 2, 8)
    weights = 2 * (32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64) + 32 * 256  # q, k+v, o, mlp; head
    attention = 2 * 4 * 4 * 8 * 3 * (10 * 11 / 2)  # layers * 4 N H * B * T(T+1)/2 with B 3, T 10
    forward = 2 * 3 * 10 * weights + attention
    assert flops.text_flops(t, batch=3, length=10, backward=False) == forward
    assert flops.text_flops(t, batch=3, length=10) == 3 * forward


def test_mfu_is_a_fraction_of_the_peak_and_rejects_nonpositive_inputs():
    assert flops.mfu(2e9, 0.5, 8e9) == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"mfu needs positive seconds and peak, got seconds=0, peak=1"):
        flops.mfu(1.0, 0, 1)
