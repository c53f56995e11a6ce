"""GRPO advantages and policy loss against plain-Python loop references written here from the formulas (float64),
including gradients by central differences of the reference."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ranger_jax.rl import grpo

# ---------------------------------------------------------------------------------------------------------------
# References


def loop_advantages(rewards, groups, valid, eps=1e-6):
    out = [0.0] * len(rewards)
    for g in set(groups):
        members = [i for i in range(len(rewards)) if groups[i] == g and valid[i]]
        if len(members) < 2:
            continue
        mean = sum(rewards[i] for i in members) / len(members)
        std = math.sqrt(sum((rewards[i] - mean) ** 2 for i in members) / (len(members) - 1))
        for i in members:
            out[i] = (rewards[i] - mean) / (std + eps)
    return out


def _clamp(x):
    return max(-20.0, min(20.0, x))


def loop_policy_loss(logp, old, adv, mask, *, clip_low=0.2, clip_high=0.28, clip_dual=None, agg, ref=None,
                     kl_coef=0.0, sampler=None, tis_cap=None):
    """(loss, metrics) token by token; the loss of token (b, t) is w·L_pg + β·k3 (w only on the PG term)."""
    rows, length = len(logp), len(logp[0])
    row_losses, row_counts = [], []
    sums = dict(low=0.0, high=0.0, dual=0.0, akl=0.0, ratio=0.0, gap=0.0, kl=0.0, tis=0.0)
    ratios = []
    for b in range(rows):
        total, count = 0.0, 0
        for t in range(length):
            if not mask[b][t]:
                continue
            a = adv[b][t] if isinstance(adv[b], list) else adv[b]  # per token, or one per row
            lr = _clamp(logp[b][t] - old[b][t])
            ratio = math.exp(lr)
            clipped = min(max(ratio, 1 - clip_low), 1 + clip_high)
            loss = max(-a * ratio, -a * clipped)
            sums["low"] += a < 0 and ratio < 1 - clip_low
            sums["high"] += a > 0 and ratio > 1 + clip_high
            if clip_dual is not None and a < 0:
                sums["dual"] += loss > -a * clip_dual
                loss = min(loss, -a * clip_dual)
            sums["akl"] += ratio - 1 - lr
            sums["ratio"] += ratio
            ratios.append(ratio)
            if sampler is not None:
                sums["gap"] += abs(old[b][t] - sampler[b][t])
            if tis_cap is not None:
                w = min(math.exp(_clamp(old[b][t] - sampler[b][t])), tis_cap)
                sums["tis"] += w
                loss *= w
            if ref is not None:
                d = _clamp(ref[b][t] - logp[b][t])
                k3 = math.exp(d) - d - 1
                sums["kl"] += k3
                loss += kl_coef * k3
            total += loss
            count += 1
        row_losses.append(total)
        row_counts.append(count)
    tokens = sum(row_counts)
    live = [b for b in range(rows) if row_counts[b] > 0]
    if agg == "token-mean":
        value = sum(row_losses) / max(tokens, 1)
    elif agg == "seq-mean-token-mean":
        value = sum(row_losses[b] / row_counts[b] for b in live) / max(len(live), 1)
    else:
        value = sum(row_losses[b] for b in live) / max(len(live), 1)
    n = max(tokens, 1)
    metrics = {
        "clip_frac_low": sums["low"] / n, "clip_frac_high": sums["high"] / n, "clip_frac_dual": sums["dual"] / n,
        "approx_kl": sums["akl"] / n, "ratio_mean": sums["ratio"] / n,
        "ratio_max": max(ratios, default=0.0), "ratio_min": min(ratios, default=0.0),
    }
    if sampler is not None:
        metrics["sampler_logp_gap"] = sums["gap"] / n
    if tis_cap is not None:
        metrics["tis_weight_mean"] = sums["tis"] / n
    if ref is not None:
        metrics["kl"] = sums["kl"] / n
    return value, metrics


# ---------------------------------------------------------------------------------------------------------------
# Advantages


@pytest.fixture(scope="module")
def rollouts():
    """Five groups of 4, shuffled: one all valid, one with an invalid NaN reward, one with one valid member, one
    with none, one with equal rewards."""
    rng = np.random.default_rng(0)
    groups = np.repeat(np.array([10, 3, 7, -2, 5]), 4)
    rewards = rng.random(20)
    valid = np.ones(20, bool)
    valid[5] = False
    rewards[5] = np.nan  # invalid: must not reach group 3's statistics
    valid[[8, 9, 10]] = False  # group 7: one valid member
    valid[12:16] = False  # group -2: none
    rewards[16:20] = 0.5  # group 5: equal rewards
    order = rng.permutation(20)
    return rewards[order], groups[order], valid[order]


def test_group_advantages_match_loops_on_host_and_device(rollouts):
    rewards, groups, valid = rollouts
    expected = loop_advantages(rewards.tolist(), groups.tolist(), valid.tolist())
    host = grpo.group_advantages(rewards, groups, valid=valid)
    assert isinstance(host, np.ndarray) and host.dtype == np.float32
    np.testing.assert_allclose(host, expected, rtol=1e-6, atol=1e-6)
    assert np.count_nonzero(host) == 7  # group 10 (4) and group 3 (3 valid)
    device = jax.jit(lambda r, g, v: grpo.group_advantages(r, g, valid=v))(
        jnp.asarray(rewards, jnp.float32), jnp.asarray(groups), jnp.asarray(valid))
    assert isinstance(device, jax.Array) and device.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(device), expected, rtol=1e-5, atol=1e-5)


def test_group_advantages_string_group_ids(rollouts):
    rewards, groups, valid = rollouts
    names = [f"task-{g}" for g in groups.tolist()]
    expected = loop_advantages(rewards.tolist(), names, valid.tolist())
    np.testing.assert_allclose(grpo.group_advantages(rewards.tolist(), names, valid=valid), expected, rtol=1e-6,
                               atol=1e-6)
    beside_device = grpo.group_advantages(jnp.asarray(rewards, jnp.float32), names, valid=valid)
    np.testing.assert_allclose(np.asarray(beside_device), expected, rtol=1e-5, atol=1e-5)


def test_group_advantages_without_valid_and_custom_eps():
    rewards, groups = [1.0, 2.0, 4.0, 0.0, 0.0], [1, 1, 1, 2, 3]
    np.testing.assert_allclose(grpo.group_advantages(rewards, groups, eps=0.5),
                               loop_advantages(rewards, groups, [True] * 5, eps=0.5), rtol=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    (dict(rewards=np.zeros((2, 3)), group_ids=np.zeros(6)), r"rewards must be \[N\], got shape \(2, 3\)"),
    (dict(rewards=np.zeros(4), group_ids=np.zeros(3)), r"group_ids shape \(3,\) != rewards shape \(4,\)"),
    (dict(rewards=np.zeros(4), group_ids=np.zeros(4), valid=np.ones(5)), r"valid shape \(5,\) != rewards"),
    (dict(rewards=jnp.zeros(4), group_ids=jnp.zeros(4)), "group_ids as a jax array must be integers"),
])
def test_group_advantages_rejects_bad_shapes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        grpo.group_advantages(**kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Policy loss


def _batch(seed=1):
    """4 rows x 6 tokens: row 2 has no counted token; log-ratios spread so that every clip side is hit."""
    rng = np.random.default_rng(seed)
    old = -rng.random((4, 6)) * 3
    logp = old + rng.normal(0.0, 0.5, (4, 6))
    logp[1, 1] = old[1, 1] + 1.6  # ρ ≈ 5 on a negative-advantage row: dual clip binds
    logp[0, 2] = old[0, 2] + 0.6  # ρ ≈ 1.8 on a positive row: high clip
    logp[1, 3] = old[1, 3] - 0.6  # ρ ≈ 0.55 on a negative row: low clip
    mask = (rng.random((4, 6)) > 0.25).astype(np.float32)
    mask[0, 2] = mask[1, 1] = mask[1, 3] = 1
    mask[2] = 0
    advantages = np.array([1.3, -0.7, 0.4, -1.1])
    ref = old + rng.normal(0.0, 0.3, (4, 6))
    sampler = old + rng.normal(0.0, 0.4, (4, 6))
    return dict(logp=logp, old_logp=old, advantages=advantages, mask=mask), ref, sampler


OPTIONS = {
    "plain": dict(),
    "dual-kl": dict(clip_dual=3.0, ref=True, kl_coef=0.1),
    "tis": dict(sampler=True, tis_cap=1.5),
    "all": dict(clip_low=0.1, clip_high=0.3, clip_dual=2.0, ref=True, kl_coef=0.05, sampler=True, tis_cap=1.2),
}


def _call_both(agg, option):
    inputs, ref, sampler = _batch()
    option = dict(OPTIONS[option])
    ref = ref if option.pop("ref", False) else None
    sampler = sampler if option.pop("sampler", False) else None
    expected = loop_policy_loss(*(inputs[k].tolist() for k in ("logp", "old_logp", "advantages", "mask")), agg=agg,
                                ref=None if ref is None else ref.tolist(),
                                sampler=None if sampler is None else sampler.tolist(), **option)
    arrays = {k: jnp.asarray(v, jnp.float32) for k, v in inputs.items()}
    extra = {k: jnp.asarray(v, jnp.float32) for k, v in (("ref_logp", ref), ("sampler_logp", sampler))
             if v is not None}
    return arrays, extra, option, expected


@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize("agg", sorted(grpo.AGGREGATIONS))
def test_policy_loss_and_metrics_match_loops(agg, option):
    arrays, extra, option, (value, metrics) = _call_both(agg, option)
    loss, ours = grpo.policy_loss(**arrays, **extra, agg=agg, **option)
    assert loss.dtype == jnp.float32 and loss.shape == ()
    assert float(loss) == pytest.approx(value, rel=1e-5, abs=1e-6)
    assert sorted(ours) == sorted(metrics)
    for name, theirs in metrics.items():
        assert ours[name].dtype == jnp.float32 and ours[name].shape == ()
        assert float(ours[name]) == pytest.approx(theirs, rel=1e-5, abs=1e-6), name
    if option.get("clip_dual") is not None:
        assert float(ours["clip_frac_dual"]) > 0
    assert float(ours["clip_frac_low"]) > 0 and float(ours["clip_frac_high"]) > 0


@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize("agg", sorted(grpo.AGGREGATIONS))
def test_policy_loss_with_per_token_advantages_matches_loops(agg, option):
    inputs, ref, sampler = _batch(seed=3)
    rng = np.random.default_rng(5)
    inputs["advantages"] = rng.normal(0.0, 1.0, inputs["logp"].shape)  # [B, T], signs mixed within rows
    option = dict(OPTIONS[option])
    ref = ref if option.pop("ref", False) else None
    sampler = sampler if option.pop("sampler", False) else None
    value, metrics = loop_policy_loss(*(inputs[k].tolist() for k in ("logp", "old_logp", "advantages", "mask")),
                                      agg=agg, ref=None if ref is None else ref.tolist(),
                                      sampler=None if sampler is None else sampler.tolist(), **option)
    extra = {k: jnp.asarray(v, jnp.float32) for k, v in (("ref_logp", ref), ("sampler_logp", sampler))
             if v is not None}
    loss, ours = grpo.policy_loss(**{k: jnp.asarray(v, jnp.float32) for k, v in inputs.items()}, **extra, agg=agg,
                                  **option)
    assert float(loss) == pytest.approx(value, rel=1e-5, abs=1e-6)
    for name, theirs in metrics.items():
        assert float(ours[name]) == pytest.approx(theirs, rel=1e-5, abs=1e-6), name


def test_per_token_advantages_equal_to_the_row_value_give_the_row_loss():
    inputs, _, _ = _batch()
    arrays = {k: jnp.asarray(v, jnp.float32) for k, v in inputs.items()}
    tiled = jnp.broadcast_to(arrays["advantages"][:, None], arrays["logp"].shape)
    for agg in grpo.AGGREGATIONS:
        row, _ = grpo.policy_loss(**arrays, agg=agg, clip_dual=3.0)
        token, _ = grpo.policy_loss(**{**arrays, "advantages": tiled}, agg=agg, clip_dual=3.0)
        assert float(token) == float(row)


# ---------------------------------------------------------------------------------------------------------------
# Prefix-tree advantages


def loop_prefix_tree(token_ids, rewards, valid, eps=1e-6):
    """Token by token, with explicit member sets: A_i[t] = (mean r over S_i(t) - mean r over S_i(t-1)) / std."""
    members = [j for j in range(len(token_ids)) if valid[j]]
    out = [[0.0] * len(ids) for ids in token_ids]
    if len(members) < 2:
        return out
    scores = [rewards[j] for j in members]
    mean = sum(scores) / len(scores)
    std = math.sqrt(sum((r - mean) ** 2 for r in scores) / (len(scores) - 1))

    def value(i, t):  # mean reward of the valid members sharing member i's tokens 0..t
        same = [j for j in members if len(token_ids[j]) > t and list(token_ids[j][:t + 1]) == list(token_ids[i][:t + 1])]
        return sum(rewards[j] for j in same) / len(same)

    for i in members:
        for t in range(len(token_ids[i])):
            before = mean if t == 0 else value(i, t - 1)
            out[i][t] = (value(i, t) - before) / (std + eps)
    return out


def _tree_group(seed, size=8, length=12, vocab=3):
    """Members that share a random prefix, then branch over a tiny vocabulary (so sub-branches share too)."""
    rng = np.random.default_rng(seed)
    stem = rng.integers(0, 50, rng.integers(0, 6))
    rows = [np.concatenate([stem, rng.integers(0, vocab, rng.integers(1, length))]) for _ in range(size)]
    rows[1] = rows[0].copy()  # two identical members
    rows[2] = rows[0][:max(1, len(rows[0]) - 2)].copy()  # a strict prefix of another member
    rewards = rng.random(size).round(1)
    rewards[1] = rewards[0]
    return rows, rewards


@pytest.mark.parametrize("seed", range(6))
def test_prefix_tree_advantages_match_loops(seed):
    rows, rewards = _tree_group(seed)
    valid = np.random.default_rng(seed + 100).random(len(rows)) > 0.2
    ours = grpo.prefix_tree_advantages(rows, rewards, valid=valid)
    theirs = loop_prefix_tree(rows, rewards, valid)
    assert [len(a) for a in ours] == [len(r) for r in rows]
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"member {i}")
        if not valid[i]:
            assert not a.any()


@pytest.mark.parametrize("seed", range(4))
def test_prefix_tree_advantages_sum_to_the_group_advantage(seed):
    rows, _ = _tree_group(seed)
    rows = [np.append(r, 99) for r in rows]  # each ends in an end token, as a turn does: no row is another's prefix
    # the reward is a function of the tokens (a deterministic environment): equal rows score alike
    rewards = np.array([float(np.sum(r) % 3) for r in rows])
    tree = grpo.prefix_tree_advantages(rows, rewards)
    group = grpo.group_advantages(rewards, np.zeros(len(rows)))
    np.testing.assert_allclose([a.sum() for a in tree], group, rtol=1e-4, atol=1e-5)
    shared = next(t for t in range(100) if len({tuple(r[:t + 1]) for r in rows}) > 1)  # first branching token
    assert all(not a[:shared].any() for a in tree)  # tokens every member agrees on carry no signal


def test_prefix_tree_advantages_of_degenerate_groups_are_zero():
    rows = [np.array([1, 2, 3]), np.array([1, 4]), np.array([5])]
    assert all(not a.any() for a in grpo.prefix_tree_advantages(rows, [1.0, 0.0, 1.0], valid=[True, False, False]))
    assert all(not a.any() for a in grpo.prefix_tree_advantages(rows, [0.5, 0.5, 0.5]))
    assert grpo.prefix_tree_advantages([], []) == []
    # invalid members neither get a signal nor shift the others' (a NaN reward included)
    kept = grpo.prefix_tree_advantages(rows[:2], [1.0, 0.0])
    with_invalid = grpo.prefix_tree_advantages(rows, [1.0, 0.0, float("nan")], valid=[True, True, False])
    for a, b in zip(kept, with_invalid):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("args, match", [
    (([np.zeros((2, 2))], [1.0]), r"token_ids\[0\] must be 1-D, got shape \(2, 2\)"),
    (([np.zeros(2), np.zeros(3)], [1.0]), r"rewards shape \(1,\) != \(2,\)"),
])
def test_prefix_tree_advantages_reject_bad_shapes(args, match):
    with pytest.raises(ValueError, match=match):
        grpo.prefix_tree_advantages(*args)
    with pytest.raises(ValueError, match=r"valid shape \(1,\) != \(2,\)"):
        grpo.prefix_tree_advantages([np.zeros(2), np.zeros(3)], [1.0, 0.0], valid=[True])


def test_policy_loss_gradient_matches_central_differences_of_loops():
    arrays, extra, option, _ = _call_both("seq-mean-token-mean", "all")
    inputs, ref, sampler = _batch()

    def reference(logp):
        return loop_policy_loss(logp.tolist(), inputs["old_logp"].tolist(), inputs["advantages"].tolist(),
                                inputs["mask"].tolist(), agg="seq-mean-token-mean", ref=ref.tolist(),
                                sampler=sampler.tolist(), **option)[0]

    step = 1e-6
    numeric = np.zeros((4, 6))
    for b in range(4):
        for t in range(6):
            up, down = inputs["logp"].copy(), inputs["logp"].copy()
            up[b, t] += step
            down[b, t] -= step
            numeric[b, t] = (reference(up) - reference(down)) / (2 * step)

    def ours(logp, old_logp, advantages, mask, ref_logp, sampler_logp):
        return grpo.policy_loss(logp, old_logp, advantages, mask, ref_logp=ref_logp, sampler_logp=sampler_logp,
                                agg="seq-mean-token-mean", **option)[0]

    grads = jax.jit(jax.grad(ours, argnums=(0, 1, 2, 4, 5)))(arrays["logp"], arrays["old_logp"], arrays["advantages"],
                                                              arrays["mask"], extra["ref_logp"], extra["sampler_logp"])
    np.testing.assert_allclose(np.asarray(grads[0]), numeric, atol=2e-5)
    assert np.all(np.asarray(grads[0])[inputs["mask"] == 0] == 0.0)
    assert np.count_nonzero(numeric) > 10
    for held in grads[1:]:  # old_logp, advantages, ref_logp, sampler_logp are constants
        assert not np.any(np.asarray(held))


def test_masked_tokens_contribute_nothing_even_when_not_finite():
    arrays, extra, option, _ = _call_both("token-mean", "all")
    value_and_grad = jax.value_and_grad(functools.partial(grpo.policy_loss, agg="token-mean", **option), has_aux=True)
    call = jax.jit(lambda logp, **rest: value_and_grad(logp, **rest))
    (clean, clean_metrics), clean_grad = call(**arrays, **extra)
    masked = arrays["mask"] == 0
    poisoned = dict(arrays)
    poisoned["logp"] = jnp.where(masked, 1e30, arrays["logp"])
    poisoned["old_logp"] = jnp.where(masked, -jnp.inf, arrays["old_logp"])
    poisoned["advantages"] = arrays["advantages"].at[2].set(jnp.nan)  # row 2 has no counted token
    extra = {"ref_logp": jnp.where(masked, jnp.nan, extra["ref_logp"]),
             "sampler_logp": jnp.where(masked, jnp.inf, extra["sampler_logp"])}
    (loss, metrics), grad = call(**poisoned, **extra)
    assert float(loss) == float(clean)
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(clean_grad))
    for name, value in metrics.items():
        assert float(value) == float(clean_metrics[name]), name


def test_huge_log_ratio_on_a_counted_token_is_clamped():
    logp = jnp.array([[0.0, 100.0]])
    old = jnp.zeros((1, 2))
    loss, metrics = grpo.policy_loss(logp, old, jnp.array([-1.0]), jnp.ones((1, 2)), agg="token-mean")
    value, _ = loop_policy_loss([[0.0, 100.0]], [[0.0, 0.0]], [-1.0], [[1, 1]], agg="token-mean")
    assert np.isfinite(float(loss)) and float(loss) == pytest.approx(value, rel=1e-6)
    assert float(metrics["ratio_max"]) == pytest.approx(math.exp(20.0), rel=1e-6)


def test_no_counted_token_gives_zero_loss_and_metrics():
    zeros = jnp.zeros((2, 3))
    for agg in grpo.AGGREGATIONS:
        loss, metrics = grpo.policy_loss(zeros, zeros, jnp.ones(2), zeros, agg=agg, ref_logp=zeros, kl_coef=0.1,
                                         sampler_logp=zeros, tis_cap=2.0)
        assert float(loss) == 0.0
        assert all(float(v) == 0.0 for v in metrics.values()), metrics


@pytest.mark.parametrize("change, match", [
    (dict(agg="seq-sum"), r"unknown agg 'seq-sum'; known: \['seq-mean-token-mean', 'seq-mean-token-sum', "
                          r"'token-mean'\]"),
    (dict(old_logp=jnp.zeros((2, 4))), r"old_logp shape \(2, 4\) != logp shape \(2, 3\)"),
    (dict(mask=jnp.zeros((3, 3))), r"mask shape \(3, 3\) != logp shape \(2, 3\)"),
    (dict(advantages=jnp.zeros((2, 1))), r"advantages shape \(2, 1\) is neither \(2,\) nor \(2, 3\)"),
    (dict(logp=jnp.zeros(3)), r"logp must be \[B, T\], got shape \(3,\)"),
    (dict(ref_logp=jnp.zeros((2, 2))), r"ref_logp shape \(2, 2\) != logp shape \(2, 3\)"),
    (dict(sampler_logp=jnp.zeros((1, 3))), r"sampler_logp shape \(1, 3\) != logp shape"),
    (dict(kl_coef=0.1), "kl_coef=0.1 needs ref_logp"),
    (dict(tis_cap=2.0), "tis_cap=2.0 needs sampler_logp"),
    (dict(clip_dual=0.9), "clip_dual must be > 1"),
    (dict(clip_low=1.0), r"clip_low must be in \[0, 1\)"),
    (dict(clip_high=-0.1), "clip_high must be >= 0"),
    (dict(tis_cap=0.0, sampler_logp=jnp.zeros((2, 3))), "tis_cap must be > 0, got 0.0"),
])
def test_policy_loss_rejects_bad_arguments(change, match):
    args = dict(logp=jnp.zeros((2, 3)), old_logp=jnp.zeros((2, 3)), advantages=jnp.zeros(2), mask=jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=match):
        grpo.policy_loss(**{**args, **change})
