"""The blocked attention kernel: against the einsum kernel (values and gradients, padded batches, KV-cache slots,
several blocks), against transformers end to end with blocks small enough that every sequence spans several, and
the block skipping itself (key blocks no query can see are never read)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import tiny_hf

from ranger_jax.models.qwen3_vl import attention, attention_blocked, load

SCALE = 0.3
# (batch, length T, slots S, kv heads K, groups G, head_dim H, block_q, block_k, layout)
CASES = {
    "padded_several_blocks": (3, 37, 37, 2, 2, 8, 8, 16, "padded"),  # T not a multiple of either block
    "one_block_gqa4": (2, 20, 20, 1, 4, 8, 32, 32, "padded"),  # T < block: a single short block
    "cache_slots": (2, 5, 40, 2, 2, 8, 4, 8, "cache"),  # queries at slots 10.. and 3.. of a 40-slot cache
}


def _case(name: str, seed: int = 0):
    batch, length, slots, heads_kv, groups, head_dim, block_q, block_k, layout = CASES[name]
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((batch, length, heads_kv, groups, head_dim)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((batch, heads_kv, slots, head_dim)), jnp.float32)  # heads-major
    v = jnp.asarray(rng.standard_normal((batch, heads_kv, slots, head_dim)), jnp.float32)
    if layout == "padded":
        mask = np.ones((batch, length), np.int32)
        mask[0, :5] = 0  # left pads
        mask[-1, length - 4:] = 0  # right pads
        mask_info = attention.causal_mask_info(jnp.asarray(mask), batch, length)
        rows = mask.astype(bool)
    else:
        query_slots = np.stack([np.arange(length) + 10, np.arange(length) + 3])
        valid = np.zeros((batch, slots), bool)
        valid[0, :10 + length] = True
        valid[1, 1:3 + length] = True  # slot 0 of row 1 holds a pad
        mask_info = attention.MaskInfo(jnp.asarray(query_slots), jnp.asarray(valid))
        rows = np.ones((batch, length), bool)
    kernel = functools.partial(attention_blocked.blocked_attention, block_q=block_q, block_k=block_k)
    return q, k, v, mask_info, rows, kernel


def _loss(kernel, mask_info, rows):
    weight = jnp.asarray(rows, jnp.float32)[:, :, None, None, None]
    return lambda q, k, v: jnp.sum(kernel(q, k, v, mask_info, scale=SCALE) * weight * jnp.sin(q))


@pytest.mark.parametrize("name", sorted(CASES))
def test_blocked_matches_einsum_values_and_gradients(name):
    q, k, v, mask_info, rows, kernel = _case(name)
    ref = attention.einsum_attention(q, k, v, mask_info, scale=SCALE)
    out = jax.jit(lambda q, k, v, m: kernel(q, k, v, m, scale=SCALE))(q, k, v, mask_info)
    assert out.shape == ref.shape and out.dtype == jnp.float32
    assert float(jnp.abs(out - ref)[rows].max()) <= 1e-5
    assert bool(jnp.isfinite(out).all()), "rows that see no slot must stay finite"
    grads = jax.jit(jax.grad(_loss(kernel, mask_info, rows), argnums=(0, 1, 2)))(q, k, v)
    ref_grads = jax.grad(_loss(attention.einsum_attention, mask_info, rows), argnums=(0, 1, 2))(q, k, v)
    for name_, ours, theirs in zip("qkv", grads, ref_grads, strict=True):
        assert float(jnp.abs(ours - theirs).max()) <= 1e-5, f"d{name_}"


def test_blocked_bf16_close_to_float32():
    q, k, v, mask_info, rows, kernel = _case("padded_several_blocks", seed=1)
    ref = attention.einsum_attention(q, k, v, mask_info, scale=SCALE)
    out = kernel(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), mask_info, scale=SCALE)
    assert out.dtype == jnp.bfloat16
    # inputs rounded to 8 bits (2**-9 relative) and p cast to bf16 before P V: outputs of size ~1 within a few 1e-2
    assert float(jnp.abs(out.astype(jnp.float32) - ref)[rows].max()) <= 0.05


def test_key_blocks_beyond_every_query_are_never_read():
    """NaN keys/values in slots past every query's slot: the einsum kernel's P·V turns them into NaN (0 * NaN), the
    blocked kernel does not visit those blocks at all."""
    q, k, v, mask_info, rows, kernel = _case("cache_slots")
    reachable = int(np.max(np.asarray(mask_info.query_slots)))  # 14: blocks of 8 slots -> blocks 0 and 1 only
    poisoned_k = k.at[:, :, 16:].set(jnp.nan)
    poisoned_v = v.at[:, :, 16:].set(jnp.nan)
    assert reachable < 16
    assert bool(jnp.isnan(attention.einsum_attention(q, poisoned_k, poisoned_v, mask_info, scale=SCALE)).any())
    out = kernel(q, poisoned_k, poisoned_v, mask_info, scale=SCALE)
    np.testing.assert_allclose(np.asarray(out), np.asarray(kernel(q, k, v, mask_info, scale=SCALE)), atol=0)


@pytest.fixture
def small_blocks(monkeypatch):
    """A kernel name whose blocks (2 queries x 2 keys) make every test sequence span several blocks."""
    kernel = functools.partial(attention_blocked.blocked_attention, block_q=2, block_k=2)
    monkeypatch.setitem(attention.KERNELS, "blocked_2x2", kernel)
    return "blocked_2x2"


@pytest.mark.parametrize("name,batch_kind", [("scaled_8b", "image"), ("tied", "text")])
def test_logits_match_transformers_with_several_blocks(checkpoints, image_batch, text_batch, small_blocks, name,
                                                        batch_kind):
    case = checkpoints(name)
    batch = (image_batch if batch_kind == "image" else text_batch)(case.config)
    assert batch["input_ids"].shape[1] > 3 * 2
    model = load(case.path, attention=small_blocks)
    logits = model(batch["input_ids"], **tiny_hf.jax_inputs(batch))
    ref = tiny_hf.hf_logits(case.hf, batch)
    mask = batch["attention_mask"].astype(bool)
    assert float(np.abs(np.asarray(logits) - ref)[mask].max()) <= 1e-4


def test_default_kernel_is_blocked(checkpoints):
    assert checkpoints("scaled_8b").model.config.attention == "blocked"
