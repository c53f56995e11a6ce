"""KV-cache sampling for Qwen3-VL: batched prefill and a jitted decode loop, multi-turn sessions, shape buckets.

Public API: `Sampler`, `SamplingParams`, `Segment`, `Completion`, `Session`, `Buckets`, `FINISH_STOP`,
`FINISH_LENGTH`; the pure next-token functions live in `ranger_jax.sampling.logits`.
"""

from ranger_jax.sampling.buckets import Buckets
from ranger_jax.sampling.cache import Session
from ranger_jax.sampling.sampler import FINISH_LENGTH, FINISH_STOP, Completion, Sampler, SamplingParams, Segment

__all__ = ["FINISH_LENGTH", "FINISH_STOP", "Buckets", "Completion", "Sampler", "SamplingParams", "Segment",
           "Session"]
