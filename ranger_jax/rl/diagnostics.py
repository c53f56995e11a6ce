"""How consistent is a policy gradient? Agreement between the gradients of independent batches, and the noise scale.

A GRPO update helps on unseen tasks only when the batch gradient points the same way as the expected gradient.
From the gradients g_1..g_k of k independent batches of b rows each (`Learner.gradient`, nothing updated):

    ḡ = mean_i g_i,   S = Σ_i |g_i − ḡ|² / (k − 1)      (tr Σ_b: the noise of one batch gradient)
    |G|² ≈ |ḡ|² − S / k                                   (unbiased squared norm of the expected gradient)
    B_noise = b · S / |G|²                                 (McCandlish et al. 2018, "An Empirical Model of
                                                             Large-Batch Training": rows per batch at which signal
                                                             and noise are equal)

plus two direct readings: the mean cosine between pairs of batch gradients, and the cosine between the sums of the
first and the second half of the batches (near 0: the two halves disagree, the gradient is noise at that size).
When |G|² is not measurably above 0 the noise scale is reported as infinite: more rows than were measured.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class GradientAgreement:
    """Agreement of k batch gradients (see the module docstring)."""

    num_batches: int
    batch_rows: int  # rows (episodes) per batch, b
    mean_pairwise_cosine: float
    half_cosine: float  # cosine between the sums of the two halves of the batches
    mean_gradient_norm: float
    signal_norm_sq: float  # |G|² estimate; may be <= 0 when the signal is below the noise
    noise_norm_sq: float  # S = tr Σ_b
    noise_scale: float  # B_noise in rows; inf when |G|² <= 0

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (an infinite noise scale as None)."""
        out = dataclasses.asdict(self)
        out["noise_scale"] = None if math.isinf(self.noise_scale) else self.noise_scale
        return out


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / norms if norms > 0 else 0.0


def gradient_agreement(gradients: Sequence[np.ndarray] | np.ndarray, batch_rows: int) -> GradientAgreement:
    """Agreement statistics of k >= 4 flat gradients of equal length, each from a batch of `batch_rows` rows.

    Raises:
        ValueError: fewer than 4 gradients, unequal lengths, non-finite values, or batch_rows < 1.
    """
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise ValueError(f"batch_rows must be a positive int; got {batch_rows!r}")
    sizes = {np.asarray(g).size for g in gradients}
    if len(gradients) < 4:
        raise ValueError(f"gradient_agreement needs at least 4 batch gradients (two per half); got {len(gradients)}")
    if len(sizes) != 1:
        raise ValueError(f"the gradients have different lengths: {sorted(sizes)}")
    g = np.stack([np.asarray(x, np.float64).reshape(-1) for x in gradients])
    if not np.all(np.isfinite(g)):
        raise ValueError("a gradient holds non-finite values")
    k = g.shape[0]
    unit = g / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-300)
    pairwise = unit @ unit.T
    mean_pairwise = float((pairwise.sum() - np.trace(pairwise)) / (k * (k - 1)))
    mean = g.mean(axis=0)
    noise = float(((g - mean) ** 2).sum() / (k - 1))
    signal = float(mean @ mean) - noise / k
    return GradientAgreement(
        num_batches=k, batch_rows=batch_rows, mean_pairwise_cosine=mean_pairwise,
        half_cosine=_cosine(g[:k // 2].sum(axis=0), g[k // 2:].sum(axis=0)),
        mean_gradient_norm=float(np.linalg.norm(g, axis=1).mean()), signal_norm_sq=signal, noise_norm_sq=noise,
        noise_scale=batch_rows * noise / signal if signal > 0 else math.inf)


def measure(learner: Any, batches: Iterable[Mapping[str, Any]]) -> GradientAgreement:
    """`gradient_agreement` of `learner.gradient(batch)` over `batches` (all of one row count), nothing updated.

    Raises:
        ValueError: batches with different row counts, or fewer than 4.
    """
    gradients, rows = [], set()
    for batch in batches:
        rows.add(int(np.asarray(batch["input_ids"]).shape[0]))
        gradients.append(learner.gradient(batch))
    if len(rows) > 1:
        raise ValueError(f"the batches have different row counts: {sorted(rows)}")
    return gradient_agreement(gradients, rows.pop() if rows else 1)


def length_buckets(lengths: Iterable[int], headroom: int, smallest: int = 512) -> tuple[int, ...]:
    """Powers of two from `smallest` up to the first that holds the longest row plus `headroom`."""
    longest = max(lengths, default=0) + headroom
    buckets = [smallest]
    while buckets[-1] < longest:
        buckets.append(buckets[-1] * 2)
    return tuple(buckets)


def measure_policy(policy_dir: str, shards_location: str | Sequence[str], *, batch_size: int, seed: int = 0,
                   max_batches: int | None = None, agg: str = "seq-mean-token-mean", temperature: float = 1.0,
                   advantages: str = "group") -> GradientAgreement:
    """The agreement of GRPO gradients of a checkpoint on recorded GRPO groups (trajectory shards), nothing updated.

    Batches are whole groups with their GRPO advantages (`data.pipeline.trajectory_dataset`), one pass in a seeded
    order; images are prepared with the bounds the checkpoint records (`ranger_env.json`), else the defaults.
    `temperature` is the rollouts' (the learner's log-probs are taken at it, `LearnerConfig.temperature`);
    `advantages` is the estimator ("group" or "prefix-tree", `pipeline.trajectory_dataset`).

    Raises:
        ValueError: no shards, fewer than 4 batches, or bad settings.
    """
    from ranger_jax.data import batching, filters, pipeline, shards
    from ranger_jax.models import qwen3_vl
    from ranger_jax.processing import tokenizer as tokenizer_lib
    from ranger_jax.rl import learner as learner_lib
    from ranger_jax.rl import learner_config
    from ranger_jax.rollout import sequence, trained_env

    source = shards.TrajectorySource(shards_location)
    if not len(source):
        raise ValueError(f"no trajectories in {shards_location}")
    recorded = trained_env.read(policy_dir)
    vision = sequence.VisionSettings(**recorded.image) if recorded and recorded.image else sequence.VisionSettings()
    tokenizer = tokenizer_lib.load_tokenizer(policy_dir)
    probe = batching.BatchSpec.for_tokenizer(tokenizer, batch_size=batch_size, length_buckets=(1 << 20,), vision=vision)
    buckets = length_buckets((source[i].num_tokens for i in range(len(source))), probe.image_headroom)
    spec = batching.BatchSpec.for_tokenizer(tokenizer, batch_size=batch_size, length_buckets=buckets, vision=vision)
    learner = learner_lib.Learner(qwen3_vl.load(policy_dir), learner_config.LearnerConfig(
        objective="grpo", old_logp="learner", agg=agg, temperature=temperature))
    dataset = pipeline.trajectory_dataset(source, spec=spec, vision=vision, config=filters.FilterConfig(),
                                          stats=filters.FilterStats(), grpo_groups=True, num_epochs=1, seed=seed,
                                          advantages=advantages)
    batches = (batch for i, batch in enumerate(dataset) if max_batches is None or i < max_batches)
    return measure(learner, batches)
