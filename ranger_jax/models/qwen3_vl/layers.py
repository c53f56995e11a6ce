"""Leaf layers shared by the vision tower and the text decoder: Linear, Embedding, LayerNorm, RMSNorm.

Parameters are named like the torch modules they mirror (`weight`, `bias`), so a parameter path is its HF key.
Each carries logical axis names (`out_sharding=`) for `ranger_jax.parallel.rules`; placement on a mesh happens
when a model is built or loaded, never eagerly at construction (`eager_sharding=False`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


class Init(NamedTuple):
    """How a parameter is initialised; kept as `initializer` metadata so `init` can redraw it on the host."""

    kind: str  # "normal" | "ones" | "zeros"
    std: float = 0.0  # for "normal"

    def draw(self, key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
        """A fresh parameter of `shape` and `dtype`, drawn on device from `key`."""
        if self.kind == "normal":
            return (self.std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
        return (jnp.ones if self.kind == "ones" else jnp.zeros)(shape, dtype)

    def draw_host(self, rng: np.random.Generator, shape: tuple[int, ...], dtype: jnp.dtype) -> np.ndarray:
        """The same draw on the host, with numpy's generator `rng`."""
        if self.kind == "normal":
            return (self.std * rng.standard_normal(shape, dtype=np.float32)).astype(dtype)
        return (np.ones if self.kind == "ones" else np.zeros)(shape, dtype)


ONES, ZEROS = Init("ones"), Init("zeros")


def param(rngs: nnx.Rngs | None, init: Init, shape: Sequence[int], names: Sequence[str],
          dtype: jnp.dtype) -> nnx.Param:
    """An `nnx.Param` of `shape` carrying one logical axis name per dimension and its `Init`."""
    if len(names) != len(shape):
        raise ValueError(f"{len(names)} logical names {tuple(names)} for a parameter of shape {tuple(shape)}")
    key = rngs.params() if rngs is not None and init.kind == "normal" else None
    return nnx.Param(init.draw(key, tuple(shape), dtype), out_sharding=tuple(names), eager_sharding=False,
                     initializer=init)


class Linear(nnx.Module):
    """`y = x . W + b`, contracting the last `len(in_shape)` dims of x with the first dims of W.

    The weight is torch's `[out, in]` transposed to `[*in_shape, *out_shape]` (e.g. q_proj `[D, N, H]`); the
    checkpoint table records that layout change.
    """

    def __init__(self, in_shape: Sequence[int], out_shape: Sequence[int], in_names: Sequence[str],
                 out_names: Sequence[str], *, use_bias: bool, std: float, dtype: jnp.dtype, param_dtype: jnp.dtype,
                 rngs: nnx.Rngs):
        self.num_in_dims = len(in_shape)
        self.dtype = dtype
        self.weight = param(rngs, Init("normal", std), (*in_shape, *out_shape), (*in_names, *out_names), param_dtype)
        self.bias = param(rngs, ZEROS, out_shape, out_names, param_dtype) if use_bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        weight = self.weight[...].astype(self.dtype)
        in_shape = weight.shape[:self.num_in_dims]
        lead = x.shape[:x.ndim - self.num_in_dims]
        # leading axes flattened to one row axis: the weight gradient then contracts a single axis, which XLA:CPU
        # runs as one GEMM; contracting several leading axes makes it copy a transposed activation first
        y = jnp.tensordot(x.astype(self.dtype).reshape(-1, *in_shape), weight, axes=self.num_in_dims)
        y = y.reshape(*lead, *y.shape[1:])
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


class Embedding(nnx.Module):
    """A lookup table `weight: [rows, width]` (torch `nn.Embedding`)."""

    def __init__(self, rows: int, width: int, names: Sequence[str], *, std: float, dtype: jnp.dtype,
                 param_dtype: jnp.dtype, rngs: nnx.Rngs):
        self.dtype = dtype
        self.weight = param(rngs, Init("normal", std), (rows, width), names, param_dtype)

    def __call__(self, ids: jax.Array) -> jax.Array:
        # out-of-range ids are rejected on the host (`model.check_inputs`); clip keeps traced calls NaN-free
        return jnp.take(self.weight[...], ids, axis=0, mode="clip").astype(self.dtype)


class RMSNorm(nnx.Module):
    """Qwen3 RMSNorm: normalise in float32, cast back, then `weight * x` (no +1 offset)."""

    def __init__(self, width: int, names: Sequence[str], *, eps: float, param_dtype: jnp.dtype):
        self.eps = eps
        self.weight = param(None, ONES, (width,), names, param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * x32.astype(x.dtype)


class LayerNorm(nnx.Module):
    """torch `nn.LayerNorm` with affine weight and bias, computed in float32 and cast back."""

    def __init__(self, width: int, names: Sequence[str], *, eps: float, param_dtype: jnp.dtype):
        self.eps = eps
        self.weight = param(None, ONES, (width,), names, param_dtype)
        self.bias = param(None, ZEROS, (width,), names, param_dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        y = y * self.weight[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y.astype(x.dtype)

