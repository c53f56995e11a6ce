"""A small Qwen3-VL-shaped policy trained from scratch on CPU: its tokenizer, its shapes, its vision settings.

The policy is an ordinary `Qwen3VL` (text decoder with MRoPE and GQA, a vision tower with DeepStack taps) at a
size two CPU cores train in minutes. Its tokenizer is a compact byte-level BPE learned from the domain's episodes
(`processing.compact_tokenizer`), so the embedding and head have a few thousand rows instead of 151k; every id
the chat renderer, sampler and learner need comes from that tokenizer, exactly as for Qwen3-VL-8B. Observation
images are resized to at most `MAX_PIXELS`, i.e. a handful of image tokens each.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

from ranger_jax.models import qwen3_vl
from ranger_jax.processing import compact_tokenizer
from ranger_jax.processing import tokenizer as tokenizer_lib
from ranger_jax.rollout import sequence

MIN_PIXELS = 32 * 32  # one merged token
MAX_PIXELS = 64 * 64  # at most 2 x 2 merged tokens (4 x 4 patches of 16 px)
VISION = sequence.VisionSettings(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TinyPolicySize:
    """Shapes of the tiny policy (names as in `Qwen3VLConfig`)."""

    hidden_size: int = 128  # D
    intermediate_size: int = 384  # F
    num_hidden_layers: int = 4
    num_attention_heads: int = 4  # N
    num_key_value_heads: int = 2  # K
    head_dim: int = 32  # H; mrope sections split H / 2 = 16 rotary slots as (8, 4, 4)
    vocab_size: int = 2048  # tokenizer size (the embedding rows are rounded up to a multiple of 128)
    max_position_embeddings: int = 8192
    vision_depth: int = 1
    vision_hidden_size: int = 32
    # Logits from the input embeddings, as Qwen3-VL-2B/4B do. For a model this small it decides whether it can copy
    # from its context at all: see `rl.copy_warmup` (the repeated-window loss falls to 0.09-0.22 in 150 steps tied,
    # and is still 4.6 after 300 untied).
    tie_word_embeddings: bool = True

    def __post_init__(self):
        if not isinstance(self.tie_word_embeddings, bool):
            raise ValueError(f"TinyPolicySize.tie_word_embeddings must be a bool; got {self.tie_word_embeddings!r}")
        for field in dataclasses.fields(self):
            if field.name == "tie_word_embeddings":
                continue
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TinyPolicySize.{field.name} must be a positive int; got {value!r}")
        if self.head_dim % 4:
            raise ValueError(f"TinyPolicySize.head_dim must be a multiple of 4 (MRoPE); got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")


def train_tokenizer(texts: Iterable[str], directory: str | os.PathLike, *, vocab_size: int) -> tokenizer_lib.Tokenizer:
    """Learns the policy's compact tokenizer from episode texts and loads it."""
    compact_tokenizer.train_compact_tokenizer(texts, directory, vocab_size=vocab_size)
    return tokenizer_lib.load_tokenizer(directory)


def model_config(tokenizer: tokenizer_lib.Tokenizer, size: TinyPolicySize = TinyPolicySize()
                 ) -> qwen3_vl.Qwen3VLConfig:
    """The tiny policy's `Qwen3VLConfig`, with vocabulary and special ids taken from `tokenizer`."""
    base = qwen3_vl.Qwen3VLConfig.tiny()
    half = size.head_dim // 2
    sections = (half - 2 * (half // 4), half // 4, half // 4)
    text = dataclasses.replace(
        base.text_config, vocab_size=-(-tokenizer.vocab_size // 128) * 128, hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size, num_hidden_layers=size.num_hidden_layers,
        num_attention_heads=size.num_attention_heads, num_key_value_heads=size.num_key_value_heads,
        head_dim=size.head_dim, mrope_section=sections, max_position_embeddings=size.max_position_embeddings,
        bos_token_id=None, eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id)
    vision = dataclasses.replace(
        base.vision_config, depth=size.vision_depth, hidden_size=size.vision_hidden_size,
        intermediate_size=2 * size.vision_hidden_size, num_heads=2, out_hidden_size=size.hidden_size,
        deepstack_visual_indexes=tuple(range(min(1, size.vision_depth))))
    return dataclasses.replace(base, text_config=text, vision_config=vision, image_token_id=tokenizer.image_pad_id,
                               tie_word_embeddings=size.tie_word_embeddings,
                               video_token_id=tokenizer.video_pad_id, vision_start_token_id=tokenizer.vision_start_id,
                               vision_end_token_id=tokenizer.vision_end_id)


def init_policy(tokenizer: tokenizer_lib.Tokenizer, size: TinyPolicySize = TinyPolicySize(), *, seed: int = 0
                ) -> qwen3_vl.Qwen3VL:
    """A freshly initialised tiny policy for `tokenizer`."""
    return qwen3_vl.init(model_config(tokenizer, size), seed=seed)
