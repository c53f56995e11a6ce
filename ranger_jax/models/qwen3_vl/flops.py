"""Model FLOPs of the Qwen3-VL text decoder and the utilisation (MFU) they imply, for benchmarks and logs.

Counted as useful work only (PaLM, Chowdhery et al. 2022, App. B; MaxText halves causal attention since PR #1988):
matmuls with weights and the two attention matmuls over visible (query, key) pairs. Norms, RoPE, softmax,
embedding lookups and the vision tower are left out; recomputation (remat) and the masked work a blocked kernel
does on diagonal blocks do not count.
"""

from __future__ import annotations

from ranger_jax.models.qwen3_vl import config as config_lib


def text_flops(text_config: config_lib.TextConfig, *, batch: int, length: int, backward: bool = True) -> float:
    """FLOPs of one forward (and, by default, backward) pass of the text decoder and LM head over full causal rows.

    With D = hidden_size, N/K = query/kv heads, H = head_dim, F = intermediate_size, V = vocab_size, L layers,
    B rows of T tokens:

        weights   = L · (D·N·H + 2·D·K·H + N·H·D + 3·D·F) + D·V          (q, k, v, o, gate, up, down, head)
        forward   = 2 · B·T · weights  +  L · 4·N·H · B · T(T+1)/2        (QKᵀ and PV over causal pairs)
        train     = 3 · forward                                          (backward = 2 × forward)

    Args:
        text_config: the decoder's shapes.
        batch: B.
        length: T, tokens per row (all attended).
        backward: count the backward pass too (a train step); False = forward only.

    Returns:
        FLOPs (multiply and add counted separately).
    """
    t = text_config
    d, n, k, h, f = t.hidden_size, t.num_attention_heads, t.num_key_value_heads, t.head_dim, t.intermediate_size
    weights = t.num_hidden_layers * (d * n * h + 2 * d * k * h + n * h * d + 3 * d * f) + d * t.vocab_size
    attention = t.num_hidden_layers * 4 * n * h * batch * length * (length + 1) / 2
    forward = 2 * batch * length * weights + attention
    return 3 * forward if backward else forward


def mfu(flops: float, seconds: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: `flops / seconds / peak_flops_per_s` (a fraction of the measured peak)."""
    if seconds <= 0 or peak_flops_per_s <= 0:
        raise ValueError(f"mfu needs positive seconds and peak, got seconds={seconds}, peak={peak_flops_per_s}")
    return flops / seconds / peak_flops_per_s
