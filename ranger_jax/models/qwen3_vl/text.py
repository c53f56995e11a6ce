"""The Qwen3-VL text decoder: RMSNorm, q/k-norm before interleaved MRoPE, GQA, SwiGLU, DeepStack residual adds.

Mirrors `Qwen3VLTextAttention`, `Qwen3VLTextMLP`, `Qwen3VLTextDecoderLayer` and `Qwen3VLTextModel` in transformers
`modeling_qwen3_vl.py`. Attention goes through a kernel chosen by `config.attention` (`attention.KERNELS`) and takes
an optional per-layer `KVCache`: new keys/values are written at the query slots and attention runs over all slots.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from ranger_jax.models.qwen3_vl import attention, layers, rope
from ranger_jax.models.qwen3_vl import config as config_lib
from ranger_jax.parallel import rules
from ranger_jax.parallel.rules import constrain


class KVCache(NamedTuple):
    """Keys and values of one decoder layer, by slot."""

    key: jax.Array  # [B, K, S, H], rotated keys, heads-major so attention reads them without a transpose
    value: jax.Array  # [B, K, S, H]


def write_cache(cache: KVCache, k: jax.Array, v: jax.Array, query_slots: jax.Array) -> KVCache:
    """Writes `k, v: [B, T, K, H]` into `cache` ([B, K, S, H]) at `query_slots: [B, T]`."""
    rows = jnp.arange(k.shape[0])[:, None]
    # advanced indices around a slice: the indexed view is [B, T, K, H], the layout of k and v
    return KVCache(key=cache.key.at[rows, :, query_slots].set(k.astype(cache.key.dtype)),
                   value=cache.value.at[rows, :, query_slots].set(v.astype(cache.value.dtype)))


class TextMLP(nnx.Module):
    """SwiGLU: `down_proj(act(gate_proj(x)) * up_proj(x))`, no biases."""

    def __init__(self, config: config_lib.Qwen3VLConfig, *, rngs: nnx.Rngs):
        t = config.text_config
        kw = dict(use_bias=False, std=t.initializer_range, dtype=config.compute_dtype,
                  param_dtype=config.parameter_dtype, rngs=rngs)
        self.act = t.hidden_act
        self.gate_proj = layers.Linear((t.hidden_size,), (t.intermediate_size,), ("embed",), ("mlp",), **kw)
        self.up_proj = layers.Linear((t.hidden_size,), (t.intermediate_size,), ("embed",), ("mlp",), **kw)
        self.down_proj = layers.Linear((t.intermediate_size,), (t.hidden_size,), ("mlp",), ("embed",), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        """x: [B, T, D] -> [B, T, D]."""
        hidden = config_lib.ACTIVATIONS[self.act](self.gate_proj(x)) * self.up_proj(x)  # [B, T, F]
        return self.down_proj(constrain(hidden, "batch", "seq", "mlp"))


class TextAttention(nnx.Module):
    """Causal grouped-query attention with per-head q/k RMSNorm applied before RoPE."""

    def __init__(self, config: config_lib.Qwen3VLConfig, *, rngs: nnx.Rngs):
        t = config.text_config
        d, n, k, h = t.hidden_size, t.num_attention_heads, t.num_key_value_heads, t.head_dim
        kw = dict(use_bias=t.attention_bias, std=t.initializer_range, dtype=config.compute_dtype,
                  param_dtype=config.parameter_dtype, rngs=rngs)
        self.kernel = config.attention
        self.num_key_value_groups = t.num_key_value_groups
        self.scale = h**-0.5
        self.q_proj = layers.Linear((d,), (n, h), ("embed",), ("heads", "head_dim"), **kw)
        self.k_proj = layers.Linear((d,), (k, h), ("embed",), ("kv_heads", "head_dim"), **kw)
        self.v_proj = layers.Linear((d,), (k, h), ("embed",), ("kv_heads", "head_dim"), **kw)
        self.o_proj = layers.Linear((n, h), (d,), ("heads", "head_dim"), ("embed",), **kw)
        # q_norm / k_norm act per head, over head_dim only, before RoPE
        self.q_norm = layers.RMSNorm(h, ("head_dim",), eps=t.rms_norm_eps, param_dtype=config.parameter_dtype)
        self.k_norm = layers.RMSNorm(h, ("head_dim",), eps=t.rms_norm_eps, param_dtype=config.parameter_dtype)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask_info: attention.MaskInfo,
                 cache: KVCache | None = None) -> tuple[jax.Array, KVCache | None]:
        """Attends from the T new tokens to all slots (the T tokens themselves, or the cache after writing them).

        Args:
            x: [B, T, D] normalised hidden states.
            cos, sin: [B, T, H] MRoPE tables (`rope.mrope_cos_sin`).
            mask_info: query slots and valid kv slots.
            cache: this layer's keys/values, or None to attend within x only.

        Returns:
            ([B, T, D], the cache with the new keys/values written, or None).
        """
        q = self.q_norm(self.q_proj(x))  # [B, T, N, H]
        k = self.k_norm(self.k_proj(x))  # [B, T, K, H]
        v = self.v_proj(x)  # [B, T, K, H]
        q = rope.apply_rotary(q, cos[:, :, None, :], sin[:, :, None, :])
        k = rope.apply_rotary(k, cos[:, :, None, :], sin[:, :, None, :])
        q = constrain(q, "batch", "seq", "heads", "head_dim")
        k = constrain(k, "batch", "seq", "kv_heads", "head_dim")
        v = constrain(v, "batch", "seq", "kv_heads", "head_dim")
        if cache is not None:
            cache = write_cache(cache, k, v, mask_info.query_slots)
            k, v = cache.key.astype(q.dtype), cache.value.astype(q.dtype)  # [B, K, S, H]
        else:
            k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, T, H], the kernels' layout
        batch, length, heads, head_dim = q.shape
        q = q.reshape(batch, length, heads // self.num_key_value_groups, self.num_key_value_groups, head_dim)
        out = attention.KERNELS[self.kernel](q, k, v, mask_info, scale=self.scale)  # [B, T, K, G, H]
        out = constrain(out.reshape(batch, length, heads, head_dim), "batch", "seq", "heads", "head_dim")
        return self.o_proj(out), cache


class TextDecoderLayer(nnx.Module):
    """Pre-norm block: `x += attn(RMSNorm(x))`, then `x += mlp(RMSNorm(x))`."""

    def __init__(self, config: config_lib.Qwen3VLConfig, *, rngs: nnx.Rngs):
        t = config.text_config
        self.self_attn = TextAttention(config, rngs=rngs)
        self.mlp = TextMLP(config, rngs=rngs)
        norm = dict(eps=t.rms_norm_eps, param_dtype=config.parameter_dtype)
        self.input_layernorm = layers.RMSNorm(t.hidden_size, ("embed",), **norm)
        self.post_attention_layernorm = layers.RMSNorm(t.hidden_size, ("embed",), **norm)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask_info: attention.MaskInfo,
                 cache: KVCache | None = None) -> tuple[jax.Array, KVCache | None]:
        """x: [B, T, D] -> ([B, T, D], cache); see `TextAttention.__call__`."""
        with jax.named_scope("attention"):
            h, cache = self.self_attn(self.input_layernorm(x), cos, sin, mask_info, cache)
            x = constrain(x + h, "batch", "seq", "embed")
        with jax.named_scope("mlp"):
            x = constrain(x + self.mlp(self.post_attention_layernorm(x)), "batch", "seq", "embed")
        return x, cache


def _run_layer(layer: TextDecoderLayer, x, cos, sin, mask_info, cache):
    return layer(x, cos, sin, mask_info, cache)


class TextModel(nnx.Module):
    """Token embedding, the decoder stack with DeepStack adds, and the final norm (`Qwen3VLTextModel`)."""

    def __init__(self, config: config_lib.Qwen3VLConfig, *, rngs: nnx.Rngs):
        t = config.text_config
        self.config = config
        self.embed_tokens = layers.Embedding(t.vocab_size, t.hidden_size, ("vocab", "embed"), std=t.initializer_range,
                                             dtype=config.compute_dtype, param_dtype=config.parameter_dtype, rngs=rngs)
        self.layers = nnx.List([TextDecoderLayer(config, rngs=rngs) for _ in range(t.num_hidden_layers)])
        self.norm = layers.RMSNorm(t.hidden_size, ("embed",), eps=t.rms_norm_eps, param_dtype=config.parameter_dtype)

    def __call__(self, inputs_embeds: jax.Array, positions: jax.Array, mask_info: attention.MaskInfo,
                 deepstack_embeds: jax.Array | None = None,
                 caches: tuple[KVCache, ...] | None = None) -> tuple[jax.Array, tuple[KVCache, ...] | None]:
        """Runs the decoder stack.

        Args:
            inputs_embeds: [B, T, D] token embeddings with image features merged in.
            positions: [3, B, T] int32 MRoPE positions (`rope.get_rope_index`, or `n + rope_delta` when decoding).
            mask_info: query slots and valid kv slots (`attention.causal_mask_info` without a cache).
            deepstack_embeds: [L_ds, B, T, D], zero at non-visual positions; added after decoder layer i < L_ds.
            caches: one `KVCache` per layer, or None.

        Returns:
            (hidden [B, T, D] after the final norm, the updated caches or None).
        """
        with rules.use_rules(self.config.sharding_rules):
            cos, sin = rope.mrope_cos_sin(positions, self.config.text_config, self.config.compute_dtype)
            policy = config_lib.REMAT_POLICIES[self.config.remat]
            run = _run_layer if self.config.remat == "none" else nnx.remat(_run_layer, policy=policy)
            x = constrain(inputs_embeds.astype(self.config.compute_dtype), "batch", "seq", "embed")
            new_caches = []
            for i, layer in enumerate(self.layers):
                x, cache = run(layer, x, cos, sin, mask_info, None if caches is None else caches[i])
                new_caches.append(cache)
                if deepstack_embeds is not None and i < deepstack_embeds.shape[0]:
                    x = x + deepstack_embeds[i].astype(x.dtype)  # DeepStack: visual rows only (zeros elsewhere)
            with jax.named_scope("final_norm"):
                x = self.norm(x)
        return x, (None if caches is None else tuple(new_caches))
