"""Models in Flax NNX. Today one: `qwen3_vl` (Qwen3-VL, numerically matching transformers)."""

from ranger_jax.models import qwen3_vl

__all__ = ["qwen3_vl"]
