"""Qwen3-VL in Flax NNX, numerically matching transformers' `Qwen3VLForConditionalGeneration`.

Public entry points:
- `Qwen3VL`, the model: `model(input_ids, attention_mask=, pixel_values=, image_grid_thw=) -> logits [B, T, V]`,
  and its stages `encode_images`, `embed`, `decode`, `compute_logits` as separate jittable calls;
- `Qwen3VLConfig` (with `TextConfig`, `VisionConfig`): HF field names, presets `tiny`, `qwen3_vl_2b`, `qwen3_vl_4b`,
  `qwen3_vl_8b`, and `from_hf` / `to_hf`;
- `load` / `save`: HF safetensors checkpoint folders (`CheckpointError` names a bad key); `init`: random weights;
- `get_rope_index`: the 3-D MRoPE positions of a batch;
- `token_logprobs` / `sequence_logprobs`: per-token log-probs through the fused chunked LM head;
- `loss.causal_lm_loss`: the mean next-token cross-entropy with the LM head fused into the loss;
- `flops.text_flops` / `flops.mfu`: model FLOPs of a forward or train step, and model FLOPs utilisation.
"""

from ranger_jax.models.qwen3_vl import flops, loss
from ranger_jax.models.qwen3_vl.checkpoint import CheckpointError, load, save
from ranger_jax.models.qwen3_vl.config import Qwen3VLConfig, TextConfig, VisionConfig
from ranger_jax.models.qwen3_vl.loss import sequence_logprobs, token_logprobs
from ranger_jax.models.qwen3_vl.model import Qwen3VL, init
from ranger_jax.models.qwen3_vl.rope import get_rope_index

__all__ = ["CheckpointError", "Qwen3VL", "Qwen3VLConfig", "TextConfig", "VisionConfig", "flops", "get_rope_index",
           "init", "load", "loss", "save", "sequence_logprobs", "token_logprobs"]
