"""The decode benchmark's library side: its config, prompts, and both timed calls on a tiny checkpoint (no timing
asserts)."""

from __future__ import annotations

import numpy as np

from ranger_jax.sampling import buckets, throughput


def test_benchmark_config_is_the_issue_2_model():
    config = throughput.benchmark_config()
    t = config.text_config
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads, t.head_dim,
            t.intermediate_size, t.vocab_size) == (512, 8, 8, 4, 64, 1536, 32000)
    prompts = throughput.random_prompts(config, batch=8, length=128, seed=0)
    assert prompts.shape == (8, 128) and prompts.min() > 6 and prompts.max() < 32000


def test_interleaved_calls_generate_the_same_greedy_tokens(tiny):
    prompts = throughput.random_prompts(tiny.config, batch=2, length=9, seed=3)
    timed = throughput.time_interleaved({
        "ours": throughput.sampler_call(tiny.sampler, prompts, max_new_tokens=6),
        "torch": throughput.transformers_call(tiny.hf, prompts, max_new_tokens=6),
    }, repeats=2)
    tokens, logprobs = timed["ours"]["result"]
    assert tokens.shape == timed["torch"]["result"].shape == (2, 6)
    np.testing.assert_array_equal(tokens, timed["torch"]["result"])
    assert np.all(logprobs <= 0)
    for entry in timed.values():
        assert len(entry["times"]) == 2 and entry["seconds"] == np.median(entry["times"]) and entry["first_s"] > 0
    assert throughput.decode_seconds(tiny.sampler, prompts, max_new_tokens=6, repeats=1) > 0


def test_bucket_sizes():
    b = buckets.Buckets(min_length=16, min_patches=64)
    assert [buckets.round_up(n, 16) for n in (1, 16, 17, 100)] == [16, 16, 32, 128]
    assert b.patches(24, 2) == 64 and b.patches(68, 2) == 128 and b.patches(36, 3) == 72
    pixels, grid = buckets.pad_images(np.ones((24, 5), np.float32), np.array([[1, 4, 6]]), num_patches=64,
                                      num_images=4, merge=2)
    assert pixels.shape == (64, 5) and not pixels[24:].any()
    np.testing.assert_array_equal(grid, [[1, 4, 6], [1, 2, 20], [1, 2, 2], [1, 2, 2]])
