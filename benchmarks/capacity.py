"""The capacity model of a GRPO preset, and its cross-check against XLA's view of the real train step.

    python benchmarks/capacity.py --preset savanna-8b-tpu            # 32 × v5p (a v5p-64 slice)
    python benchmarks/capacity.py --preset savanna-8b-gpu --chips 8 --chip h100 --seq-len 16384 --json OUT
    python benchmarks/capacity.py --preset savanna-8b-tpu --check    # + XLA cross-check (about 2 minutes on CPU)

The figures and their formulas are `ranger_jax.rl.capacity` (memory per chip with the remat policy, FLOPs per
step, step time at `--mfu`, rollout tokens/s, weight sync at `--sync-gbps`, trajectory storage per day); every
assumption is a flag and is printed with the figures.

`--check` builds the real Qwen3-VL-8B train step (the preset's learner settings) abstractly on 8 fake CPU devices
(mesh (1, 2, 4), or (1, 8, 1) for a mesh without tensor parallelism) and compares: parameter + AdamW bytes per
device from the partition rules with the compiled step's argument bytes (exact); gradients + step temporaries +
activations with its temporary bytes (an estimate); and the decoder's FLOPs with the lowered program's FLOP count.
The compiled comparison uses `--check-layers` decoder layers (default 4) so it compiles in about a minute; the
FLOP comparison lowers all 36. Nothing is allocated.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

from ranger_jax import fileio  # noqa: E402
from ranger_jax.rl import capacity, presets  # noqa: E402

DEFAULT_HARDWARE = {"savanna-8b-tpu": (32, "v5p"), "savanna-8b-gpu": (8, "h100")}


def cross_check(setup: capacity.Setup, layers: int) -> dict:
    """XLA's figures of the preset's train step beside the model's (see the module docstring)."""
    check_mesh = (1, 2, 4) if setup.mesh[2] > 1 else (1, 8, 1)
    small = dataclasses.replace(setup.model, text_config=dataclasses.replace(setup.model.text_config,
                                                                             num_hidden_layers=layers))
    rows, seq = 8, 1024
    probe = dataclasses.replace(setup, model=small, mesh=check_mesh, rows_per_step=rows, seq_len=seq)
    ours = capacity.estimate(probe)
    xla = capacity.lowered_step(probe, compile_memory=True)
    full = dataclasses.replace(setup, mesh=check_mesh, rows_per_step=rows, seq_len=seq)
    xla_full = capacity.lowered_step(full)
    text = setup.model.text_config
    head_forward = 2 * rows * seq * text.hidden_size * text.vocab_size
    text_only = capacity.estimate(dataclasses.replace(full, workload=dataclasses.replace(full.workload,
                                                                                         images_per_turn=0)))
    vision = capacity.estimate(full)["hardware_flops"] - text_only["hardware_flops"]
    # without the LM head: 3 passes, plus the fused loss's backward recomputing the logits (as remat would)
    decoder_hw = text_only["hardware_flops"] - (4 if setup.model.remat == "full" else 3) * head_forward
    stored = ours["params_chip"] + ours["optimizer_chip"]
    working = ours["gradients_chip"] + ours["temporaries_chip"] + ours["activations_chip"]
    return {
        "check_mesh": check_mesh, "check_layers": layers, "rows": rows, "seq_len": seq,
        "params_plus_adam_per_device": {"ours": stored, "xla_argument_bytes": xla["argument_bytes"],
                                        "ratio": xla["argument_bytes"] / stored},
        "step_working_memory_per_device": {"ours": working, "xla_temp_bytes": xla["temp_bytes"],
                                           "ratio": xla["temp_bytes"] / working},
        "decoder_flops_36_layers": {"ours_with_recompute": decoder_hw, "xla_lowered": xla_full["flops"],
                                    "ratio": xla_full["flops"] / decoder_hw,
                                    "note": "XLA counts a loop body once (the chunked LM head, the blocked "
                                            "attention's key blocks), so it reads low; no images in the "
                                            f"lowered batch (their vision forward would add {vision:.3e})"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--preset", required=True, choices=sorted(presets.PRESETS))
    parser.add_argument("--chips", type=int, help="learner chips (default: 32 for the TPU preset, 8 for the GPU one)")
    parser.add_argument("--chip", choices=sorted(capacity.CHIPS), help="accelerator (default: v5p / h100)")
    parser.add_argument("--seq-len", type=int, default=8192, help="length bucket the learner pads rows to")
    parser.add_argument("--mfu", type=float, default=0.35, help="stated learner MFU")
    parser.add_argument("--sync-gbps", type=float, default=1.0, help="GB/s to and from shared storage")
    parser.add_argument("--decode-tps", type=float, default=3000.0, help="generated tokens/s of one rollout GPU")
    work = capacity.Workload()
    for field in dataclasses.fields(work):
        parser.add_argument("--" + field.name.replace("_", "-"), type=type(getattr(work, field.name)),
                            default=getattr(work, field.name))
    parser.add_argument("--check", action="store_true", help="cross-check against XLA (about 2 minutes)")
    parser.add_argument("--check-layers", type=int, default=4)
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    chips, chip = DEFAULT_HARDWARE[args.preset]
    workload = capacity.Workload(**{f.name: getattr(args, f.name) for f in dataclasses.fields(work)})
    setup = capacity.Setup.for_preset(presets.PRESETS[args.preset], chips=args.chips or chips, chip=args.chip or chip,
                                      seq_len=args.seq_len, workload=workload, mfu=args.mfu,
                                      sync_bandwidth=args.sync_gbps * 1e9, decode_tokens_per_s=args.decode_tps)
    plan = capacity.estimate(setup)
    print(f"{args.preset}: {setup.learner.objective}, dtype {setup.model.dtype} (parameters "
          f"{setup.model.param_dtype}), remat {setup.model.remat}, vision frozen {setup.learner.freeze_vision}")
    print(f"assumed trajectory: {dataclasses.asdict(workload)}")
    print(capacity.report(plan))
    if args.check:
        plan["cross_check"] = cross_check(setup, args.check_layers)
        print(json.dumps(plan["cross_check"], indent=2, default=float))
    if args.json:
        fileio.write_atomic(args.json, json.dumps(plan, indent=2, default=str).encode("utf-8"))


if __name__ == "__main__":
    main()
