"""The text decoder stage by stage against transformers: merged input embeddings, MRoPE tables, every decoder
layer, DeepStack injection after the first layers, and the final norm (scaled-8B geometry: 4:1 GQA, uneven
mrope_section (6, 5, 5), DeepStack into layers 0 and 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flax import nnx

from ranger_jax.models.qwen3_vl import attention, get_rope_index, rope

ATOL = 1e-4

_layer = nnx.jit(lambda layer, x, cos, sin, mask_info: layer(x, cos, sin, mask_info)[0])
_norm = nnx.jit(lambda norm, x: norm(x))
_embed = nnx.jit(lambda model, ids, pixels, grid: model.embed(ids, *model.encode_images(pixels, grid)))


@pytest.fixture(scope="module")
def traced(checkpoints, image_batch):
    """The HF model run once on the image batch, recording every decoder layer's input, RoPE tables and output."""
    case = checkpoints("scaled_8b")
    batch = image_batch(case.config)
    lm = case.hf.model.language_model
    records, final = [], []
    hooks = [layer.register_forward_hook(
        lambda module, args, kwargs, out: records.append((args[0], kwargs["position_embeddings"], out)),
        with_kwargs=True) for layer in lm.layers]
    hooks.append(lm.norm.register_forward_hook(lambda module, args, out: final.append((args[0], out))))
    from support import tiny_hf

    with torch.no_grad():
        case.hf(**tiny_hf.torch_inputs(batch))
    for hook in hooks:
        hook.remove()
    return case, batch, records, final[0]


def _np(x) -> np.ndarray:
    return x.detach().float().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _diff(ours, ref, mask) -> float:
    return float(np.abs(_np(ours) - _np(ref))[mask].max())


def test_mrope_tables_match_transformers(traced):
    case, batch, records, _ = traced
    positions, _ = get_rope_index(batch["input_ids"], batch["image_grid_thw"], batch["attention_mask"],
                                  image_token_id=case.config.image_token_id, spatial_merge_size=2)
    cos, sin = rope.mrope_cos_sin(positions, case.config.text_config, np.float32)
    ref_cos, ref_sin = records[0][1]
    mask = batch["attention_mask"].astype(bool)
    assert _diff(cos, ref_cos, mask) <= 1e-5 and _diff(sin, ref_sin, mask) <= 1e-5, "interleaved MRoPE cos/sin"


def test_merged_input_embeddings_match_transformers(traced):
    case, batch, records, _ = traced
    embeds, deepstack_embeds = _embed(case.model, batch["input_ids"], batch["pixel_values"], batch["image_grid_thw"])
    mask = batch["attention_mask"].astype(bool)
    assert _diff(embeds, records[0][0], mask) <= ATOL, "inputs_embeds with image features merged"
    is_image = batch["input_ids"] == case.config.image_token_id
    assert not np.asarray(deepstack_embeds)[:, ~is_image].any(), "DeepStack rows must be zero off image tokens"


def test_every_decoder_layer_and_deepstack_injection_match_transformers(traced):
    case, batch, records, final = traced
    mask = batch["attention_mask"].astype(bool)
    mask_info = attention.causal_mask_info(batch["attention_mask"], *batch["input_ids"].shape)
    _, deepstack_embeds = _embed(case.model, batch["input_ids"], batch["pixel_values"], batch["image_grid_thw"])
    layers = case.model.model.language_model.layers
    for i, (layer, (x_in, (cos, sin), x_out)) in enumerate(zip(layers, records)):
        ours = _layer(layer, _np(x_in), _np(cos), _np(sin), mask_info)
        assert _diff(ours, x_out, mask) <= ATOL, f"decoder layer {i}"
        if i + 1 < len(records):
            injected = _np(x_out) + (np.asarray(deepstack_embeds[i]) if i < deepstack_embeds.shape[0] else 0.0)
            assert _diff(injected, records[i + 1][0], mask) <= ATOL, f"DeepStack injection after layer {i}"
    assert deepstack_embeds.shape[0] == 2
    assert _diff(_norm(case.model.model.language_model.norm, _np(final[0])), final[1], mask) <= ATOL, "final norm"
