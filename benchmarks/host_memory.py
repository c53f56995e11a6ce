"""Freed host memory kept for reuse (`ranger_jax.host_memory`) vs glibc's default, side by side; ratio printed.

Each side runs in its own fresh process (the allocator is set before JAX starts), alternating, `--repeats` times:
SFT steps of the tiny policy's shape on rows shaped like sim-tiny's teacher episodes (8 rows of ~1,100 tokens with
two images each), then greedy sampler calls of 32 rows, as the actor's decodes. Each process reports its median
step and call times, page faults, kernel (system) CPU seconds, and its losses and tokens, which must be the same
bit for bit on both sides: the allocator moves buffers, not values.

    python benchmarks/host_memory.py [--steps 6] [--calls 4] [--repeats 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import types

import numpy as np

IDS = types.SimpleNamespace(vocab_size=2048, eos_id=2, pad_id=0, image_pad_id=5, video_pad_id=6, vision_start_id=3,
                            vision_end_id=4)
GRID = (1, 8, 8)  # 64 patches, 16 placeholder tokens: a 128 x 128 sim-tiny image
SIDES = ("default", "retained")


def sft_rows(rng: np.random.Generator, rows: int, length: int, images: int) -> list[dict]:
    """Random teacher-episode-shaped rows: text with `images` image placeholders, loss on the second half."""
    features = 3 * 2 * 16 * 16
    out = []
    for _ in range(rows):
        n = int(rng.integers(length * 3 // 4, length))
        ids = list(rng.integers(10, IDS.vocab_size, n - images * (np.prod(GRID) // 4 + 2)))
        for i in range(images):
            at = (i + 1) * len(ids) // (images + 1)
            ids[at:at] = [IDS.vision_start_id] + [IDS.image_pad_id] * (np.prod(GRID) // 4) + [IDS.vision_end_id]
        loss = np.zeros(len(ids), np.float32)
        loss[len(ids) // 2:] = 1
        out.append({"input_ids": np.array(ids, np.int32), "attention_mask": np.ones(len(ids), np.int32),
                    "loss_mask": loss, "sampler_logp": np.zeros(len(ids), np.float32), "policy_version": np.int32(0),
                    "image_grid_thw": np.array([GRID] * images, np.int32),
                    "pixel_values": rng.standard_normal((images * int(np.prod(GRID)), features)).astype(np.float32)})
    return out


def worker(args: argparse.Namespace) -> dict:
    """One side in this process: SFT steps, then sampler calls; timings, faults and outputs."""
    from ranger_jax import host_memory

    retained = host_memory.retain_freed_memory()
    from ranger_jax.data import batching
    from ranger_jax.models import qwen3_vl
    from ranger_jax.rl import learner as learner_lib
    from ranger_jax.rl import learner_config, tiny_policy
    from ranger_jax.sampling import sampler as sampler_lib

    rng = np.random.default_rng(0)
    spec = batching.BatchSpec(batch_size=8, length_buckets=(640, 896, 1152, 1536), pad_id=IDS.pad_id,
                              image_pad_id=IDS.image_pad_id, patch_step=1024, image_step=8)
    batch = batching.collate(sft_rows(rng, 8, 1152, 2), spec)
    settings = learner_config.LearnerConfig(objective="sft", learning_rate=3e-3, schedule="constant",
                                            weight_decay=0.0, max_grad_norm=1.0)
    model_config = tiny_policy.model_config(IDS)
    learner = learner_lib.Learner(qwen3_vl.init(model_config, seed=0), settings)

    def usage() -> tuple[int, float]:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_minflt, r.ru_stime

    learner.step(batch)  # compile
    faults0, sys0 = usage()
    step_s, losses = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        metrics = learner.step(batch)
        losses.append(float(metrics["loss"]))
        step_s.append(time.perf_counter() - start)
    faults1, sys1 = usage()

    sampler = sampler_lib.Sampler(learner.params_model())
    prompts = [sampler_lib.Segment(row) for row in rng.integers(10, IDS.vocab_size, (32, 600), np.int32)]
    params = sampler_lib.SamplingParams(temperature=0.0, max_new_tokens=64)
    sampler.complete(prompts, params)  # compile
    call_s, tokens = [], []
    for _ in range(args.calls):
        start = time.perf_counter()
        done = sampler.complete(prompts, params)
        call_s.append(time.perf_counter() - start)
        tokens.append(np.stack([c.token_ids for c in done]).tolist())
    faults2, sys2 = usage()
    return {"retained": retained, "sft_step_s": statistics.median(step_s), "decode_call_s": statistics.median(call_s),
            "sft_faults_per_step": (faults1 - faults0) / args.steps,
            "decode_faults_per_call": (faults2 - faults1) / args.calls,
            "sft_system_cpu_s_per_step": (sys1 - sys0) / args.steps,
            "decode_system_cpu_s_per_call": (sys2 - sys1) / args.calls, "losses": losses, "tokens": tokens}


def run_side(side: str, args: argparse.Namespace) -> dict:
    from ranger_jax import host_memory

    env = {**os.environ, host_memory.ENV_VAR: "1" if side == "retained" else "0"}
    command = [sys.executable, __file__, "--worker", "--steps", str(args.steps), "--calls", str(args.calls)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(f"the {side} worker failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="timed SFT steps per process")
    parser.add_argument("--calls", type=int, default=4, help="timed sampler calls per process")
    parser.add_argument("--repeats", type=int, default=2, help="processes per side, alternating")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for _ in range(args.repeats):  # alternating, so drifting machine load hits both sides alike
        for side in SIDES:
            runs[side].append(run_side(side, args))
    if not runs["retained"][0]["retained"]:
        raise SystemExit("this C library is not glibc: nothing to compare")
    same = all(r["losses"] == runs["default"][0]["losses"] and r["tokens"] == runs["default"][0]["tokens"]
               for side in SIDES for r in runs[side])
    figures = {side: {key: statistics.median(r[key] for r in runs[side])
                      for key in ("sft_step_s", "decode_call_s", "sft_faults_per_step", "decode_faults_per_call",
                                  "sft_system_cpu_s_per_step", "decode_system_cpu_s_per_call")} for side in SIDES}
    for side in SIDES:
        f = figures[side]
        print(f"{side:>8}: SFT step {f['sft_step_s']:.3f} s ({f['sft_faults_per_step']:,.0f} page faults, "
              f"{f['sft_system_cpu_s_per_step']:.3f} s system CPU); decode call {f['decode_call_s']:.3f} s "
              f"({f['decode_faults_per_call']:,.0f} faults, {f['decode_system_cpu_s_per_call']:.3f} s system CPU)")
    sft_ratio = figures["default"]["sft_step_s"] / figures["retained"]["sft_step_s"]
    decode_ratio = figures["default"]["decode_call_s"] / figures["retained"]["decode_call_s"]
    print(f"retained freed memory: SFT step x{sft_ratio:.2f}, decode call x{decode_ratio:.2f}; "
          f"same losses and tokens on both sides: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sft_speedup": sft_ratio, "decode_speedup": decode_ratio, "same_outputs": same,
                       "figures": figures, "args": vars(args)}, f, indent=2)


if __name__ == "__main__":
    main()
