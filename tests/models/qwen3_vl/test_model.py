"""End-to-end logits against transformers, bf16 compute, input checks, the KV-cache seam and remat."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from support import tiny_hf

from ranger_jax.models.qwen3_vl import Qwen3VLConfig, attention, get_rope_index, init, load, text

ATOL = 1e-4


def _max_diff(ours, ref, mask) -> float:
    return float(np.abs(np.asarray(ours) - ref)[np.asarray(mask, bool)].max())


@pytest.mark.parametrize("name", ["scaled_8b", "tied", "minimal"])
def test_logits_match_transformers_with_images(checkpoints, image_batch, name):
    case = checkpoints(name)
    batch = image_batch(case.config)
    ref = tiny_hf.hf_logits(case.hf, batch)
    logits = case.model(batch["input_ids"], **tiny_hf.jax_inputs(batch))
    assert logits.dtype == jnp.float32 and logits.shape == ref.shape
    assert _max_diff(logits, ref, batch["attention_mask"]) <= ATOL


def test_einsum_kernel_logits_match_transformers(checkpoints, image_batch):
    case = checkpoints("scaled_8b")
    batch = image_batch(case.config)
    model = load(case.path, attention="einsum")
    logits = model(batch["input_ids"], **tiny_hf.jax_inputs(batch))
    assert _max_diff(logits, tiny_hf.hf_logits(case.hf, batch), batch["attention_mask"]) <= ATOL


@pytest.mark.parametrize("name", ["scaled_8b", "tied", "minimal"])
def test_logits_match_transformers_text_only(checkpoints, text_batch, name):
    case = checkpoints(name)
    batch = text_batch(case.config)
    ref = tiny_hf.hf_logits(case.hf, batch)
    logits = case.model(batch["input_ids"], attention_mask=batch["attention_mask"])
    assert _max_diff(logits, ref, batch["attention_mask"]) <= ATOL


def test_single_image_unpadded_without_attention_mask(checkpoints):
    case = checkpoints("minimal")
    batch = tiny_hf.make_batch(case.config, [[3, (4, 6), 5]], seed=3)  # a 64x96 image -> grid [1, 4, 6]
    ref = tiny_hf.hf_logits(case.hf, batch)
    logits = case.model(batch["input_ids"], pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"])
    assert np.abs(np.asarray(logits) - ref).max() <= ATOL


def test_bf16_compute_within_stated_tolerance(checkpoints, image_batch):
    """bf16 compute vs the float32 reference.

    Tolerance: bf16 keeps 8 significant bits (unit roundoff 2**-9 ~ 2e-3), so every matmul, norm and residual add
    rounds at ~0.2 % and the errors of 4 decoder layers + a 4-block tower accumulate to O(1e-2) on O(1) logits.
    We bound ours by transformers' own bf16 model on the same checkpoint: our max error may be at most 1.5x
    torch's (plus 0.02 slack for different rounding orders), and the mean error at most 1.5x torch's.
    """
    case = checkpoints("scaled_8b")
    batch = image_batch(case.config)
    mask = batch["attention_mask"].astype(bool)
    ref = tiny_hf.hf_logits(case.hf, batch)
    torch_bf16 = tiny_hf.hf_logits(tiny_hf.build_model(case.config, seed=case.seed, dtype=torch.bfloat16), batch)
    torch_err = np.abs(torch_bf16 - ref)[mask]
    model = load(case.path, dtype=jnp.bfloat16)
    assert model.model.language_model.layers[0].mlp.up_proj.weight[...].dtype == jnp.bfloat16
    logits = model(batch["input_ids"], **tiny_hf.jax_inputs(batch))
    assert logits.dtype == jnp.float32
    err = np.abs(np.asarray(logits) - ref)[mask]
    assert 1e-3 < err.max() <= 1.5 * torch_err.max() + 0.02
    assert err.mean() <= 1.5 * torch_err.mean()


def test_mixed_precision_fp32_params_bf16_compute(checkpoints, text_batch):
    case = checkpoints("minimal")
    batch = text_batch(case.config)
    ref = tiny_hf.hf_logits(case.hf, batch)
    model = load(case.path, dtype=jnp.bfloat16, param_dtype=jnp.float32)
    assert model.model.language_model.norm.weight[...].dtype == jnp.float32
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"])
    assert _max_diff(logits, ref, batch["attention_mask"]) <= 0.1


def test_traced_call_inside_user_jit_matches_eager(checkpoints, image_batch):
    case = checkpoints("minimal")
    batch = image_batch(case.config)
    kwargs = tiny_hf.jax_inputs(batch)
    eager = case.model(batch["input_ids"], **kwargs)
    traced = nnx.jit(lambda m, ids, kw: m(ids, **kw))(case.model, batch["input_ids"], kwargs)
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(traced))


def _check(model, batch, match, **changes):
    inputs = {**{"input_ids": batch["input_ids"]}, **tiny_hf.jax_inputs(batch), **changes}
    ids = inputs.pop("input_ids")
    with pytest.raises(ValueError, match=match):
        model(ids, **inputs)


def test_input_errors_name_the_counts():
    config = Qwen3VLConfig.tiny()
    model = init(config, seed=0)
    batch = tiny_hf.make_batch(config, [[2, (4, 6), 2], [3, (2, 2)]], padding_side=["right", "left"], seed=0)
    grid, pixels, ids = batch["image_grid_thw"], batch["pixel_values"], batch["input_ids"]
    _check(model, batch, r"image tokens \(7\) != merged patches \(8\) for grid_thw=\[\[1, 4, 6\], \[1, 4, 2\]\]",
           image_grid_thw=np.array([[1, 4, 6], [1, 4, 2]]), pixel_values=np.zeros((32, 1536), np.float32))
    _check(model, batch, r"pixel_values shape \(30, 1536\) != \(patches of image_grid_thw 28, 1536\)",
           pixel_values=np.zeros((30, 1536), np.float32))
    _check(model, batch, r"pixel_values and image_grid_thw must be given together", image_grid_thw=None)
    _check(model, batch, r"image tokens \(7\) != merged patches \(0\)", image_grid_thw=None, pixel_values=None)
    _check(model, batch, r"image_grid_thw must be \[num_images, 3\], got shape \(2, 2\)", image_grid_thw=grid[:, 1:])
    _check(model, batch, r"divisible by spatial_merge_size=2", image_grid_thw=np.array([[1, 4, 6], [1, 1, 4]]))
    _check(model, batch, r"attention_mask shape \(2, 5\) != input_ids shape", attention_mask=np.ones((2, 5)))
    with pytest.raises(ValueError, match=r"input_ids must be \[B, T\], got shape \(12,\)"):
        model(ids[0])
    outside = ids.copy()
    outside[1, 0] = 256
    _check(model, batch, r"input_ids hold 1 ids outside the vocabulary \[0, 256\), e.g. 256", input_ids=outside)
    padded = batch["attention_mask"].copy()
    padded[0, 3] = 0  # an image token of row 0
    _check(model, batch, r"1 image tokens sit at padded positions", attention_mask=padded)
    video = ids.copy()
    video[0, 0] = config.video_token_id
    _check(model, batch, r"hold 1 video tokens \(id 6\)", input_ids=video)
    split = ids.copy()
    split[0, 4], split[0, 9] = split[0, 9], split[0, 4]  # an image token swapped with trailing text
    _check(model, batch, r"placeholder tokens of image 0 \(grid \[1, 4, 6\]\) are not contiguous", input_ids=split)
    del pixels


_encode = nnx.jit(lambda m, pixel_values, grid: m.encode_images(pixel_values, grid))
_embed = nnx.jit(lambda m, ids, image_embeds=None, deepstack=None: m.embed(ids, image_embeds, deepstack))
_decode = nnx.jit(lambda m, embeds, positions, mask_info, deepstack, caches: m.decode(
    embeds, positions, mask_info, deepstack, caches))
_rope_index = jax.jit(get_rope_index, static_argnames=("image_token_id", "spatial_merge_size"))


@pytest.mark.parametrize("kernel", ["blocked", "einsum"])
def test_kv_cache_decode_matches_full_forward(checkpoints, kernel):
    """Prefill all but the last token into a cache, decode the last one: same logits as the full forward."""
    case = checkpoints("scaled_8b")
    model = case.model if kernel == case.model.config.attention else load(case.path, attention=kernel)
    config = model.config
    t = config.text_config
    batch = tiny_hf.make_batch(config, [[2, (4, 4), 3], [5]], padding_side=["right", "left"], seed=5)
    ids, mask, grid = batch["input_ids"], batch["attention_mask"], batch["image_grid_thw"]
    ids[1, -1] = ids[1, -2]  # both rows end in a real text token (row 0 was right-padded to the same length)
    full = np.asarray(model(ids, **tiny_hf.jax_inputs(batch)))
    batch_size, length = ids.shape
    rope_kw = dict(image_token_id=config.image_token_id, spatial_merge_size=2)

    slots = length + 2
    caches = tuple(text.KVCache(key=jnp.zeros((batch_size, t.num_key_value_heads, slots, t.head_dim)),
                                value=jnp.zeros((batch_size, t.num_key_value_heads, slots, t.head_dim)))
                   for _ in range(t.num_hidden_layers))
    prefix_mask = mask[:, :-1]
    kv_valid = np.zeros((batch_size, slots), bool)
    kv_valid[:, :length - 1] = prefix_mask
    image_embeds, deepstack = _encode(model, batch["pixel_values"], grid)
    positions, deltas = _rope_index(ids[:, :-1], grid, prefix_mask, **rope_kw)
    embeds, deepstack_embeds = _embed(model, ids[:, :-1], image_embeds, deepstack)
    prefill = attention.MaskInfo(query_slots=jnp.broadcast_to(jnp.arange(length - 1), (batch_size, length - 1)),
                                 kv_valid=jnp.asarray(kv_valid))
    _, caches = _decode(model, embeds, positions, prefill, deepstack_embeds, caches)

    kv_valid[:, length - 1] = True
    step = attention.MaskInfo(query_slots=jnp.full((batch_size, 1), length - 1), kv_valid=jnp.asarray(kv_valid))
    position = prefix_mask.sum(1) + np.asarray(deltas)  # n attended tokens + rope delta, on all 3 rows
    full_positions, _ = _rope_index(ids, grid, mask, **rope_kw)
    np.testing.assert_array_equal(np.asarray(full_positions)[:, :, -1], np.stack([position] * 3))
    embeds, _ = _embed(model, ids[:, -1:])
    positions = jnp.broadcast_to(jnp.asarray(position)[None, :, None], (3, batch_size, 1))
    hidden, caches = _decode(model, embeds, positions, step, None, caches)
    logits = nnx.jit(lambda m, h: m.compute_logits(h))(model, hidden)
    assert np.abs(np.asarray(logits)[:, 0] - full[:, -1]).max() <= 1e-5
    assert caches[0].key.shape == (batch_size, t.num_key_value_heads, slots, t.head_dim)


def test_remat_policies_give_identical_gradients():
    base = Qwen3VLConfig.tiny()
    ids = np.arange(8, 20).reshape(2, 6) % base.text_config.vocab_size

    def loss(model):
        return jnp.mean(jax.nn.log_softmax(model(ids))[..., 7])

    grads = {}
    for remat in ("none", "full"):
        model = init(dataclasses.replace(base, remat=remat), seed=0)
        jaxpr = str(jax.make_jaxpr(nnx.grad(loss))(model))
        assert ("checkpoint" in jaxpr or "remat" in jaxpr) == (remat != "none"), remat
        grads[remat] = nnx.jit(nnx.grad(loss))(model)
    for a, b in zip(jax.tree.leaves(grads["none"]), jax.tree.leaves(grads["full"]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
