"""New tokens/s of our KV-cache sampler vs transformers' `generate` (sdpa, greedy, fp32), same weights, one process.

    python benchmarks/decode_vs_torch.py [--batch 8] [--prompt 128] [--new 128] [--repeats 3] [--json OUT]

Model: `timing.benchmark_config()` (benchmarks/timing.py: text hidden 512, 8 layers,
8 heads / 4 kv, head_dim 64, SwiGLU 1536, vocab 32000, small vision tower), randomly initialised by transformers,
saved, and loaded by our `load`. Timing method (calls interleaved, medians, compile apart):
benchmarks/timing.py. The 1-minute load average at the end is recorded: on a shared machine torch's
threads suffer more from other processes than ours. Goal: decode_speedup >= 3.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np

import timing  # benchmarks/timing.py, beside this script
from ranger_jax import fileio
from ranger_jax.models import qwen3_vl
from ranger_jax.sampling import sampler as sampler_lib

TARGET_SPEEDUP = 3.0


def compare_decode(*, batch: int = 8, prompt_len: int = 128, max_new_tokens: int = 128, repeats: int = 3,
                   seed: int = 0, threads: int | None = None, single_thread_reference: bool = True) -> dict:
    """Times both sides and returns the figures (see the module docstring).

    The reference runs with `threads` (default: the machine's cores) and, with `single_thread_reference`, also
    with one thread: on a loaded machine torch's multi-threaded small ops can be several times slower than one
    thread, so `decode_speedup_vs_best_torch` compares with the faster of the two.

    Returns:
        {"decode_speedup": ours / reference end-to-end new tokens/s, "decode_speedup_vs_best_torch",
         "ours_tokens_per_s", "torch_tokens_per_s", "torch_1_thread_tokens_per_s" (None without it),
         "ours_decode_only_tokens_per_s", "ours_compile_s", "ours_seconds", "torch_seconds", "ours_times",
         "torch_times", "torch_threads", "greedy_tokens_match": fraction of equal greedy tokens,
         "load_average_1min", "batch", "prompt_len", "max_new_tokens"}.
    """
    import torch
    import transformers

    config = timing.benchmark_config()
    torch.manual_seed(seed)
    hf_config = transformers.Qwen3VLConfig(**config.to_hf())
    hf_config._attn_implementation = "sdpa"
    hf_model = transformers.Qwen3VLForConditionalGeneration(hf_config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf_model.save_pretrained(tmp)
        model = qwen3_vl.load(tmp, sharding_rules="sample")
    prompts = timing.random_prompts(config, batch=batch, length=prompt_len, seed=seed)
    sampler = sampler_lib.Sampler(model)
    threads = threads or os.cpu_count() or 1
    calls = {
        "ours": timing.sampler_call(sampler, prompts, max_new_tokens=max_new_tokens),
        "torch": timing.transformers_call(hf_model, prompts, max_new_tokens=max_new_tokens, threads=threads),
    }
    if single_thread_reference and threads != 1:
        calls["torch_1_thread"] = timing.transformers_call(hf_model, prompts, max_new_tokens=max_new_tokens,
                                                               threads=1)
    timed = timing.time_interleaved(calls, repeats=repeats)
    ours, ref = timed["ours"], timed["torch"]
    best = min(entry["seconds"] for name, entry in timed.items() if name != "ours")
    new_tokens = batch * max_new_tokens
    decode_s = timing.decode_seconds(sampler, prompts, max_new_tokens=max_new_tokens, repeats=repeats)
    single = timed.get("torch_1_thread")
    return {
        "decode_speedup": ref["seconds"] / ours["seconds"],
        "decode_speedup_vs_best_torch": best / ours["seconds"],
        "ours_tokens_per_s": new_tokens / ours["seconds"],
        "torch_tokens_per_s": new_tokens / ref["seconds"],
        "torch_1_thread_tokens_per_s": None if single is None else new_tokens / single["seconds"],
        "ours_decode_only_tokens_per_s": new_tokens / decode_s,
        "ours_compile_s": ours["first_s"],
        "ours_seconds": ours["seconds"],
        "torch_seconds": ref["seconds"],
        "ours_times": ours["times"],
        "torch_times": ref["times"],
        "torch_threads": threads,
        "greedy_tokens_match": float(np.mean(ours["result"][0] == ref["result"])),
        "load_average_1min": os.getloadavg()[0],
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
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: cores)")
    parser.add_argument("--no-single-thread", action="store_true", help="skip the 1-thread torch reference")
    parser.add_argument("--json", help="write the figures to this JSON file")
    args = parser.parse_args()
    result = compare_decode(batch=args.batch, prompt_len=args.prompt, max_new_tokens=args.new,
                            repeats=args.repeats, seed=args.seed, threads=args.threads,
                            single_thread_reference=not args.no_single_thread)
    print(f"decode, batch {args.batch}, prompt {args.prompt}, {args.new} new tokens (greedy, fp32)")
    print(f"{'':24}{'ours':>12}{'transformers':>14}{'ratio':>8}  (torch threads: {result['torch_threads']})")
    print(f"{'new tokens/s':24}{result['ours_tokens_per_s']:12.1f}{result['torch_tokens_per_s']:14.1f}"
          f"{result['decode_speedup']:8.2f}")
    print(f"{'seconds per call':24}{result['ours_seconds']:12.3f}{result['torch_seconds']:14.3f}")
    if result["torch_1_thread_tokens_per_s"] is not None:
        print(f"{'tok/s vs torch 1 thread':24}{result['ours_tokens_per_s']:12.1f}"
              f"{result['torch_1_thread_tokens_per_s']:14.1f}{result['decode_speedup_vs_best_torch']:8.2f}  "
              "(ratio vs the faster torch setting)")
    print(f"ours: compile + first call {result['ours_compile_s']:.1f} s, decode loop alone "
          f"{result['ours_decode_only_tokens_per_s']:.1f} tok/s; greedy tokens equal: "
          f"{result['greedy_tokens_match']:.1%}; load average {result['load_average_1min']:.1f}; goal "
          f"decode_speedup >= {TARGET_SPEEDUP}")
    if args.json:
        fileio.write_atomic(args.json, json.dumps(result, indent=2).encode("utf-8"))


if __name__ == "__main__":
    main()
