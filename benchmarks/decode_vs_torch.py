"""New tokens/s of our KV-cache sampler vs transformers' `generate` (sdpa, greedy, fp32), same weights, one process.

    python benchmarks/decode_vs_torch.py [--batch 8] [--prompt 128] [--new 128] [--repeats 3] [--json OUT]

Model: `ranger_jax.sampling.throughput.benchmark_config()` (the issue-2 config: text hidden 512, 8 layers,
8 heads / 4 kv, head_dim 64, SwiGLU 1536, vocab 32000, small vision tower), randomly initialised by transformers,
saved, and loaded by our `load`. Timing method: `ranger_jax.sampling.throughput`. Goal: decode_speedup >= 3.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np

from ranger_jax.clients.cache import write_atomic
from ranger_jax.models import qwen3_vl
from ranger_jax.sampling import sampler as sampler_lib
from ranger_jax.sampling import throughput

TARGET_SPEEDUP = 3.0


def compare_decode(*, batch: int = 8, prompt_len: int = 128, max_new_tokens: int = 128, repeats: int = 3,
                   seed: int = 0, threads: int | None = None) -> dict:
    """Times both sides and returns the figures (see the module docstring).

    Returns:
        {"decode_speedup": ours / reference end-to-end new tokens/s, "ours_tokens_per_s", "torch_tokens_per_s",
         "ours_decode_only_tokens_per_s", "ours_compile_s", "ours_seconds", "torch_seconds", "torch_threads",
         "greedy_tokens_match": fraction of equal greedy tokens, "batch", "prompt_len", "max_new_tokens"}.
    """
    import torch
    import transformers

    config = throughput.benchmark_config()
    torch.manual_seed(seed)
    hf_config = transformers.Qwen3VLConfig(**config.to_hf())
    hf_config._attn_implementation = "sdpa"
    hf_model = transformers.Qwen3VLForConditionalGeneration(hf_config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp)
        model = qwen3_vl.load(tmp, sharding_rules="sample")
    prompts = throughput.random_prompts(config, batch=batch, length=prompt_len, seed=seed)
    ours = throughput.time_sampler(sampler_lib.Sampler(model), prompts, max_new_tokens=max_new_tokens,
                                   repeats=repeats)
    ref = throughput.transformers_generate(hf_model, prompts, max_new_tokens=max_new_tokens, repeats=repeats,
                                           threads=threads)
    return {
        "decode_speedup": ours["tokens_per_s"] / ref["tokens_per_s"],
        "ours_tokens_per_s": ours["tokens_per_s"],
        "torch_tokens_per_s": ref["tokens_per_s"],
        "ours_decode_only_tokens_per_s": ours["decode_tokens_per_s"],
        "ours_compile_s": ours["compile_s"],
        "ours_seconds": ours["seconds"],
        "torch_seconds": ref["seconds"],
        "torch_threads": ref["threads"],
        "greedy_tokens_match": float(np.mean(ours["token_ids"] == ref["token_ids"])),
        "batch": batch,
        "prompt_len": prompt_len,
        "max_new_tokens": max_new_tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--json", help="write the figures to this JSON file")
    args = parser.parse_args()
    result = compare_decode(batch=args.batch, prompt_len=args.prompt, max_new_tokens=args.new,
                            repeats=args.repeats, seed=args.seed, threads=args.threads)
    print(f"decode, batch {args.batch}, prompt {args.prompt}, {args.new} new tokens (greedy, fp32)")
    print(f"{'':24}{'ours':>12}{'transformers':>14}{'ratio':>8}")
    print(f"{'new tokens/s':24}{result['ours_tokens_per_s']:12.1f}{result['torch_tokens_per_s']:14.1f}"
          f"{result['decode_speedup']:8.2f}")
    print(f"{'seconds per call':24}{result['ours_seconds']:12.3f}{result['torch_seconds']:14.3f}")
    print(f"ours: compile + first call {result['ours_compile_s']:.1f} s, decode loop alone "
          f"{result['ours_decode_only_tokens_per_s']:.1f} tok/s; greedy tokens equal: "
          f"{result['greedy_tokens_match']:.1%}; goal decode_speedup >= {TARGET_SPEEDUP}")
    if args.json:
        write_atomic(args.json, json.dumps(result, indent=2).encode("utf-8"))


if __name__ == "__main__":
    main()
