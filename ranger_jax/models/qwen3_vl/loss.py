"""Next-token cross-entropy fused with the LM head, computed in token chunks so [B, T, V] logits never exist.

For hidden rows `h_t` (final norm applied), head `W: [D, V]`, targets `y_t` and per-row weights `w_t`:

    loss = Σ_t w_t · (logsumexp(h_t W) − (h_t W)[y_t])

`fused_cross_entropy` evaluates it chunk by chunk (`lax.scan` over `chunk_rows(V)` rows). Under differentiation its forward
pass also forms the gradients, because they need nothing but the chunk's own softmax:
`∂loss/∂logits_t = w_t · (softmax(h_t W) − onehot(y_t))`, so `dh_t = ∂logits_t Wᵀ` and `dW = Σ_t h_tᵀ ∂logits_t`;
the backward pass only scales them by the incoming cotangent (the "fused linear cross-entropy" of Liger-Kernel,
Hsu et al. 2024, §3.1). The head thus costs the same three matmuls as autodiff through full logits, without
writing, re-reading and transposing [B·T, V] float32 arrays. Logits, softmax and the loss are float32; matmul
inputs stay in the compute dtype.

`causal_lm_loss` is transformers' `ForCausalLMLoss` on a model: the mean over predicted tokens of the cross-entropy
of token t+1 given tokens ≤ t, skipping pads and positions a `loss_mask` leaves out.

`token_logprobs` gives the per-row log-probabilities `(h_t W)[y_t] − logsumexp(h_t W)` from the same chunked head
(for policy-gradient losses, whose weights are only known after the log-probs). Its cotangent is per row, so the
backward pass recomputes each chunk's logits from the saved `logsumexp` and forms
`∂/∂logits_t = g_t · (onehot(y_t) − softmax(h_t W))`. `sequence_logprobs` applies it to a model's batch,
token-aligned: `logp[:, t] = log p(input_ids[:, t] | input_ids[:, :t])`, 0 at t = 0 and at pads.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

CHUNK_ELEMENTS = 2**26  # logits per chunk: [c, V] float32 arrays of at most 256 MiB live at a time
CHUNK_ALIGN = 128  # rows per chunk are a multiple of this (at least one multiple)


def chunk_rows(vocab_size: int) -> int:
    """Rows per chunk for a vocabulary: as many as keep a chunk's logits within CHUNK_ELEMENTS.

    Bigger chunks mean fewer read-modify-writes of the [D, V] head gradient (2048 rows at V = 32000 run the head
    about 20% faster on CPU than 512); the bound keeps a 152k-token vocabulary at 384 rows (~233 MiB per array).
    """
    return max(CHUNK_ALIGN, CHUNK_ELEMENTS // vocab_size // CHUNK_ALIGN * CHUNK_ALIGN)


def _split(x, chunk):
    """[R, ...] rows zero-padded to a multiple of c = min(chunk, R) and split: [n, c, ...]."""
    rows = x.shape[0]
    chunk = min(chunk, rows)
    count = -(-rows // chunk)
    pad = count * chunk - rows
    return jnp.pad(x, ((0, pad),) + ((0, 0),) * (x.ndim - 1)).reshape(count, chunk, *x.shape[1:])


def _chunks(hidden, targets, weights, chunk):
    """Rows padded to a multiple of `chunk` (weight 0) and split: [n, c, D], [n, c], [n, c]."""
    return _split(hidden, chunk), _split(targets, chunk), _split(weights, chunk)


def _chunk_loss(h, weight, targets, weights):
    """The chunk's weighted cross-entropy (float32), forward only."""
    logits = jnp.einsum("TD,DV->TV", h, weight, preferred_element_type=jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
    return jnp.sum(weights * (lse - picked))


def _value(hidden, weight, targets, weights, chunk):
    hs, ts, ws = _chunks(hidden, targets, weights, chunk)

    def body(total, inputs):
        return total + _chunk_loss(inputs[0], weight, inputs[1], inputs[2]), None

    return jax.lax.scan(body, jnp.float32(0), (hs, ts, ws))[0]


def _value_and_grads(hidden, weight, targets, weights, chunk):
    """(loss, d loss / d hidden [R, D], d loss / d weight [D, V]) in one pass over the chunks."""
    rows = hidden.shape[0]
    hs, ts, ws = _chunks(hidden, targets, weights, chunk)
    weight_t = weight.T  # [V, D], laid out once so each chunk's d_hidden is a plain [c, V] @ [V, D]

    def body(carry, inputs):
        total, d_weight = carry
        h, t, w = inputs
        logits = jnp.einsum("TD,DV->TV", h, weight, preferred_element_type=jnp.float32)
        # one exp pass serves both the loss (log Σ e) and its gradient (e / Σ e): logsumexp would take a second
        peak = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
        shifted = jnp.exp(logits - peak)
        total_mass = jnp.sum(shifted, axis=-1)
        picked = jnp.take_along_axis(logits, t[:, None], axis=-1)[:, 0]
        loss = jnp.sum(w * (peak[:, 0] + jnp.log(total_mass) - picked))
        onehot = jnp.arange(logits.shape[1], dtype=jnp.int32)[None, :] == t[:, None]
        d_logits = (shifted * (w / total_mass)[:, None] - jnp.where(onehot, w[:, None], 0.0)).astype(h.dtype)
        d_h = jnp.einsum("TV,VD->TD", d_logits, weight_t, preferred_element_type=jnp.float32)
        d_weight = d_weight + jnp.einsum("TD,TV->DV", h, d_logits, preferred_element_type=jnp.float32)
        return (total + loss, d_weight), d_h

    init = (jnp.float32(0), jnp.zeros(weight.shape, jnp.float32))
    (loss, d_weight), d_hidden = jax.lax.scan(body, init, (hs, ts, ws))
    d_hidden = d_hidden.reshape(-1, hidden.shape[1])[:rows]
    return loss, d_hidden.astype(hidden.dtype), d_weight.astype(weight.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _fused(hidden, weight, targets, weights, chunk):
    return _value(hidden, weight, targets, weights, chunk)


def _fused_fwd(hidden, weight, targets, weights, chunk):
    loss, d_hidden, d_weight = _value_and_grads(hidden, weight, targets, weights, chunk)
    return loss, (d_hidden, d_weight, weights)


def _fused_bwd(chunk, residuals, cotangent):
    d_hidden, d_weight, weights = residuals
    return (cotangent * d_hidden).astype(d_hidden.dtype), (cotangent * d_weight).astype(d_weight.dtype), None, \
        jnp.zeros_like(weights)


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_cross_entropy(hidden: jax.Array, weight: jax.Array, targets: jax.Array, weights: jax.Array, *,
                        chunk: int | None = None) -> jax.Array:
    """`Σ_t weights_t · CE(hidden_t · weight, targets_t)` without materialising the logits.

    Args:
        hidden: [R, D] rows (any number of leading axes flattened by the caller), in the compute dtype.
        weight: [D, V] the LM head.
        targets: [R] int, the token each row predicts (any id in [0, V) where its weight is 0).
        weights: [R] float32 per-row weights (0 drops a row; 1 / count gives a mean).
        chunk: rows per step of the scan over rows; None = `chunk_rows(V)`.

    Returns:
        float32 scalar. Differentiable in `hidden` and `weight` (not in `weights`).
    """
    chunk = chunk_rows(weight.shape[1]) if chunk is None else int(chunk)
    if chunk < 1:
        raise ValueError(f"fused_cross_entropy needs chunk >= 1 rows, got chunk={chunk}")
    return _fused(hidden, weight, targets.astype(jnp.int32), weights.astype(jnp.float32), chunk)


def causal_lm_loss(model, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
                   pixel_values: jax.Array | None = None, image_grid_thw: jax.Array | None = None,
                   loss_mask: jax.Array | None = None, chunk: int | None = None) -> jax.Array:
    """Mean next-token cross-entropy of a `Qwen3VL` on a padded batch (transformers' `ForCausalLMLoss`).

    Position t predicts token t+1; it counts when both are attended (`attention_mask`) and token t+1 is in
    `loss_mask` (e.g. assistant tokens only), as transformers does with labels = -100 elsewhere.

    Args:
        model: a `Qwen3VL`.
        input_ids: [B, T] int.
        attention_mask: [B, T], 0 at pads; None = no pads.
        pixel_values: [P, I] patch rows of the batch's images, or None.
        image_grid_thw: [num_images, 3], or None.
        loss_mask: [B, T], 1 at tokens whose prediction is scored; None = every attended token.
        chunk: rows per chunk of `fused_cross_entropy` (None: sized by the vocabulary).

    Returns:
        float32 scalar (0 when no position counts).
    """
    input_ids = jnp.asarray(input_ids)
    batch, length = input_ids.shape
    counted = jnp.ones((batch, length), bool) if attention_mask is None else jnp.asarray(attention_mask).astype(bool)
    if loss_mask is not None:
        counted = counted & jnp.asarray(loss_mask).astype(bool)
    if attention_mask is not None:
        counted = counted & jnp.roll(jnp.asarray(attention_mask).astype(bool), 1, axis=1)  # predictor attended too
    weights = counted[:, 1:].astype(jnp.float32)
    weights = weights / jnp.maximum(jnp.sum(weights), 1.0)
    hidden = model.hidden_states(input_ids, attention_mask, pixel_values, image_grid_thw)
    rows = hidden[:, :-1].reshape(-1, hidden.shape[-1])  # [B*(T-1), D]
    return fused_cross_entropy(rows, model.head_weight(), input_ids[:, 1:].reshape(-1), weights.reshape(-1),
                               chunk=chunk)


def _logprobs_and_lse(hidden, weight, targets, chunk):
    """(log p(target) [R], logsumexp of the logits [R]) chunk by chunk, both float32."""
    rows = hidden.shape[0]

    def body(_, inputs):
        h, t = inputs
        logits = jnp.einsum("TD,DV->TV", h, weight, preferred_element_type=jnp.float32)
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, t[:, None], axis=-1)[:, 0]
        return None, (picked - lse, lse)

    _, (logp, lse) = jax.lax.scan(body, None, (_split(hidden, chunk), _split(targets, chunk)))
    return logp.reshape(-1)[:rows], lse.reshape(-1)[:rows]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _logprobs(hidden, weight, targets, chunk):
    return _logprobs_and_lse(hidden, weight, targets, chunk)[0]


def _logprobs_fwd(hidden, weight, targets, chunk):
    logp, lse = _logprobs_and_lse(hidden, weight, targets, chunk)
    return logp, (hidden, weight, targets, lse)


def _logprobs_bwd(chunk, residuals, cotangent):
    hidden, weight, targets, lse = residuals
    rows = hidden.shape[0]
    weight_t = weight.T  # [V, D], laid out once so each chunk's d_hidden is a plain [c, V] @ [V, D]

    def body(d_weight, inputs):
        h, t, g, l = inputs
        logits = jnp.einsum("TD,DV->TV", h, weight, preferred_element_type=jnp.float32)
        probs = jnp.exp(logits - l[:, None])  # softmax from the forward pass's logsumexp
        onehot = jnp.arange(logits.shape[1], dtype=jnp.int32)[None, :] == t[:, None]
        d_logits = (jnp.where(onehot, g[:, None], 0.0) - g[:, None] * probs).astype(h.dtype)
        d_h = jnp.einsum("TV,VD->TD", d_logits, weight_t, preferred_element_type=jnp.float32)
        d_weight = d_weight + jnp.einsum("TD,TV->DV", h, d_logits, preferred_element_type=jnp.float32)
        return d_weight, d_h

    inputs = (_split(hidden, chunk), _split(targets, chunk), _split(cotangent.astype(jnp.float32), chunk),
              _split(lse, chunk))  # padded rows have cotangent 0, so they add nothing
    d_weight, d_hidden = jax.lax.scan(body, jnp.zeros(weight.shape, jnp.float32), inputs)
    d_hidden = d_hidden.reshape(-1, hidden.shape[1])[:rows]
    return d_hidden.astype(hidden.dtype), d_weight.astype(weight.dtype), None


_logprobs.defvjp(_logprobs_fwd, _logprobs_bwd)


def token_logprobs(hidden: jax.Array, weight: jax.Array, targets: jax.Array, *,
                   chunk: int | None = None) -> jax.Array:
    """`log_softmax(hidden_r · weight)[targets_r]` per row, without materialising the logits.

    Args:
        hidden: [R, D] rows after the final norm, in the compute dtype.
        weight: [D, V] the LM head.
        targets: [R] int in [0, V), the token whose log-probability each row gives.
        chunk: rows per step of the scan over rows; None = `chunk_rows(V)`.

    Returns:
        [R] float32. Differentiable in `hidden` and `weight` (custom VJP; the backward pass recomputes the logits
        chunk by chunk).

    Raises:
        ValueError: shapes that do not fit together, or chunk < 1.
    """
    targets = jnp.asarray(targets)
    if hidden.ndim != 2 or weight.ndim != 2 or weight.shape[0] != hidden.shape[1]:
        raise ValueError(f"token_logprobs needs hidden [R, D] and weight [D, V], got hidden {hidden.shape} and "
                         f"weight {weight.shape}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets shape {targets.shape} != ({hidden.shape[0]},) (one per row of hidden "
                         f"{hidden.shape})")
    chunk = chunk_rows(weight.shape[1]) if chunk is None else int(chunk)
    if chunk < 1:
        raise ValueError(f"token_logprobs needs chunk >= 1 rows, got chunk={chunk}")
    if hidden.shape[0] == 0:
        return jnp.zeros((0,), jnp.float32)
    return _logprobs(hidden, weight, targets.astype(jnp.int32), chunk)


def tempered(rows: jax.Array, temperature: float) -> jax.Array:
    """Head input rows whose logits are the original logits / temperature ((h / T) W = (h W) / T); unchanged at 1.

    Raises:
        ValueError: a temperature that is not > 0.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    return rows if temperature == 1.0 else rows / jnp.asarray(temperature, rows.dtype)


def sequence_logprobs(model, input_ids: jax.Array, *, attention_mask: jax.Array | None = None,
                      pixel_values: jax.Array | None = None, image_grid_thw: jax.Array | None = None,
                      chunk: int | None = None, temperature: float = 1.0) -> jax.Array:
    """Token-aligned log-probabilities of a padded batch under a `Qwen3VL`, through the fused chunked head.

    `logp[b, t] = log p(input_ids[b, t] | input_ids[b, :t])`. Positions without an attended predictor give 0:
    t = 0, pads, and the first real token of a left-padded row.

    Args:
        model: a `Qwen3VL`.
        input_ids: [B, T] int.
        attention_mask: [B, T], 0 at pads; None = no pads.
        pixel_values: [P, I] patch rows of the batch's images, or None.
        image_grid_thw: [num_images, 3], or None.
        chunk: rows per chunk of `token_logprobs` (None: sized by the vocabulary).
        temperature: log-probabilities of logits / temperature (the distribution a sampler at that temperature
            draws from; top-p/top-k truncation is not applied).

    Returns:
        [B, T] float32, differentiable in the model's parameters.
    """
    input_ids = jnp.asarray(input_ids)
    batch, length = input_ids.shape
    hidden = model.hidden_states(input_ids, attention_mask, pixel_values, image_grid_thw)
    rows = hidden[:, :-1].astype(model.config.compute_dtype).reshape(-1, hidden.shape[-1])  # [B*(T-1), D]
    rows = tempered(rows, temperature)
    logp = token_logprobs(rows, model.head_weight(), input_ids[:, 1:].reshape(-1), chunk=chunk)
    logp = logp.reshape(batch, length - 1)
    if attention_mask is not None:
        attended = jnp.asarray(attention_mask).astype(bool)
        logp = jnp.where(attended[:, 1:] & attended[:, :-1], logp, 0.0)  # token and its predictor both real
    return jnp.pad(logp, ((0, 0), (1, 0)))
