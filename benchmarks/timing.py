"""Decode throughput: new tokens per second of our `Sampler` and of transformers' `generate`, on the same weights.

Shared by the benchmark scripts beside it (`decode_vs_torch.py`, `compare_torch.py`), which import it as the
sibling module `timing` (a script's own folder is first on `sys.path`); it is not part of the library because the
reference side needs torch. Both sides get the same token prompts (no padding) and generate exactly
`max_new_tokens` greedy tokens per row (no stop ids, fp32). A call of ours is end to end: a fresh session, the
prefill, the jitted decode loop and the copy of tokens and log-probs to the host. The reference call is
`Qwen3VLForConditionalGeneration.generate(do_sample=False)` under `torch.inference_mode`.

`time_interleaved` runs each side once first (our compilation, torch's warm-up; reported apart), then alternates
the sides for `repeats` rounds and takes medians, so a machine whose load drifts during the run affects both
sides alike. torch and transformers are imported only by `transformers_call`.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping

import jax
import numpy as np

from ranger_jax.models.qwen3_vl import config as config_lib
from ranger_jax.sampling import sampler as sampler_lib


def benchmark_config() -> config_lib.Qwen3VLConfig:
    """The benchmark model: text hidden 512, 8 layers, 8 heads / 4 kv, head_dim 64, SwiGLU 1536, vocab
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


def sampler_call(sampler: sampler_lib.Sampler, prompts: np.ndarray, *,
                 max_new_tokens: int) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
    """A call of greedy end-to-end generation with our sampler, returning host (token_ids, logprobs) [B, N]."""
    params = sampler_lib.SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    segments = [sampler_lib.Segment(row) for row in prompts]

    def run():  # host arrays come back, so the clock stops after the device finished
        completions = sampler.complete(segments, params)
        return np.stack([c.token_ids for c in completions]), np.stack([c.logprobs for c in completions])

    return run


def transformers_call(hf_model, prompts: np.ndarray, *, max_new_tokens: int,
                      threads: int | None = None) -> Callable[[], np.ndarray]:
    """A call of transformers' greedy `generate` on the same prompts, returning the new ids [B, N].

    Args:
        hf_model: a `Qwen3VLForConditionalGeneration` in eval mode.
        prompts: [B, T] int ids, unpadded.
        max_new_tokens: exact number of new tokens per row (eos disabled).
        threads: torch intra-op threads, set process-wide (`torch.set_num_threads`) at each call; default
            os.cpu_count().
    """
    import torch

    threads = threads or os.cpu_count() or 1
    input_ids = torch.from_numpy(np.asarray(prompts, np.int64))
    kwargs = dict(attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                  min_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)

    @torch.inference_mode()
    def run():
        torch.set_num_threads(threads)  # per call: calls with other thread counts may be interleaved
        return hf_model.generate(input_ids, **kwargs)[:, input_ids.shape[1]:].numpy()

    return run


def time_interleaved(calls: Mapping[str, Callable[[], object]], *, repeats: int = 3) -> dict[str, dict]:
    """Times each call once (first call: compile / warm-up), then `repeats` alternating rounds.

    Returns:
        {name: {"first_s", "seconds" (median of the rounds), "times" (each round), "result" (of the last call)}}.
    """
    out: dict[str, dict] = {}
    for name, call in calls.items():
        start = time.perf_counter()
        result = call()
        out[name] = {"first_s": time.perf_counter() - start, "times": [], "result": result}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            out[name]["result"] = call()
            out[name]["times"].append(time.perf_counter() - start)
    for entry in out.values():
        entry["seconds"] = statistics.median(entry["times"])
    return out


def decode_seconds(sampler: sampler_lib.Sampler, prompts: np.ndarray, *, max_new_tokens: int,
                   repeats: int = 3) -> float:
    """Median seconds of our `generate` call alone (the jitted decode loop), after a timed-apart prefill."""
    params = sampler_lib.SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    segments = [sampler_lib.Segment(row) for row in prompts]
    times = []
    for _ in range(repeats):
        session = sampler.new_session(len(segments))
        sampler.append(session, segments)
        jax.block_until_ready(session.last_logits)
        start = time.perf_counter()
        sampler.generate(session, params)  # returns host arrays: the decode has finished
        times.append(time.perf_counter() - start)
    return statistics.median(times)
