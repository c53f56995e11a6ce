"""Settings of the learner: objective, optimiser and schedule, microbatching, precision, and the GRPO objective.

Defaults follow the published recipes this library reproduces: SFT of Qwen3-VL with LLaMA-Factory (lr 1e-5,
cosine, vision tower and projector frozen) and GRPO with verl (lr 1e-6 constant, weight decay 0.01, gradient
clip 1.0, ε_low 0.2, ε_high 0.28, dual clip 3.0, "seq-mean-token-sum"). Recipes change them with
`dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses

from ranger_jax.rl import grpo

OBJECTIVES = ("sft", "grpo")
SCHEDULES = ("constant", "cosine", "linear")
OLD_LOGP_SOURCES = ("sampler", "learner")
DTYPES = ("float32", "bfloat16")


def _choice(field: str, value, known) -> None:
    if value not in known:
        raise ValueError(f"LearnerConfig.{field}={value!r} is not supported; known values: {list(known)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnerConfig:
    """What one optimizer step does (hashable: it is a static part of the compiled train step)."""

    objective: str = "sft"  # "sft": next-token CE on loss_mask tokens; "grpo": clipped policy-gradient loss
    # optimiser: AdamW (decoupled weight decay on matrices and embeddings, not on norms or biases)
    learning_rate: float = 1e-5  # peak learning rate, reached after warmup_steps
    schedule: str = "constant"  # "constant" | "cosine" | "linear" decay from the peak to 0 at total_steps
    warmup_steps: int = 0  # linear warmup from 0 to learning_rate over this many updates
    total_steps: int | None = None  # updates in the whole run; required by "cosine" and "linear"
    weight_decay: float = 0.0  # AdamW λ (decoupled, multiplied by the learning rate as in torch)
    adam_b1: float = 0.9  # β1
    adam_b2: float = 0.999  # β2
    adam_eps: float = 1e-8  # ε in the denominator
    max_grad_norm: float | None = 1.0  # clip the global gradient norm of the trained parameters; None = no clip
    # batch
    grad_accum_steps: int = 1  # microbatches per update: the batch's rows are split, gradients summed by lax.scan
    # model runtime (None keeps the value of the model handed to the learner)
    dtype: str | None = None  # compute dtype; logits, log-probabilities and losses are float32 regardless
    param_dtype: str | None = None  # storage dtype of the parameters (the optimiser moments follow it)
    remat: str | None = None  # jax.checkpoint policy per decoder layer / vision block, a key of REMAT_POLICIES
    freeze_vision: bool = False  # the vision tower and its mergers get no gradients, no updates, no optimiser state
    # names in parameter paths (e.g. "embed_tokens", "mlp", "layers"): every parameter whose path holds one is frozen
    # like the vision tower under freeze_vision; each name must match a parameter
    frozen: tuple[str, ...] = ()
    # GRPO (ignored by "sft"); see `ranger_jax.rl.grpo.policy_loss`
    old_logp: str = "sampler"  # π_old: "sampler" (batch sampler_logp) or "learner" (this step's own, detached)
    clip_low: float = 0.2  # ε_low: ratio clipped below at 1 − ε_low
    clip_high: float = 0.28  # ε_high: ratio clipped above at 1 + ε_high (DAPO clip-higher)
    clip_dual: float | None = None  # dual-clip constant c > 1 for negative advantages (verl: 3.0); None = off
    agg: str = "seq-mean-token-sum"  # loss aggregation over tokens and sequences, a key of grpo.AGGREGATIONS
    kl_coef: float = 0.0  # β of the KL penalty to the reference model; 0 = no reference forward pass
    tis_cap: float | None = None  # truncated importance sampling cap on π_learner / π_sampler; None = off
    # log-probabilities of logits / temperature: the distribution the actors sample from (verl's actor temperature).
    # Set it to the rollout temperature, or ratios and TIS weights compare two different distributions.
    temperature: float = 1.0

    def __post_init__(self):
        _choice("objective", self.objective, OBJECTIVES)
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("old_logp", self.old_logp, OLD_LOGP_SOURCES)
        _choice("agg", self.agg, grpo.AGGREGATIONS)
        for field in ("dtype", "param_dtype"):
            if getattr(self, field) is not None:
                _choice(field, getattr(self, field), DTYPES)
        if not self.learning_rate >= 0:
            raise ValueError(f"LearnerConfig.learning_rate must be >= 0, got {self.learning_rate}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"LearnerConfig.warmup_steps must be an int >= 0, got {self.warmup_steps!r}")
        if self.schedule != "constant":
            if self.total_steps is None:
                raise ValueError(f"LearnerConfig.schedule={self.schedule!r} needs total_steps (the step at which "
                                 "the learning rate reaches 0)")
            if self.total_steps <= self.warmup_steps:
                raise ValueError(f"LearnerConfig.total_steps ({self.total_steps}) must exceed warmup_steps "
                                 f"({self.warmup_steps}) for schedule={self.schedule!r}")
        if not isinstance(self.grad_accum_steps, int) or self.grad_accum_steps < 1:
            raise ValueError(f"LearnerConfig.grad_accum_steps must be an int >= 1, got {self.grad_accum_steps!r}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"LearnerConfig.max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if not self.weight_decay >= 0:
            raise ValueError(f"LearnerConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f"LearnerConfig needs 0 <= clip_low < 1 and clip_high >= 0, got clip_low={self.clip_low}"
                             f", clip_high={self.clip_high}")
        if self.clip_dual is not None and not self.clip_dual > 1:
            raise ValueError(f"LearnerConfig.clip_dual must be > 1 or None, got {self.clip_dual}")
        if not self.kl_coef >= 0:
            raise ValueError(f"LearnerConfig.kl_coef must be >= 0, got {self.kl_coef}")
        if not self.temperature > 0:
            raise ValueError(f"LearnerConfig.temperature must be > 0, got {self.temperature}")
        if (not isinstance(self.frozen, tuple)
                or not all(isinstance(name, str) and name and "." not in name for name in self.frozen)):
            raise ValueError(f"LearnerConfig.frozen must be a tuple of parameter path names without dots (e.g. "
                             f"('embed_tokens', 'mlp')); got {self.frozen!r}")
        if self.tis_cap is not None and not self.tis_cap > 0:
            raise ValueError(f"LearnerConfig.tis_cap must be > 0 or None, got {self.tis_cap}")
        if self.tis_cap is not None and self.old_logp == "sampler":
            raise ValueError("LearnerConfig.tis_cap corrects π_old for the sampler's mismatch, so it needs "
                             "old_logp='learner' (with old_logp='sampler' the ratio already uses the sampler)")
