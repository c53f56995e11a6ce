"""The learner's optimiser: global-norm clipping, then AdamW with a warmup + decay learning-rate schedule.

    lr(s) = peak · s / warmup                                   for s < warmup
          = peak                                                 "constant"
          = peak · ½ (1 + cos(π (s − warmup) / (total − warmup)))  "cosine" (transformers' cosine with warmup)
          = peak · (total − s) / (total − warmup)                  "linear"

where s counts optimizer updates from 0. Weight decay is decoupled (Loshchilov & Hutter 2019) and, as in
transformers' `Trainer`, applies to weight matrices and embedding tables but not to biases and norm scales.
"""

from __future__ import annotations

from typing import Any

import jax
import optax
from flax import nnx

from ranger_jax.rl import learner_config


def learning_rate_schedule(config: learner_config.LearnerConfig) -> optax.Schedule:
    """The learning rate as a function of the update count (see the module docstring)."""
    peak, warmup = config.learning_rate, config.warmup_steps
    if config.schedule == "constant":
        after = optax.constant_schedule(peak)
    elif config.schedule == "cosine":
        after = optax.cosine_decay_schedule(peak, config.total_steps - warmup)
    else:
        after = optax.linear_schedule(peak, 0.0, config.total_steps - warmup)
    if warmup == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])


def _decays(path, variable: nnx.Variable) -> nnx.Variable:
    names = [str(getattr(key, "key", getattr(key, "name", key))) for key in path]
    decayed = names[-1] != "bias" and not any("norm" in name for name in names[:-1])
    return variable.replace(decayed)


def weight_decay_mask(params: Any) -> Any:
    """True for weights that decay: every parameter except biases and the scales of norm layers.

    Args:
        params: an `nnx.State` of parameters (paths are the HF keys, e.g. `...input_layernorm.weight`).
    """
    return jax.tree_util.tree_map_with_path(_decays, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def make_optimizer(config: learner_config.LearnerConfig) -> optax.GradientTransformation:
    """Clip by global norm (when `max_grad_norm` is set), then AdamW on `learning_rate_schedule(config)`."""
    adamw = optax.adamw(learning_rate_schedule(config), b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps,
                        weight_decay=config.weight_decay, mask=weight_decay_mask)
    if config.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw)
