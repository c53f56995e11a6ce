"""GRPO: group-normalised advantages and the clipped policy-gradient loss (DAPO clip-higher, dual clip, KL, TIS).

Advantages (Shao et al. 2024, DeepSeekMath §4.1.2, outcome supervision): each prompt is sampled G times; a
trajectory's reward is normalised within its group and the scalar is shared by all of its tokens,

    Â_i = (r_i − mean(r_group)) / (std(r_group) + ε)

`group_advantages` departs from the paper in two places, both on purpose: the std is the sample std (ddof = 1, as
`torch.std` in verl's `compute_grpo_outcome_advantage`), and rollouts marked invalid (filtered: overlong, crashed,
unparsable) are removed *before* the group statistics, so they neither receive a signal nor shift the mean and std
of the others. Masking after normalisation (as some public pipelines do) lets filtered rewards bias every group.

`prefix_tree_advantages` spreads the same group-normalised advantage over a row's tokens instead of repeating it on
each: the members of a group form a tree of shared token prefixes, and token t of member i earns the change in the
mean reward of the members still sharing its prefix, from "through t − 1" to "through t" (normalised by the group's
std). Tokens every member agrees on, and tokens after a member's last branching point (no other member took another
way there, so the group compares nothing), get 0; a member's per-token advantages sum to its `group_advantages`
value when members with the same tokens have the same reward (the Monte Carlo value of a prefix, as tree-search
RL estimates it: TreeRL, Hou et al. 2025; SPO, Guo et al. 2025). It trades the credit of decisions only one member
made for less noise: in a group of eight sampled ~32-token turns, about two tokens per member carry a signal.

Policy loss, per token t of row b, with ρ = exp(log π_θ − log π_old) and the row's advantage A (verl's
`compute_policy_loss`, with DAPO's decoupled clip range, Yu et al. 2025 §3.1, and dual clip, Ye et al. 2020):

    L_pg = max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high))
    L_pg = min(L_pg, −A·c)                                  only where A < 0, when dual clip c is set
    L    = w · L_pg + β · k3,   k3 = exp(ref − log π_θ) − (ref − log π_θ) − 1

where w = min(exp(log π_old − log π_sampler), cap) is the truncated importance weight (TIS; Yao et al. 2025,
"Your efficient RL framework secretly brings you off-policy RL training") that corrects for the sampler's
numerics differing from the learner's. As in verl, w scales the policy-gradient term only, not the KL term.
Per-token losses are then reduced by one of `AGGREGATIONS` ("token-mean", "seq-mean-token-mean",
"seq-mean-token-sum"); rows without a counted token are left out of the row means.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

LOG_RATIO_LIMIT = 20.0  # log-ratios are clamped to ±20 before exp (as verl), so float32 never overflows


# ---------------------------------------------------------------------------------------------------------------
# Advantages


def _group_codes(group_ids, size: int):
    """Group ids -> integer codes in [0, size): numpy for host arrays (any dtype, strings too), jax otherwise."""
    if isinstance(group_ids, jax.Array):
        if not jnp.issubdtype(group_ids.dtype, jnp.integer):
            raise ValueError(f"group_ids as a jax array must be integers, got dtype {group_ids.dtype}")
        return jnp.unique(group_ids, size=size, fill_value=0, return_inverse=True)[1].reshape(-1)
    return np.unique(np.asarray(group_ids), return_inverse=True)[1].reshape(-1)


def group_advantages(rewards, group_ids, *, valid=None, eps: float = 1e-6):
    """GRPO advantages: each reward normalised by the mean and sample std of the valid members of its group.

    For group g with valid members V_g (|V_g| ≥ 2): `A_i = (r_i − mean_{V_g} r) / (std_{V_g}(r, ddof=1) + eps)`.
    Invalid members, and every member of a group with fewer than two valid members, get 0. Invalid members are
    left out before the statistics, so their rewards (even NaN) never reach the valid ones.

    Works on host arrays (numpy / lists; group ids may be ints or strings; statistics in float64) and on jax
    arrays (integer group ids; traceable under `jax.jit`, statistics in float32). The result follows the inputs:
    a jax array when any of rewards, group_ids, valid is one, a numpy array otherwise.

    Args:
        rewards: [N] float, one scalar per trajectory.
        group_ids: [N] int or str, the prompt (group) each trajectory was sampled for; any order.
        valid: [N] bool or 0/1, False/0 for rollouts to leave out; None = all valid.
        eps: added to the std, so a group with equal rewards gets exactly 0.

    Returns:
        [N] float32 advantages.

    Raises:
        ValueError: rewards not 1-D, group_ids or valid of another shape, or non-integer jax group ids.
    """
    on_device = any(isinstance(x, jax.Array) for x in (rewards, group_ids, valid))
    xp = jnp if on_device else np
    rewards = xp.asarray(rewards, dtype=xp.float32 if on_device else np.float64)
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be [N], got shape {rewards.shape}")
    size = rewards.shape[0]
    if np.shape(group_ids) != (size,):
        raise ValueError(f"group_ids shape {np.shape(group_ids)} != rewards shape {rewards.shape}")
    if valid is not None and np.shape(valid) != (size,):
        raise ValueError(f"valid shape {np.shape(valid)} != rewards shape {rewards.shape}")
    if isinstance(group_ids, jax.Array) or not on_device:
        codes = _group_codes(group_ids, size)
    else:  # host ids (e.g. strings) beside device rewards: coded on the host, then moved
        codes = jnp.asarray(_group_codes(group_ids, size), jnp.int32)
    keep = xp.ones(size, bool) if valid is None else xp.asarray(valid).astype(bool)

    if on_device:
        def group_sum(x):  # [N] -> [N] groups (codes < N)
            return jax.ops.segment_sum(x, codes, num_segments=size)
    else:
        def group_sum(x):
            return np.bincount(codes, weights=x, minlength=size)

    count = group_sum(keep.astype(rewards.dtype))  # valid members per group
    kept = xp.where(keep, rewards, 0.0)  # invalid rewards (maybe NaN) never enter a sum
    mean = group_sum(kept) / xp.maximum(count, 1.0)
    deviation = xp.where(keep, rewards - mean[codes], 0.0)
    std = xp.sqrt(group_sum(deviation * deviation) / xp.maximum(count - 1.0, 1.0))
    scored = keep & (count[codes] >= 2)
    advantages = xp.where(scored, deviation / (std[codes] + eps), 0.0)
    return advantages.astype(xp.float32)


def prefix_tree_advantages(token_ids, rewards, *, valid=None, eps: float = 1e-6) -> list[np.ndarray]:
    """Per-token advantages of ONE group's rows from their tree of shared prefixes (the module docstring).

    With S_i(t) the valid members whose first t + 1 tokens equal member i's (S_i(−1): every valid member),
    `A_i[t] = (mean_{S_i(t)} r − mean_{S_i(t−1)} r) / (std_valid(r, ddof=1) + eps)`; a member's advantages sum to
    `mean_{S_i(L_i−1)} r − mean r` over that std: its `group_advantages` value when equal rows score alike and no
    row is a strict prefix of another (rows that end in an end-of-turn token never are).
    Token-aligned like `loss_mask`: index t credits token t. Invalid members, and every member of a group with
    fewer than two valid members, get zeros. Host (numpy) only; images are not compared (rows with the same tokens
    are taken to be the same).

    Args:
        token_ids: N 1-D integer sequences, one per member (any lengths).
        rewards: [N] float.
        valid: [N] bool; None = all valid.
        eps: added to the std, as in `group_advantages`.

    Returns:
        N float32 arrays, the i-th as long as `token_ids[i]`.

    Raises:
        ValueError: a token sequence that is not 1-D, or rewards / valid not of shape [N].
    """
    rows = [np.asarray(ids) for ids in token_ids]
    size = len(rows)
    for i, ids in enumerate(rows):
        if ids.ndim != 1:
            raise ValueError(f"token_ids[{i}] must be 1-D, got shape {ids.shape}")
    rewards = np.asarray(rewards, np.float64)
    if rewards.shape != (size,):
        raise ValueError(f"rewards shape {rewards.shape} != ({size},) (one per token sequence)")
    keep = np.ones(size, bool) if valid is None else np.asarray(valid).astype(bool)
    if keep.shape != (size,):
        raise ValueError(f"valid shape {keep.shape} != ({size},) (one per token sequence)")
    out = [np.zeros(len(ids), np.float32) for ids in rows]
    members = np.flatnonzero(keep)
    if members.size < 2:
        return out
    scores = rewards[members]
    std = float(np.std(scores, ddof=1))
    shared = np.zeros((size, size), np.int64)  # length of the common prefix of two members
    for a in members:
        for b in members:
            if b > a:
                n = min(len(rows[a]), len(rows[b]))
                differ = np.flatnonzero(rows[a][:n] != rows[b][:n])
                shared[a, b] = shared[b, a] = differ[0] if differ.size else n
    for i in members:
        length = len(rows[i])
        if not length:
            continue
        common = np.where(members == i, length, shared[i, members])  # [M]
        through = common[:, None] >= np.arange(1, length + 1)[None, :]  # [M, L]: shares i's tokens through t
        value = (scores @ through) / through.sum(axis=0)  # mean reward of S_i(t); i itself is always in
        before = np.concatenate([[scores.mean()], value[:-1]])
        out[i] = ((value - before) / (std + eps)).astype(np.float32)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Policy loss


def _token_mean(loss, mask):
    """Σ over all counted tokens / number of counted tokens."""
    return jnp.sum(loss * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _row_mean(per_row, mask):
    """Mean of [B] per-row values over rows with at least one counted token."""
    has_tokens = jnp.sum(mask, axis=1) > 0
    return jnp.sum(jnp.where(has_tokens, per_row, 0.0)) / jnp.maximum(jnp.sum(has_tokens), 1)


def _seq_mean_token_mean(loss, mask):
    """Per row: mean over its counted tokens; then the mean over rows that have any."""
    return _row_mean(jnp.sum(loss * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0), mask)


def _seq_mean_token_sum(loss, mask):
    """Per row: sum over its counted tokens; then the mean over rows that have any (the default)."""
    return _row_mean(jnp.sum(loss * mask, axis=1), mask)


AGGREGATIONS = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
}


def _check_shapes(logp, old_logp, advantages, mask, ref_logp, sampler_logp) -> None:
    if np.ndim(logp) != 2:
        raise ValueError(f"logp must be [B, T], got shape {np.shape(logp)}")
    shape = np.shape(logp)
    for name, x in (("old_logp", old_logp), ("mask", mask), ("ref_logp", ref_logp), ("sampler_logp", sampler_logp)):
        if x is not None and np.shape(x) != shape:
            raise ValueError(f"{name} shape {np.shape(x)} != logp shape {shape} ([B, T])")
    if np.shape(advantages) not in (shape[:1], shape):
        raise ValueError(f"advantages shape {np.shape(advantages)} is neither ({shape[0]},) nor {shape} ([B] or "
                         f"[B, T] for logp shape {shape})")


def _check_options(clip_low, clip_high, clip_dual, agg, ref_logp, kl_coef, sampler_logp, tis_cap) -> None:
    if agg not in AGGREGATIONS:
        raise ValueError(f"unknown agg {agg!r}; known: {sorted(AGGREGATIONS)}")

    def number(x):
        return isinstance(x, numbers.Real)  # traced hyperparameters are taken as given

    if number(clip_low) and not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if number(clip_high) and clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    if clip_dual is not None and number(clip_dual) and clip_dual <= 1.0:
        raise ValueError(f"clip_dual must be > 1 (verl's clip_ratio_c, e.g. 3.0), got {clip_dual}")
    if ref_logp is None and (not number(kl_coef) or kl_coef != 0.0):
        raise ValueError(f"kl_coef={kl_coef} needs ref_logp")
    if tis_cap is not None and sampler_logp is None:
        raise ValueError(f"tis_cap={tis_cap} needs sampler_logp")
    if tis_cap is not None and number(tis_cap) and tis_cap <= 0.0:
        raise ValueError(f"tis_cap must be > 0, got {tis_cap}")


def _const(x):
    """A float32 input that is not differentiated."""
    return jax.lax.stop_gradient(jnp.asarray(x, jnp.float32))


def _log_diff(a, b, counted):
    """a − b on counted tokens (clamped to ±LOG_RATIO_LIMIT), exactly 0 elsewhere, so exp never sees pads."""
    return jnp.where(counted, jnp.clip(a - b, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT), 0.0)


def policy_loss(logp, old_logp, advantages, mask, *, clip_low: float = 0.2, clip_high: float = 0.28,
                clip_dual: float | None = None, agg: str = "seq-mean-token-sum", ref_logp=None,
                kl_coef: float = 0.0, sampler_logp=None, tis_cap: float | None = None):
    """The clipped GRPO policy loss of a batch and its diagnostics (the module docstring has the formula).

    Only `logp` is differentiated; every other input is held constant (stop-gradient). Tokens with mask 0
    contribute exactly nothing, to the loss, its gradient and the metrics, whatever their values (NaN and inf
    included). Log-ratios of counted tokens are clamped to ±`LOG_RATIO_LIMIT` before exp, as verl does.

    Args:
        logp: [B, T] log π_θ of each token under the policy being trained.
        old_logp: [B, T] log π_old, the learner's log-probs with the weights that sampled the batch.
        advantages: [B] one advantage per row (`group_advantages`), or [B, T] one per token
            (`prefix_tree_advantages`, token-aligned like `mask`).
        mask: [B, T] nonzero at tokens that are trained on (`loss_mask`).
        clip_low: ε_low, ρ is clipped below at 1 − ε_low.
        clip_high: ε_high, ρ is clipped above at 1 + ε_high (DAPO clip-higher: 0.28).
        clip_dual: c > 1 of dual clip (verl's clip_ratio_c, e.g. 3.0): caps the loss at −A·c where A < 0; None = off.
        agg: how per-token losses become one number, a key of `AGGREGATIONS`.
        ref_logp: [B, T] log π_ref for the KL term and metric; None = no KL.
        kl_coef: β, the weight of the k3 KL term (needs `ref_logp` when nonzero).
        sampler_logp: [B, T] the sampler's log-probs (for TIS and the sampler-learner gap metric); None = none.
        tis_cap: cap of the truncated importance weight; None = no TIS (needs `sampler_logp` when set).

    Returns:
        (loss, metrics): float32 scalar, and a dict of float32 scalars over counted tokens (all 0 without any):
        `clip_frac_low` (A < 0, ρ < 1 − ε_low), `clip_frac_high` (A > 0, ρ > 1 + ε_high), `clip_frac_dual`
        (A < 0, dual clip binds), `approx_kl` (k3 of KL(π_old‖π_θ): ρ − 1 − log ρ), `ratio_mean`,
        `ratio_max`, `ratio_min`; with `sampler_logp`: `sampler_logp_gap` (mean |old_logp − sampler_logp|);
        with `ref_logp`: `kl` (mean k3); with `tis_cap`: `tis_weight_mean`.

    Raises:
        ValueError: shapes that disagree (naming the argument), an unknown `agg`, or options out of range.
    """
    _check_shapes(logp, old_logp, advantages, mask, ref_logp, sampler_logp)
    _check_options(clip_low, clip_high, clip_dual, agg, ref_logp, kl_coef, sampler_logp, tis_cap)
    logp = jnp.asarray(logp, jnp.float32)
    counted = jnp.asarray(mask) != 0  # [B, T]
    weights = counted.astype(jnp.float32)
    advantages = _const(advantages)
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    adv = jnp.where(counted, advantages, 0.0)  # [B, T]; NaN advantages of empty rows never leak

    log_ratio = _log_diff(logp, _const(old_logp), counted)
    ratio = jnp.exp(log_ratio)
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = jnp.maximum(-adv * ratio, -adv * clipped)  # [B, T]
    metrics = {
        "clip_frac_low": (adv < 0) & (ratio < 1.0 - clip_low),
        "clip_frac_high": (adv > 0) & (ratio > 1.0 + clip_high),
    }
    if clip_dual is None:
        metrics["clip_frac_dual"] = jnp.zeros_like(counted)
    else:
        dual_binds = (adv < 0) & (loss > -adv * clip_dual)
        loss = jnp.where(dual_binds, -adv * clip_dual, loss)
        metrics["clip_frac_dual"] = dual_binds
    metrics["approx_kl"] = ratio - log_ratio - 1.0  # tokens were drawn from π_old: E_old[ρ − 1 − log ρ]
    metrics = {k: _token_mean(v.astype(jnp.float32), weights) for k, v in metrics.items()}
    count = jnp.sum(weights)
    metrics["ratio_mean"] = _token_mean(ratio, weights)
    metrics["ratio_max"] = jnp.where(count > 0, jnp.max(jnp.where(counted, ratio, -jnp.inf)), 0.0)
    metrics["ratio_min"] = jnp.where(count > 0, jnp.min(jnp.where(counted, ratio, jnp.inf)), 0.0)

    if sampler_logp is not None:
        gap = jnp.where(counted, _const(old_logp) - _const(sampler_logp), 0.0)
        metrics["sampler_logp_gap"] = _token_mean(jnp.abs(gap), weights)
    if tis_cap is not None:
        tis = jnp.minimum(jnp.exp(_log_diff(_const(old_logp), _const(sampler_logp), counted)), tis_cap)
        loss = loss * tis
        metrics["tis_weight_mean"] = _token_mean(tis, weights)
    if ref_logp is not None:
        ref_diff = _log_diff(_const(ref_logp), logp, counted)
        k3 = jnp.exp(ref_diff) - ref_diff - 1.0  # [B, T]
        loss = loss + kl_coef * k3
        metrics["kl"] = _token_mean(k3, weights)

    loss = jnp.where(counted, loss, 0.0)
    metrics = {k: jax.lax.stop_gradient(v).astype(jnp.float32) for k, v in metrics.items()}
    return AGGREGATIONS[agg](loss, weights).astype(jnp.float32), metrics
