"""Decode throughput: new tokens per second of our `Sampler` and of transformers' `generate`, on the same weights.

Used by `benchmarks/decode_vs_torch.py`. Both sides get the same token prompts (no padding) and generate exactly
`max_new_tokens` greedy tokens per row (no stop ids, fp32). Ours is timed end to end per call: a fresh session,
the prefill, the jitted decode loop and the copy of tokens and log-probs to the host; the first call (which
compiles) is reported apart, then the median of `repeats` calls. The reference is
`Qwen3VLForConditionalGeneration.generate(do_sample=False)` with sdpa attention and `torch.set_num_threads(cores)`,
median of `repeats` calls after one warm-up. torch and transformers are imported only by `transformers_generate`.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import jax
import numpy as np

from ranger_jax.models.qwen3_vl import config as config_lib
from ranger_jax.sampling import sampler as sampler_lib


def benchmark_config() -> config_lib.Qwen3VLConfig:
    """The issue-2 benchmark model: text hidden 512, 8 layers, 8 heads / 4 kv, head_dim 64, SwiGLU 1536, vocab
    32000, and a small vision tower (depth 2, width 128, DeepStack taps 0 and 1)."""
    text = config_lib.TextConfig(
        vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=4, head_dim=64, hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6,
        attention_bias=False, rope_theta=5_000_000.0, mrope_section=(12, 10, 10))
    vision = config_lib.VisionConfig(
        depth=2, hidden_size=128, intermediate_size=256, num_heads=2, hidden_act="gelu_pytorch_tanh", in_channels=3,
        patch_size=16, temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=512,
        num_position_embeddings=256, deepstack_visual_indexes=(0, 1))
    return config_lib.Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=5, video_token_id=6,
                                    vision_start_token_id=3, vision_end_token_id=4, tie_word_embeddings=False)


def random_prompts(config: config_lib.Qwen3VLConfig, *, batch: int, length: int, seed: int = 0) -> np.ndarray:
    """[batch, length] int32 random text ids above the vision ids (no placeholders)."""
    low = max(config.image_token_id, config.video_token_id, config.vision_start_token_id,
              config.vision_end_token_id) + 1
    return np.random.default_rng(seed).integers(low, config.text_config.vocab_size, (batch, length), np.int32)


def _median_time(run: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def time_sampler(sampler: sampler_lib.Sampler, prompts: np.ndarray, *, max_new_tokens: int,
                 repeats: int = 3) -> dict:
    """Greedy end-to-end generation with our sampler.

    Returns:
        {"compile_s": first call (compiles), "seconds": median steady call, "tokens_per_s": new tokens / s,
         "decode_seconds": median of the decode call alone, "decode_tokens_per_s", "token_ids": [B, N] of the last
         call, "logprobs": [B, N]}.
    """
    params = sampler_lib.SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    segments = [sampler_lib.Segment(row) for row in prompts]

    def run():  # returns host arrays, so the clock stops after the device finished
        return sampler.complete(segments, params)

    start = time.perf_counter()
    run()
    compile_s = time.perf_counter() - start
    seconds, completions = _median_time(run, repeats)

    def decode_only():
        session = sampler.new_session(len(segments))
        sampler.append(session, segments)
        jax.block_until_ready(session.last_logits)
        start = time.perf_counter()
        sampler.generate(session, params)  # returns host arrays: the decode has finished
        return time.perf_counter() - start

    decode_seconds = statistics.median(decode_only() for _ in range(repeats))
    new_tokens = sum(len(c.token_ids) for c in completions)
    return {
        "compile_s": compile_s,
        "seconds": seconds,
        "tokens_per_s": new_tokens / seconds,
        "decode_seconds": decode_seconds,
        "decode_tokens_per_s": new_tokens / decode_seconds,
        "token_ids": np.stack([c.token_ids for c in completions]),
        "logprobs": np.stack([c.logprobs for c in completions]),
    }


def transformers_generate(hf_model, prompts: np.ndarray, *, max_new_tokens: int, repeats: int = 3,
                          threads: int | None = None) -> dict:
    """Greedy `generate` of a transformers Qwen3-VL on the same prompts.

    Args:
        hf_model: a `Qwen3VLForConditionalGeneration` in eval mode.
        prompts: [B, T] int ids, unpadded.
        max_new_tokens: exact number of new tokens per row (eos disabled).
        repeats: timed calls after one warm-up.
        threads: torch intra-op threads (set process-wide with `torch.set_num_threads`); default os.cpu_count().

    Returns:
        {"warmup_s", "seconds", "tokens_per_s", "threads", "token_ids": [B, N]}.
    """
    import torch

    threads = threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    input_ids = torch.from_numpy(np.asarray(prompts, np.int64))
    kwargs = dict(attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                  min_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)

    @torch.inference_mode()
    def run():
        return hf_model.generate(input_ids, **kwargs)

    start = time.perf_counter()
    run()
    warmup_s = time.perf_counter() - start
    seconds, out = _median_time(run, repeats)
    new = out[:, input_ids.shape[1]:].numpy()
    return {"warmup_s": warmup_s, "seconds": seconds, "tokens_per_s": new.size / seconds, "threads": threads,
            "token_ids": new}
