"""Learning-rate schedules against transformers' schedulers (constant, cosine and linear, each with warmup), and
which parameters AdamW decays."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from ranger_jax.models.qwen3_vl import Qwen3VLConfig, init
from ranger_jax.parallel import placement
from ranger_jax.rl import optim
from ranger_jax.rl.learner_config import LearnerConfig

HF_SCHEDULES = {
    "constant": lambda opt, warmup, total: transformers.get_constant_schedule_with_warmup(opt, warmup),
    "cosine": transformers.get_cosine_schedule_with_warmup,
    "linear": transformers.get_linear_schedule_with_warmup,
}


@pytest.mark.parametrize("schedule", sorted(HF_SCHEDULES))
@pytest.mark.parametrize("warmup", [0, 7])
def test_schedule_matches_transformers(schedule, warmup):
    total, peak = 40, 3e-4
    ours = optim.learning_rate_schedule(LearnerConfig(learning_rate=peak, schedule=schedule, warmup_steps=warmup,
                                                      total_steps=total))
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    scheduler = HF_SCHEDULES[schedule](optimizer, warmup, total)
    expected = []
    for _ in range(total + 1):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    got = [float(ours(step)) for step in range(total + 1)]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-12)


def test_weight_decay_skips_biases_and_norm_scales():
    config = Qwen3VLConfig.tiny()
    config = dataclasses.replace(config, text_config=dataclasses.replace(config.text_config, attention_bias=True))
    params = nnx.state(init(config), nnx.Param)
    mask = optim.weight_decay_mask(params)
    decays = {placement.path_key(p): bool(v.get_value())
              for p, v in jax.tree_util.tree_flatten_with_path(mask, is_leaf=placement.is_variable)[0]}
    plain = sorted(k for k, v in decays.items() if not v)
    assert all(k.endswith(".bias") or ".norm" in k or "layernorm" in k or "_norm." in k for k in plain)
    for key in ("model.language_model.layers.0.input_layernorm.weight", "model.language_model.norm.weight",
                "model.language_model.layers.1.self_attn.q_norm.weight",
                "model.language_model.layers.0.self_attn.q_proj.bias", "model.visual.blocks.0.norm1.weight",
                "model.visual.merger.norm.bias"):
        assert not decays[key], key
    for key in ("model.language_model.embed_tokens.weight", "lm_head.weight", "model.visual.pos_embed.weight",
                "model.language_model.layers.0.self_attn.q_proj.weight", "model.visual.patch_embed.proj.weight"):
        assert decays[key], key
