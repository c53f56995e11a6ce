"""Qwen3-VL forward and LM train step: ours (JAX) vs transformers (torch, sdpa), same weights, one process.

    python benchmarks/compare_torch.py --json OUT [--runs 5] [--batch 4] [--length 1024] [--attention blocked]
                                       [--optimizer none|adamw] [--no-images] [--no-decode]

Model: `timing.benchmark_config()` (benchmarks/timing.py: text hidden 512, 8 layers, 8 heads / 4 kv,
head_dim 64, SwiGLU 1536, vocab 32000, small vision tower), randomly initialised by transformers, saved, and loaded
by our `load`. Both sides run float32 on this machine's cores (torch threads = cores; XLA uses all cores).

What is timed (each side's steady state; compile / first call reported apart, `jax.block_until_ready` before each
clock read, torch and ours interleaved run by run so background load hits both, median of --runs):
- forward: logits [B, T, V] float32 of B x T random text tokens, no padding (causal mask only).
  torch: `model(input_ids)` under `no_grad`; ours: jitted `Qwen3VL.forward`.
- train step: forward + mean next-token cross-entropy (transformers' `ForCausalLMLoss`) + backward to gradients
  of every parameter, and with --optimizer adamw also the AdamW update. torch: `model(input_ids, labels=...)`,
  `loss.backward()` (grads set to None first), `opt.step()`; ours: jitted `jax.value_and_grad` of
  `loss.causal_lm_loss` (head fused with the loss), `optax.adamw` with the state donated.
- forward with images (unless --no-images): one image of 32 x 32 patches in each row, logits as above.
- decode (unless --no-decode): `compare_decode` of benchmarks/decode_vs_torch.py.
Speedups are torch seconds / our seconds. MFU: `flops.text_flops` over the train step time, as a fraction of the
f32 matmul peak measured here with a 4096^3 `jnp` matmul.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import transformers
from flax import nnx

import timing  # benchmarks/timing.py, beside this script
from ranger_jax import fileio
from ranger_jax.models import qwen3_vl
from ranger_jax.models.qwen3_vl import flops, loss

DECODE_BENCHMARK = Path(__file__).with_name("decode_vs_torch.py")
IMAGE_GRID = (1, 32, 32)  # patches per image in the image case: 256 placeholder tokens


def timed(run, runs: int) -> tuple[float, list[float]]:
    """(first call seconds, steady seconds of `runs` more calls); `run` must block until its result is ready."""
    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    steady = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        steady.append(time.perf_counter() - start)
    return first, steady


def alternating(ours, theirs, runs: int, rounds: int = 2) -> dict:
    """Times both sides in `rounds` alternating blocks of `runs` calls, each block after one untimed call.

    The first call of each side (compile, allocations) is reported apart. Whole blocks rather than single calls
    alternate because each library's worker threads keep spinning for a while after its last op and would slow the
    other side's next call; spreading the blocks over the run lets background load hit both sides alike.
    """
    first_ours, _ = timed(ours, 0)
    first_theirs, _ = timed(theirs, 0)
    ours_s, theirs_s = [], []
    for _ in range(rounds):
        theirs_s += timed(theirs, runs)[1]
        ours_s += timed(ours, runs)[1]
    return {"ours_first_call_s": first_ours, "torch_first_call_s": first_theirs,
            "ours_s": statistics.median(ours_s), "torch_s": statistics.median(theirs_s),
            "ours_runs_s": ours_s, "torch_runs_s": theirs_s}


def matmul_peak(runs: int, size: int = 4096) -> dict:
    """Measured f32 matmul FLOP/s of jnp (the MFU denominator) and of torch, median of `runs` after a warm-up."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((size, size)), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    _, jax_s = timed(lambda: matmul(a).block_until_ready(), runs)
    t = torch.from_numpy(np.asarray(a).copy())
    _, torch_s = timed(lambda: t @ t, runs)
    work = 2 * size**3
    return {"jax_matmul_flops_per_s": work / statistics.median(jax_s),
            "torch_matmul_flops_per_s": work / statistics.median(torch_s), "matmul_size": size}


def text_batch(config, batch: int, length: int, seed: int) -> np.ndarray:
    return timing.random_prompts(config, batch=batch, length=length, seed=seed).astype(np.int64)


def image_batch(config, batch: int, length: int, seed: int) -> dict:
    """Rows of `length` tokens: text, one image of IMAGE_GRID patches (vision_start, pads, vision_end), text."""
    rng = np.random.default_rng(seed)
    ids = text_batch(config, batch, length, seed)
    tokens = IMAGE_GRID[0] * IMAGE_GRID[1] * IMAGE_GRID[2] // config.vision_config.spatial_merge_size**2
    start = 16
    ids[:, start] = config.vision_start_token_id
    ids[:, start + 1:start + 1 + tokens] = config.image_token_id
    ids[:, start + 1 + tokens] = config.vision_end_token_id
    grid = np.asarray([IMAGE_GRID] * batch, np.int64)
    pixels = rng.standard_normal((int(grid.prod(-1).sum()), config.vision_config.patch_features)).astype(np.float32)
    return {"input_ids": ids, "pixel_values": pixels, "image_grid_thw": grid,
            "mm_token_type_ids": (ids == config.image_token_id).astype(np.int64)}  # transformers only


def load_pair(config, seed: int, tmp: str):
    """The same random weights as a transformers sdpa model (float32) and as our `Qwen3VL`."""
    torch.manual_seed(seed)
    hf_config = transformers.Qwen3VLConfig(**config.to_hf())
    hf_config._attn_implementation = "sdpa"
    hf = transformers.Qwen3VLForConditionalGeneration(hf_config).float()
    hf.save_pretrained(tmp)
    return hf, qwen3_vl.load(tmp, attention=config.attention, remat=config.remat)


def compare_forward(hf, graphdef, state, inputs: dict, runs: int) -> dict:
    forward = jax.jit(lambda state, kw: nnx.merge(graphdef, state).forward(**kw))
    ours_inputs = {k: jnp.asarray(v) for k, v in inputs.items() if k != "mm_token_type_ids"}
    torch_inputs = {k: torch.from_numpy(v) for k, v in inputs.items()}
    hf.eval()

    def theirs():
        with torch.no_grad():
            return hf(**torch_inputs).logits

    figures = alternating(lambda: forward(state, ours_inputs).block_until_ready(), theirs, runs)
    diff = np.abs(np.asarray(forward(state, ours_inputs)) - theirs().numpy()).max()
    return {**figures, "logits_max_abs_diff": float(diff)}


def compare_train_step(hf, graphdef, state, input_ids: np.ndarray, runs: int, optimizer: str) -> dict:
    ids = jnp.asarray(input_ids)
    labels = torch.from_numpy(input_ids)

    def loss_fn(params):
        return loss.causal_lm_loss(nnx.merge(graphdef, params), ids)

    value_and_grad = jax.value_and_grad(loss_fn)
    hf.train()
    with torch.no_grad():
        checks = {"ours_loss": float(jax.jit(loss_fn)(state)), "torch_loss": float(hf(input_ids=labels,
                                                                                     labels=labels).loss)}
    if optimizer == "adamw":
        tx = optax.adamw(1e-5)
        carry = {"params": jax.tree.map(jnp.copy, state)}
        carry["opt"] = tx.init(carry["params"])

        @functools.partial(jax.jit, donate_argnums=(0, 1))
        def update(params, opt):
            value, grads = value_and_grad(params)
            updates, opt = tx.update(grads, opt, params)
            return value, optax.apply_updates(params, updates), opt

        def ours():
            value, carry["params"], carry["opt"] = update(carry["params"], carry["opt"])
            jax.block_until_ready((value, carry["params"], carry["opt"]))

        torch_opt = torch.optim.AdamW(hf.parameters(), lr=1e-5)
    else:
        step = jax.jit(value_and_grad)
        torch_opt = None

        def ours():
            jax.block_until_ready(step(state))

    def theirs():
        hf.zero_grad(set_to_none=True)
        hf(input_ids=labels, labels=labels).loss.backward()
        if torch_opt is not None:
            torch_opt.step()

    return {**alternating(ours, theirs, runs), **checks}


def grpo_batch(input_ids: np.ndarray, seed: int) -> dict:
    """A GRPO batch over `input_ids`: the second half of every row is "generated" (trained), rewards → advantages
    of two groups, sampler log-probs a little off the learner's."""
    rng = np.random.default_rng(seed)
    batch, length = input_ids.shape
    mask = np.zeros((batch, length), np.float32)
    mask[:, length // 2:] = 1.0
    return {"input_ids": input_ids.astype(np.int32), "attention_mask": np.ones((batch, length), np.int32),
            "loss_mask": mask, "sampler_logp": (-rng.uniform(0.5, 3.0, (batch, length)) * mask).astype(np.float32),
            "advantages": rng.standard_normal(batch).astype(np.float32),
            "policy_version": np.zeros(batch, np.int32)}


def compare_grpo_step(hf, model, batch: dict, runs: int) -> dict:
    """One GRPO update: our `rl.learner.Learner` (fused chunked head, clip-higher, TIS, AdamW) vs the same objective
    written in torch over full logits (log_softmax, gather, clipped ratio, seq-mean-token-sum, AdamW)."""
    from ranger_jax.rl import learner, learner_config

    settings = learner_config.LearnerConfig(objective="grpo", learning_rate=1e-6, old_logp="learner", tis_cap=2.0,
                                            weight_decay=0.01, max_grad_norm=1.0)
    ours_learner = learner.Learner(model, settings)
    ids = torch.from_numpy(batch["input_ids"]).long()
    mask = torch.from_numpy(batch["loss_mask"])[:, 1:]
    advantages = torch.from_numpy(batch["advantages"])[:, None]
    sampler = torch.from_numpy(batch["sampler_logp"])[:, 1:]
    torch_opt = torch.optim.AdamW(hf.parameters(), lr=1e-6, weight_decay=0.01)

    def ours():
        ours_learner.step(batch)

    def theirs():
        torch_opt.zero_grad(set_to_none=True)
        logits = hf(input_ids=ids).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
        old = logp.detach()
        ratio = torch.exp(logp - old)
        per_token = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.28))
        per_token = per_token * torch.clamp(torch.exp(old - sampler), max=2.0)
        loss = ((per_token * mask).sum(-1)).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        torch_opt.step()

    return alternating(ours, theirs, runs)


def run_decode_benchmark(threads: int) -> dict:
    """`compare_decode` of benchmarks/decode_vs_torch.py (a sibling script, not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location("decode_vs_torch", DECODE_BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compare_decode(threads=threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the figures to this JSON file")
    parser.add_argument("--runs", type=int, default=5, help="timed calls per side and case (median reported)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--attention", default=None, help="our attention kernel (attention.KERNELS); default: the "
                        "config's")
    parser.add_argument("--remat", default="none", help="our remat policy (config.REMAT_POLICIES)")
    parser.add_argument("--optimizer", choices=("none", "adamw"), default="none")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-images", action="store_true", help="skip the forward-with-images case")
    parser.add_argument("--no-decode", action="store_true", help="skip benchmarks/decode_vs_torch.py")
    parser.add_argument("--no-grpo", action="store_true", help="skip the GRPO learner step")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    config = timing.benchmark_config()
    config = dataclasses.replace(config, attention=args.attention or config.attention, remat=args.remat)
    with tempfile.TemporaryDirectory() as tmp:
        hf, model = load_pair(config, args.seed, tmp)
    ours_config = model.config
    graphdef, state = nnx.split(model)
    batch, length = args.batch, args.length
    tokens = batch * length
    peak = matmul_peak(args.runs)

    ids = text_batch(config, batch, length, args.seed)
    result = {"config": {"batch": batch, "length": length, "attention": ours_config.attention,
                         "remat": ours_config.remat, "optimizer": args.optimizer, "torch_threads": args.threads,
                         "cores": os.cpu_count(), "runs": args.runs, "jax": jax.__version__,
                         "torch": torch.__version__, "transformers": transformers.__version__},
              **peak}
    forward = compare_forward(hf, graphdef, state, {"input_ids": ids}, args.runs)
    train = compare_train_step(hf, graphdef, state, ids, args.runs, args.optimizer)
    train_flops = flops.text_flops(config.text_config, batch=batch, length=length)
    result.update({
        "forward_speedup": forward["torch_s"] / forward["ours_s"],
        "train_step_speedup": train["torch_s"] / train["ours_s"],
        "forward_tokens_per_s": {"ours": tokens / forward["ours_s"], "torch": tokens / forward["torch_s"]},
        "train_step_tokens_per_s": {"ours": tokens / train["ours_s"], "torch": tokens / train["torch_s"]},
        "train_step_flops": train_flops,
        "train_step_mfu": flops.mfu(train_flops, train["ours_s"], peak["jax_matmul_flops_per_s"]),
        "torch_train_step_mfu": flops.mfu(train_flops, train["torch_s"], peak["jax_matmul_flops_per_s"]),
        "forward": forward,
        "train_step": train,
    })
    if not args.no_grpo:
        grpo = compare_grpo_step(hf, model, grpo_batch(ids, args.seed), args.runs)
        result["grpo_step_speedup"] = grpo["torch_s"] / grpo["ours_s"]
        result["grpo_step_tokens_per_s"] = {"ours": tokens / grpo["ours_s"], "torch": tokens / grpo["torch_s"]}
        result["grpo_step_mfu"] = flops.mfu(train_flops, grpo["ours_s"], peak["jax_matmul_flops_per_s"])
        result["grpo_step"] = grpo
    if not args.no_images:
        images = compare_forward(hf, graphdef, state, image_batch(config, batch, length, args.seed), args.runs)
        result["images_forward_speedup"] = images["torch_s"] / images["ours_s"]
        result["images_forward"] = {**images, "image_grid_thw": list(IMAGE_GRID), "images": batch}
    if not args.no_decode:
        result["decode"] = run_decode_benchmark(args.threads)
        result["decode_speedup"] = result["decode"]["decode_speedup"]

    print_table(result)
    if args.json:
        fileio.write_atomic(args.json, json.dumps(result, indent=2).encode("utf-8"))


def print_table(result: dict) -> None:
    c = result["config"]
    print(f"Qwen3-VL benchmark config (timing.py), batch {c['batch']} x {c['length']} tokens, float32, "
          f"{c['cores']} cores, ours: attention={c['attention']} remat={c['remat']}, optimizer={c['optimizer']}, "
          f"median of {c['runs']}")
    print(f"{'':34}{'ours':>12}{'transformers':>14}{'ratio':>8}")
    rows = [("forward", result["forward"]), ("train step", result["train_step"])]
    if "grpo_step" in result:
        rows.append(("GRPO learner step", result["grpo_step"]))
    if "images_forward" in result:
        rows.append(("forward with images", result["images_forward"]))
    tokens = c["batch"] * c["length"]
    for name, figures in rows:
        print(f"{name + ' (s)':34}{figures['ours_s']:12.3f}{figures['torch_s']:14.3f}"
              f"{figures['torch_s'] / figures['ours_s']:8.2f}")
        print(f"{name + ' (tokens/s)':34}{tokens / figures['ours_s']:12.0f}{tokens / figures['torch_s']:14.0f}")
    if "decode" in result:
        d = result["decode"]
        print(f"{'decode (new tokens/s)':34}{d['ours_tokens_per_s']:12.1f}{d['torch_tokens_per_s']:14.1f}"
              f"{d['decode_speedup']:8.2f}")
    print(f"{'train step MFU (of jnp f32 peak)':34}{result['train_step_mfu']:12.1%}"
          f"{result['torch_train_step_mfu']:14.1%}")
    if "grpo_step_mfu" in result:
        print(f"{'GRPO step MFU (of jnp f32 peak)':34}{result['grpo_step_mfu']:12.1%}")
    print(f"f32 matmul peak: jnp {result['jax_matmul_flops_per_s'] / 1e9:.0f} GFLOP/s, torch "
          f"{result['torch_matmul_flops_per_s'] / 1e9:.0f} GFLOP/s; train step {result['train_step_flops'] / 1e9:.0f}"
          " GFLOP (flops.text_flops)")
    f, t = result["forward"], result["train_step"]
    print(f"first call (compile + run): forward ours {f['ours_first_call_s']:.1f} s / torch "
          f"{f['torch_first_call_s']:.1f} s, train step ours {t['ours_first_call_s']:.1f} s / torch "
          f"{t['torch_first_call_s']:.1f} s")
    print(f"checks: forward logits max |diff| {f['logits_max_abs_diff']:.1e}; loss ours {t['ours_loss']:.6f} "
          f"torch {t['torch_loss']:.6f}")


if __name__ == "__main__":
    main()
