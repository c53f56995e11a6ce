"""Qwen3-VL in Flax NNX, numerically matching transformers' `Qwen3VLForConditionalGeneration`.

Public API: `Qwen3VL`, `Qwen3VLConfig` (with `TextConfig`, `VisionConfig`), `load`, `save`, `init`,
`get_rope_index`, and `token_logprobs` / `sequence_logprobs` (per-token log-probs through the fused chunked LM head).
"""

from ranger_jax.models.qwen3_vl.checkpoint import CheckpointError, load, save
from ranger_jax.models.qwen3_vl.config import Qwen3VLConfig, TextConfig, VisionConfig
from ranger_jax.models.qwen3_vl.loss import sequence_logprobs, token_logprobs
from ranger_jax.models.qwen3_vl.model import Qwen3VL, init
from ranger_jax.models.qwen3_vl.rope import get_rope_index

__all__ = ["CheckpointError", "Qwen3VL", "Qwen3VLConfig", "TextConfig", "VisionConfig", "get_rope_index", "init",
           "load", "save", "sequence_logprobs", "token_logprobs"]
