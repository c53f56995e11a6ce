"""The GRPO learner: the step's loss against a numpy transcription of the clipped objective on the learner's own
log-probs, gradient accumulation equal to one full batch, and a toy update that moves log-probs the way the
advantages point (with the KL term to the initial policy and TIS weights)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from support.learner_batches import text_batch

from ranger_jax.models.qwen3_vl import load
from ranger_jax.rl.learner import Learner, LearnerConfig

# adam_eps 1e-5 keeps Adam's first step from amplifying float noise in near-zero gradients (see test_learner.py)
GRPO = LearnerConfig(objective="grpo", learning_rate=3e-3, max_grad_norm=1.0, adam_eps=1e-5, old_logp="sampler",
                     clip_low=0.2, clip_high=0.28, clip_dual=3.0, agg="seq-mean-token-sum")


def trained_positions(batch) -> np.ndarray:
    attended = batch["attention_mask"].astype(bool)
    trained = batch["loss_mask"].astype(bool) & attended & np.roll(attended, 1, axis=1)
    trained[:, 0] = False
    return trained & batch["row_valid"].astype(bool)[:, None]


def numpy_grpo_loss(logp, sampler_logp, advantages, trained, *, clip_low, clip_high, clip_dual):
    """verl's clipped objective with dual clip, 'seq-mean-token-sum' over rows that have trained tokens."""
    ratio = np.exp(logp - sampler_logp)
    adv = advantages[:, None]
    loss = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - clip_low, 1 + clip_high))
    loss = np.where(adv < 0, np.minimum(loss, -adv * clip_dual), loss)
    per_row = np.sum(np.where(trained, loss, 0.0), axis=1)
    rows = trained.any(axis=1)
    clip_high_frac = np.sum(trained & (adv > 0) & (ratio > 1 + clip_high)) / trained.sum()
    return per_row[rows].mean(), clip_high_frac


@pytest.fixture(scope="module")
def sampled_batch(tiny_checkpoint):
    """A batch whose sampler log-probs are the model's own plus noise (ratios off 1, some clipped), one padding
    row, and mixed-sign advantages."""
    batch = text_batch(6)
    batch["row_valid"][5] = 0.0
    rng = np.random.default_rng(7)
    logp = Learner(load(tiny_checkpoint), GRPO).logprobs(batch)
    trained = trained_positions(batch)
    batch["sampler_logp"] = np.where(trained, logp + rng.normal(0.0, 0.3, logp.shape), 0.0).astype(np.float32)
    batch["advantages"] = rng.normal(0.0, 1.0, 8).astype(np.float32)
    return batch, logp


@pytest.fixture(scope="module")
def one_step(tiny_checkpoint, sampled_batch):
    batch, _ = sampled_batch
    learner = Learner(load(tiny_checkpoint), GRPO)
    return learner.step(batch), learner.logprobs(batch)


def test_grpo_loss_is_the_clipped_objective_of_its_own_logprobs(sampled_batch, one_step):
    batch, logp = sampled_batch
    metrics, _ = one_step
    expected, clip_high_frac = numpy_grpo_loss(logp, batch["sampler_logp"], batch["advantages"],
                                               trained_positions(batch), clip_low=0.2, clip_high=0.28, clip_dual=3.0)
    assert metrics["loss"] == pytest.approx(expected, abs=1e-5)  # a sum of O(1) terms of both signs
    assert metrics["clip_frac_high"] == pytest.approx(clip_high_frac, abs=1e-6)
    assert metrics["tokens"] == trained_positions(batch).sum()
    assert metrics["ratio_max"] > 1.28 > 0.8 > metrics["ratio_min"] > 0.0


def test_grpo_gradient_accumulation_equals_one_full_batch(tiny_checkpoint, sampled_batch, one_step):
    batch, _ = sampled_batch
    metrics, logp_after = one_step
    learner = Learner(load(tiny_checkpoint), dataclasses.replace(GRPO, grad_accum_steps=2))
    accumulated = learner.step(batch)
    assert set(accumulated) == set(metrics)
    for key, value in metrics.items():
        assert accumulated[key] == pytest.approx(value, abs=1e-5), key
    np.testing.assert_allclose(learner.logprobs(batch), logp_after, atol=1e-5)


def test_advantages_move_logprobs_their_way_with_kl_to_the_initial_policy(tiny_checkpoint):
    config = dataclasses.replace(GRPO, old_logp="learner", clip_dual=None, kl_coef=0.05, tis_cap=2.0)
    learner = Learner(load(tiny_checkpoint), config)
    batch = text_batch(8)
    trained = trained_positions(batch)
    before = learner.logprobs(batch)
    batch["sampler_logp"] = np.where(trained, before - 0.1, 0.0).astype(np.float32)  # TIS weight e^0.1
    batch["advantages"] = np.array([1, 1, 1, 1, -1, -1, -1, -1], np.float32)
    first = learner.step(batch)
    # ρ = 1 in value and the policy is its own reference: loss = mean_b(−A_b · w · n_b), KL 0
    weight = np.exp(0.1)
    assert first["loss"] == pytest.approx(np.mean(-batch["advantages"] * weight * trained.sum(axis=1)), rel=1e-5)
    assert first["tis_weight_mean"] == pytest.approx(weight, rel=1e-6)
    assert first["kl"] == 0.0 and first["ratio_mean"] == 1.0
    after = learner.logprobs(batch)
    change = np.where(trained, after - before, 0.0).sum(axis=1) / trained.sum(axis=1)
    assert np.all(change[:4] > 0) and np.all(change[4:] < 0), change
    second = learner.step(batch)
    assert second["kl"] > 0.0


def test_logprobs_follow_the_rollout_temperature(tiny_checkpoint, sampled_batch):
    import jax
    import jax.numpy as jnp

    batch, logp = sampled_batch
    model = load(tiny_checkpoint)
    logits = np.asarray(model(jnp.asarray(batch["input_ids"]), attention_mask=jnp.asarray(batch["attention_mask"])))
    ids, attended = batch["input_ids"], batch["attention_mask"].astype(bool)
    live = attended[:, 1:] & attended[:, :-1]
    for temperature in (1.0, 0.7):
        picked = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits[:, :-1] / temperature, axis=-1)),
                                    ids[:, 1:, None], axis=-1)[..., 0]
        expected = np.pad(np.where(live, picked, 0.0), ((0, 0), (1, 0)))
        learner = Learner(model, dataclasses.replace(GRPO, temperature=temperature))
        np.testing.assert_allclose(learner.logprobs(batch), expected, atol=2e-5)
    # samples drawn at 0.7 with their log-probs: a learner at 0.7 sees ratio 1, one at 1.0 another distribution
    tempered = dataclasses.replace(GRPO, temperature=0.7)
    at_rollout = {**batch, "sampler_logp": Learner(model, tempered).logprobs(batch)}
    same = Learner(load(tiny_checkpoint), tempered).step(at_rollout)
    assert same["ratio_max"] == pytest.approx(1.0, abs=1e-4) and same["ratio_min"] == pytest.approx(1.0, abs=1e-4)
    other = Learner(load(tiny_checkpoint), GRPO).step(at_rollout)
    assert abs(other["ratio_max"] - 1.0) > 0.05 or abs(other["ratio_min"] - 1.0) > 0.05
    assert Learner(model, dataclasses.replace(tempered, objective="sft")).logprobs(batch) == pytest.approx(logp)
    with pytest.raises(ValueError, match="temperature must be > 0, got 0.0"):
        dataclasses.replace(GRPO, temperature=0.0)
