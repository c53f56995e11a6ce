"""The head-fused cross-entropy: against log_softmax over full logits (value and gradients), and `causal_lm_loss`
against transformers' own `labels=` loss on padded batches, with a loss mask, images and a tied head."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from support import tiny_hf

from ranger_jax.models.qwen3_vl import loss


def _naive(hidden, weight, targets, weights):
    log_probs = jax.nn.log_softmax(jnp.dot(hidden, weight, precision="highest"), axis=-1)
    return -jnp.sum(weights * jnp.take_along_axis(log_probs, targets[:, None], axis=-1)[:, 0])


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.standard_normal((37, 16)), jnp.float32)
    weight = jnp.asarray(0.3 * rng.standard_normal((16, 50)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 50, 37), jnp.int32)
    weights = jnp.asarray(rng.random(37) * (rng.random(37) > 0.2), jnp.float32)  # some rows dropped
    return hidden, weight, targets, weights


def test_fused_cross_entropy_matches_full_logits(rows):
    hidden, weight, targets, weights = rows
    fused = jax.jit(lambda h, w: loss.fused_cross_entropy(h, w, targets, weights, chunk=8))  # 37 rows: 5 chunks
    assert float(fused(hidden, weight)) == pytest.approx(float(_naive(hidden, weight, targets, weights)), rel=1e-6)
    grads = jax.jit(jax.grad(lambda h, w: 2.5 * fused(h, w), argnums=(0, 1)))(hidden, weight)
    ref = jax.grad(lambda h, w: 2.5 * _naive(h, w, targets, weights), argnums=(0, 1))(hidden, weight)
    for name, ours, theirs in zip(("hidden", "weight"), grads, ref, strict=True):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=2e-6, err_msg=name)


def test_fused_cross_entropy_bf16_inputs_give_float32_loss(rows):
    hidden, weight, targets, weights = rows
    value, grads = jax.value_and_grad(loss.fused_cross_entropy, argnums=(0, 1))(
        hidden.astype(jnp.bfloat16), weight.astype(jnp.bfloat16), targets, weights, chunk=16)
    assert value.dtype == jnp.float32 and grads[0].dtype == grads[1].dtype == jnp.bfloat16
    # bf16 inputs (2**-9 relative rounding) on O(10) per-row losses summed over 37 rows
    assert float(value) == pytest.approx(float(_naive(hidden, weight, targets, weights)), rel=1e-2)


def _hf_loss(case, batch, labels) -> float:
    with torch.no_grad():
        out = case.hf(**tiny_hf.torch_inputs(batch), labels=torch.from_numpy(labels))
    return float(out.loss)


def _labels(batch, loss_mask=None) -> np.ndarray:
    """transformers labels for our rule: token t counts when it and its predictor t-1 are attended (and in mask)."""
    mask = batch["attention_mask"].astype(bool)
    counted = mask & np.roll(mask, 1, axis=1)
    if loss_mask is not None:
        counted &= loss_mask.astype(bool)
    return np.where(counted, batch["input_ids"], -100)


@pytest.mark.parametrize("name", ["scaled_8b", "tied"])
def test_causal_lm_loss_matches_transformers_with_images_and_padding(checkpoints, image_batch, name):
    case = checkpoints(name)
    batch = image_batch(case.config)  # right- and left-padded rows, several images
    loss_mask = np.random.default_rng(3).random(batch["input_ids"].shape) > 0.3
    for mask in (None, loss_mask):
        ours = loss.causal_lm_loss(case.model, batch["input_ids"], **tiny_hf.jax_inputs(batch), loss_mask=mask,
                                   chunk=16)
        assert float(ours) == pytest.approx(_hf_loss(case, batch, _labels(batch, mask)), rel=2e-5)


def test_causal_lm_loss_gradients_equal_full_logits_gradients(checkpoints, text_batch):
    case = checkpoints("tied")  # tied head: gradients reach embed_tokens through the loss and the lookup
    batch = text_batch(case.config)
    ids, mask = jnp.asarray(batch["input_ids"]), jnp.asarray(batch["attention_mask"])
    labels = jnp.asarray(_labels(batch))

    def full_logits_loss(model):
        log_probs = jax.nn.log_softmax(model(ids, attention_mask=mask)[:, :-1], axis=-1)
        target = labels[:, 1:]
        picked = jnp.take_along_axis(log_probs, jnp.maximum(target, 0)[..., None], axis=-1)[..., 0]
        return -jnp.sum(jnp.where(target >= 0, picked, 0.0)) / jnp.sum(target >= 0)

    fused = nnx.jit(nnx.value_and_grad(lambda m: loss.causal_lm_loss(m, ids, attention_mask=mask, chunk=8)))
    value, grads = fused(case.model)
    ref_value, ref_grads = nnx.value_and_grad(full_logits_loss)(case.model)
    assert float(value) == pytest.approx(float(ref_value), rel=1e-6)
    for (path, ours), (_, theirs) in zip(nnx.to_flat_state(grads), nnx.to_flat_state(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(ours[...]), np.asarray(theirs[...]), atol=2e-6, err_msg=str(path))


def test_causal_lm_loss_without_counted_positions_is_zero(checkpoints, text_batch):
    case = checkpoints("tied")
    batch = text_batch(case.config)
    value = loss.causal_lm_loss(case.model, batch["input_ids"], attention_mask=batch["attention_mask"],
                                loss_mask=np.zeros_like(batch["input_ids"]))
    assert float(value) == 0.0


def test_chunk_rows_keep_logits_within_the_budget():
    for vocab in (50, 32000, 151936, 10**6):
        rows = loss.chunk_rows(vocab)
        assert rows % loss.CHUNK_ALIGN == 0 and rows >= loss.CHUNK_ALIGN
        assert rows * vocab <= max(loss.CHUNK_ELEMENTS, loss.CHUNK_ALIGN * vocab)
    assert loss.chunk_rows(32000) == 2048


def test_default_chunk_equals_explicit_chunks(rows):
    hidden, weight, targets, weights = rows
    grad = jax.grad(loss.fused_cross_entropy, argnums=(0, 1))
    default = grad(hidden, weight, targets, weights)
    explicit = grad(hidden, weight, targets, weights, chunk=5)
    for ours, theirs in zip(default, explicit, strict=True):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=2e-6)


def test_chunk_below_one_row_is_rejected(rows):
    with pytest.raises(ValueError, match="chunk=0"):
        loss.fused_cross_entropy(*rows, chunk=0)


def test_token_logprobs_match_full_logits_values_and_gradients(rows):
    hidden, weight, targets, _ = rows
    cotangent = jnp.asarray(np.random.default_rng(1).standard_normal(37), jnp.float32)

    def naive(h, w):
        log_probs = jax.nn.log_softmax(jnp.dot(h, w, precision="highest"), axis=-1)
        return jnp.take_along_axis(log_probs, targets[:, None], axis=-1)[:, 0]

    fused = jax.jit(lambda h, w: loss.token_logprobs(h, w, targets, chunk=8))  # 37 rows: 5 chunks, last padded
    values = fused(hidden, weight)
    assert values.dtype == jnp.float32 and values.shape == (37,)
    np.testing.assert_allclose(np.asarray(values), np.asarray(naive(hidden, weight)), atol=1e-6)
    grads = jax.jit(jax.vjp(fused, hidden, weight)[1])(cotangent)
    ref = jax.vjp(naive, hidden, weight)[1](cotangent)
    for name, ours, theirs in zip(("hidden", "weight"), grads, ref, strict=True):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=2e-6, err_msg=name)


def test_token_logprobs_rejects_mismatched_shapes(rows):
    hidden, weight, targets, _ = rows
    with pytest.raises(ValueError, match=r"targets shape \(36,\) != \(37,\)"):
        loss.token_logprobs(hidden, weight, targets[:-1])
    with pytest.raises(ValueError, match=r"weight \(50, 16\)"):
        loss.token_logprobs(hidden, weight.T, targets)
    with pytest.raises(ValueError, match="chunk=0"):
        loss.token_logprobs(hidden, weight, targets, chunk=0)


def _hf_token_logprobs(case, batch) -> np.ndarray:
    """transformers' logits -> log_softmax (float64), token-aligned, 0 where token or predictor is a pad."""
    logits = torch.from_numpy(tiny_hf.hf_logits(case.hf, batch)).double()
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
    ids = torch.from_numpy(batch["input_ids"])[:, 1:]
    picked = torch.gather(log_probs, -1, ids[..., None])[..., 0].numpy()
    mask = batch["attention_mask"].astype(bool)
    picked = np.where(mask[:, 1:] & mask[:, :-1], picked, 0.0)
    return np.pad(picked, ((0, 0), (1, 0)))


def test_sequence_logprobs_match_transformers_with_images_and_padding(checkpoints, image_batch):
    case = checkpoints("scaled_8b")
    batch = image_batch(case.config)  # right- and left-padded rows, several images
    ours = nnx.jit(functools.partial(loss.sequence_logprobs, chunk=16))(case.model, batch["input_ids"],
                                                                          **tiny_hf.jax_inputs(batch))
    assert ours.dtype == jnp.float32 and ours.shape == batch["input_ids"].shape
    theirs = _hf_token_logprobs(case, batch)
    assert np.all(np.asarray(ours)[theirs == 0.0] == 0.0)  # t = 0, pads, first token after left padding
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-5, rtol=0)


def test_sequence_logprobs_gradients_equal_full_logits_gradients(checkpoints, text_batch):
    case = checkpoints("tied")  # tied head: gradients reach embed_tokens through the head and the lookup
    batch = text_batch(case.config)
    ids, mask = jnp.asarray(batch["input_ids"]), jnp.asarray(batch["attention_mask"])
    scale = jnp.asarray(np.random.default_rng(4).standard_normal(ids.shape), jnp.float32)
    live = (mask[:, 1:] * mask[:, :-1]).astype(bool)

    def full_logits(model):
        log_probs = jax.nn.log_softmax(model(ids, attention_mask=mask)[:, :-1], axis=-1)
        picked = jnp.take_along_axis(log_probs, ids[:, 1:, None], axis=-1)[..., 0]
        return jnp.sum(scale[:, 1:] * jnp.where(live, picked, 0.0))

    fused = nnx.jit(nnx.value_and_grad(
        lambda m: jnp.sum(scale * loss.sequence_logprobs(m, ids, attention_mask=mask, chunk=8))))
    value, grads = fused(case.model)
    ref_value, ref_grads = nnx.jit(nnx.value_and_grad(full_logits))(case.model)
    assert float(value) == pytest.approx(float(ref_value), rel=1e-6)
    for (path, ours), (_, theirs) in zip(nnx.to_flat_state(grads), nnx.to_flat_state(ref_grads), strict=True):
        theirs = np.asarray(theirs[...])  # a sum over tokens: gradients up to ~50, float32 noise ~1e-6 of that
        np.testing.assert_allclose(np.asarray(ours[...]), theirs, atol=2e-6 * max(1.0, np.abs(theirs).max()),
                                   err_msg=str(path))
