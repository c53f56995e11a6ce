"""The capacity model against figures computed by hand for the tiny config on a (1, 2, 2) mesh, the XLA
cross-check (the compiled step's argument bytes equal the exact parameter + optimizer figure), the 8B presets'
sanity, and the errors."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ranger_jax.models.qwen3_vl import Qwen3VLConfig
from ranger_jax.rl import capacity, presets
from ranger_jax.rl.learner_config import LearnerConfig

TINY = Qwen3VLConfig.tiny(remat="full")  # float32 compute and parameters
WORK = capacity.Workload(prompt_tokens=10, turns=2, generated_tokens_per_turn=3, observation_tokens_per_turn=4,
                         images_per_turn=1, image_tokens=4, image_png_bytes=100)
SETUP = capacity.Setup(model=TINY, learner=LearnerConfig(objective="grpo", freeze_vision=True), mesh=(1, 2, 2),
                       chip=capacity.Chip("test", 1e9, 1e12), rows_per_step=8, seq_len=16, workload=WORK, mfu=0.5,
                       sync_bandwidth=1e6, decode_tokens_per_s=10.0)

# Parameter elements, whole / per chip of (data 1, fsdp 2, tensor 2) under the TRAIN rules (embed, vision_embed,
# vision_merged -> fsdp; vocab, heads, kv_heads, mlp, vision_heads, vision_mlp -> tensor):
#   text: embed_tokens 256·32 = 8192 / 2048, lm_head 8192 / 2048, norm 32 / 16; per layer q 32·4·8 = 1024 / 256,
#         k, v 32·2·8 = 512 / 128 each, o 1024 / 256, q_norm, k_norm 8 / 8 each, gate, up, down 2048 / 512 each,
#         two layer norms 32 / 16 each -> 9296 / 2352; two layers -> 18592 / 4704. Text 35008 / 8816.
#   vision: patch_embed 1536·16 + 16 = 24592 / 12296, pos_embed 256 / 128, per block (norms 4·16, qkv 768 + 48,
#           proj 256 + 16, fc1 512 + 32, fc2 512 + 16) 2224 / 600 -> two blocks 4448 / 1200, merger (norm 2·16,
#           fc1 64·64 + 64, fc2 64·32 + 32) 6272 / 1600, two DeepStack mergers (norm 2·64) 6368 / 1648 each.
#           Vision 48304 / 18520.
PARAMS, PARAMS_CHIP, TRAINED, TRAINED_CHIP = 83312, 27336, 35008, 8816


def test_memory_per_chip_by_hand():
    plan = capacity.estimate(SETUP)
    assert (plan["num_params"], plan["num_trained"]) == (PARAMS, TRAINED)
    assert plan["params_chip"] == PARAMS_CHIP * 4 and plan["params_total"] == PARAMS * 4
    assert plan["optimizer_chip"] == 2 * TRAINED_CHIP * 4  # mu and nu of the text model (vision frozen)
    assert plan["gradients_chip"] == plan["temporaries_chip"] == TRAINED_CHIP * 4  # float32, no compute copy
    # 4 rows per chip (8 rows over fsdp 2) x 16 tokens = 64 tokens; D 32, Q 32, KV 16, F 64, float32
    saved = 2 * 64 * 32 * 4  # two layers' inputs
    working = 2 * 64 * (2 * 32 + (32 + 2 * 16 + 3 * 64) / 2) * 4
    head = 2 * 64 * 256 * 4  # a chunk holds all 64 rows
    assert plan["activations_chip"] == saved + working + head == 245760
    assert plan["memory_chip"] == 109344 + 70528 + 35264 + 35264 + 245760
    assert plan["memory_fraction"] == pytest.approx(plan["memory_chip"] / 1e9)


def test_flops_time_rollouts_sync_and_storage_by_hand():
    plan = capacity.estimate(SETUP)
    weights = 2 * (32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64) + 32 * 256  # = 26624
    forward = 2 * 8 * 16 * weights + 2 * 4 * 32 * 8 * 16 * 17 / 2  # = 7094272
    # vision forward: 16 images (8 rows x 2 turns x 1) of 16 patches; per patch 1536·16 + 2·(4·16² + 2·16·32)
    # weights, mergers 3·(64·64 + 64·32) per merged token (64 of them), attention 2 blocks · 4·16·16·256
    vision = 2 * 256 * 28672 + 2 * 64 * 18432 + 524288  # = 17563648
    assert plan["model_flops"] == 3 * forward + vision == 38846464
    assert plan["hardware_flops"] == plan["model_flops"] + forward  # full remat: one more decoder forward
    step = 38846464 / (4 * 1e12 * 0.5)
    assert plan["step_s"] == pytest.approx(step)
    assert plan["trajectory_tokens"] == 10 + 2 * (3 + 4 + 4) == 32
    assert plan["episodes_per_s"] == pytest.approx(8 / step)
    assert plan["generated_tokens_per_s"] == pytest.approx(8 * 2 * 3 / step)
    assert plan["prefill_tokens_per_s"] == pytest.approx(8 * (10 + 2 * 8) / step)
    assert plan["rollout_gpus"] == math.ceil(48 / step / 10)
    assert plan["sync_bytes"] == PARAMS * 4 and plan["sync_s"] == pytest.approx(2 * PARAMS * 4 / 1e6)
    assert plan["trajectory_bytes"] == 9 * 32 + 2 * 100
    assert plan["storage_per_day"] == pytest.approx(488 * 8 * 86400 / step)
    assert "AdamW moments / chip" in capacity.report(plan)


def test_the_compiled_step_holds_exactly_the_parameters_and_moments_counted():
    plan = capacity.estimate(SETUP)
    xla = capacity.lowered_step(SETUP, compile_memory=True)
    assert xla["argument_bytes"] == pytest.approx(plan["params_chip"] + plan["optimizer_chip"], rel=0.01)
    assert xla["flops"] > 0 and xla["temp_bytes"] > 0


def test_the_8b_tpu_preset_fits_a_v5p_64():
    plan = capacity.estimate(capacity.Setup.for_preset(presets.PRESETS["savanna-8b-tpu"], chips=32, chip="v5p"))
    assert plan["num_params"] == pytest.approx(8.77e9, rel=0.01) and plan["mesh"] == (1, 8, 4)
    assert plan["params_chip"] == pytest.approx(plan["params_total"] / 32, rel=0.01)  # nearly everything sharded
    assert plan["memory_fraction"] < 1


def test_errors_name_the_values():
    preset = presets.PRESETS["savanna-8b-tpu"]
    with pytest.raises(ValueError, match="30 chips do not fill mesh \\(1, -1, 4\\)"):
        capacity.Setup.for_preset(preset, chips=30, chip="v5p")
    with pytest.raises(ValueError, match="unknown chip 'tpu9'"):
        capacity.Setup.for_preset(preset, chips=32, chip="tpu9")
    with pytest.raises(ValueError, match="8 rows do not split into grad_accum_steps=3"):
        dataclasses.replace(SETUP, learner=LearnerConfig(grad_accum_steps=3))
