"""The learner's objectives, from the decoder's final hidden states of one microbatch through the fused LM head.

An objective is `objective(model, hidden, batch, totals, config) -> (loss, metrics)`:

- `hidden`: [b, T, D] final-norm hidden states of the microbatch's rows (`Qwen3VL.hidden_states`, or the
  same stages run by `train_step` for microbatches);
- `totals`: the whole batch's normalisers (`batch_totals`), so that each microbatch returns its share of the
  batch loss and the microbatch losses (and gradients) sum to those of the whole batch at once;
- `metrics`: float32 scalars summed over microbatches (token means arrive weighted by the microbatch's share of
  the batch's trained tokens), except the names in `METRIC_REDUCTIONS`.

"sft" is the next-token cross-entropy of `causal_lm_loss` (the mean over the batch's trained tokens, computed by
`loss.fused_cross_entropy`); "grpo" is `grpo.policy_loss` on the token log-probabilities of `sequence_logprobs`
(computed by `loss.token_logprobs`). Both never materialise [B, T, V] logits.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from ranger_jax.models.qwen3_vl import loss as loss_lib
from ranger_jax.models.qwen3_vl import model as model_lib
from ranger_jax.rl import grpo, learner_config


def trained_positions(batch: Mapping[str, jax.Array]) -> jax.Array:
    """[B, T] bool: token t is trained (loss_mask, a real row, and both t and its predictor t − 1 attended).

    Position 0 is never trained (nothing predicts it); this is `causal_lm_loss`'s counting rule.
    """
    attended = batch["attention_mask"].astype(bool)
    trained = batch["loss_mask"].astype(bool) & attended & jnp.roll(attended, 1, axis=1)
    trained = trained.at[:, 0].set(False)
    if "row_valid" in batch:
        trained = trained & batch["row_valid"].astype(bool)[:, None]
    return trained


def batch_totals(batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """The whole batch's normalisers: trained tokens, and rows with at least one trained token."""
    trained = trained_positions(batch)
    return {"tokens": jnp.sum(trained).astype(jnp.float32),
            "rows": jnp.sum(jnp.any(trained, axis=1)).astype(jnp.float32)}


def _share(part: jax.Array, total: jax.Array) -> jax.Array:
    return part.astype(jnp.float32) / jnp.maximum(total, 1.0)


def _predictor_rows(model: model_lib.Qwen3VL, hidden: jax.Array) -> jax.Array:
    """[b·(T−1), D]: the rows that predict tokens 1..T−1, in the compute dtype."""
    return hidden[:, :-1].astype(model.config.compute_dtype).reshape(-1, hidden.shape[-1])


def token_logprobs(model: model_lib.Qwen3VL, hidden: jax.Array, batch: Mapping[str, jax.Array], *,
                   temperature: float = 1.0) -> jax.Array:
    """[b, T] float32 `log p(input_ids[:, t] | input_ids[:, :t])` of logits / temperature, 0 at t = 0 and wherever t
    or t − 1 is a pad (`sequence_logprobs` from given hidden states)."""
    ids = batch["input_ids"]
    rows = loss_lib.tempered(_predictor_rows(model, hidden), temperature)
    logp = loss_lib.token_logprobs(rows, model.head_weight(), ids[:, 1:].reshape(-1))
    attended = batch["attention_mask"].astype(bool)
    logp = jnp.where(attended[:, 1:] & attended[:, :-1], logp.reshape(ids.shape[0], -1), 0.0)
    return jnp.pad(logp, ((0, 0), (1, 0)))


def sft_loss(model: model_lib.Qwen3VL, hidden: jax.Array, batch: Mapping[str, jax.Array],
             totals: Mapping[str, jax.Array], config: learner_config.LearnerConfig):
    """This microbatch's part of the batch's mean next-token cross-entropy over trained tokens.

    Returns:
        (loss, metrics): Σ over the microbatch's trained tokens of their cross-entropy / the batch's trained
        tokens; no extra metrics.
    """
    weights = trained_positions(batch)[:, 1:].astype(jnp.float32) / jnp.maximum(totals["tokens"], 1.0)
    loss = loss_lib.fused_cross_entropy(_predictor_rows(model, hidden), model.head_weight(),
                                        batch["input_ids"][:, 1:].reshape(-1), weights.reshape(-1))
    return loss, {}


def grpo_loss(model: model_lib.Qwen3VL, hidden: jax.Array, batch: Mapping[str, jax.Array],
              totals: Mapping[str, jax.Array], config: learner_config.LearnerConfig):
    """This microbatch's part of `grpo.policy_loss` with log π_θ of the current parameters.

    π_old is the batch's `sampler_logp` (old_logp="sampler") or this step's own log-probs held constant
    (old_logp="learner": one update per batch, so the pre-update policy is the current one and ρ = 1 in value);
    TIS then weighs by min(π_learner / π_sampler, tis_cap). The KL term reads the batch's `ref_logp`. The policy
    loss normalises by the microbatch's tokens ("token-mean") or rows with tokens (the "seq-mean-*" modes);
    scaling by the microbatch's share of the batch's count makes the microbatch losses sum to the batch loss.

    Returns:
        (loss, metrics): the scaled loss and `policy_loss`'s metrics (token means weighted by token share; ratio
        extremes as given, -inf / inf for a microbatch without trained tokens).
    """
    trained = trained_positions(batch)
    logp = token_logprobs(model, hidden, batch, temperature=config.temperature)
    old_logp = batch["sampler_logp"] if config.old_logp == "sampler" else jax.lax.stop_gradient(logp)
    advantages = batch.get("token_advantages", batch["advantages"])  # per token when the batch has them
    loss, metrics = grpo.policy_loss(logp, old_logp, advantages, trained, clip_low=config.clip_low,
                                     clip_high=config.clip_high, clip_dual=config.clip_dual, agg=config.agg,
                                     ref_logp=batch.get("ref_logp"), kl_coef=config.kl_coef,
                                     sampler_logp=batch["sampler_logp"], tis_cap=config.tis_cap)
    tokens = jnp.sum(trained)
    token_share = _share(tokens, totals["tokens"])
    if config.agg == "token-mean":
        share = token_share
    else:
        share = _share(jnp.sum(jnp.any(trained, axis=1)), totals["rows"])
    weighted = {k: v * token_share for k, v in metrics.items() if k not in METRIC_REDUCTIONS}
    weighted["ratio_max"] = jnp.where(tokens > 0, metrics["ratio_max"], -jnp.inf)
    weighted["ratio_min"] = jnp.where(tokens > 0, metrics["ratio_min"], jnp.inf)
    return loss * share, weighted


OBJECTIVES = {"sft": sft_loss, "grpo": grpo_loss}
METRIC_REDUCTIONS = {"ratio_max": jnp.max, "ratio_min": jnp.min}  # over microbatches; other metrics are summed


def get_objective(name: str):
    """The objective function registered under `name` (a LearnerConfig.objective)."""
    if name not in OBJECTIVES:
        raise ValueError(f"objective {name!r} has no loss; known objectives: {sorted(OBJECTIVES)}")
    return OBJECTIVES[name]
