"""Shared parity fixtures: three tiny configs, each as a perturbed transformers checkpoint loaded by `load`.

- "scaled_8b": the 8B's proportions scaled down: 4:1 GQA, head_dim 32 with uneven mrope_section (6, 5, 5),
  a depth-4 tower with DeepStack taps at blocks (1, 2), untied head, 6 x 6 learned position grid.
- "tied": tied embeddings (as 2B / 4B), attention biases, taps (0, 2) of a depth-3 tower, mrope (3, 3, 2).
- "minimal": the smallest: 2 layers, 4:2 GQA with head_dim 16, mrope (4, 2, 2), a depth-2 tower tapping both
  blocks, 8 x 8 learned position grid (also saved as a bfloat16 checkpoint).
"""

from __future__ import annotations

import dataclasses

import pytest
from support import tiny_hf

from ranger_jax.models.qwen3_vl import Qwen3VLConfig, TextConfig, VisionConfig, load

_IDS = dict(image_token_id=5, video_token_id=6, vision_start_token_id=3, vision_end_token_id=4)


def _text(**fields) -> TextConfig:
    base = dict(hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6, attention_bias=False,
                rope_theta=5_000_000.0)
    return TextConfig(**{**base, **fields})


def _vision(**fields) -> VisionConfig:
    base = dict(hidden_act="gelu_pytorch_tanh", in_channels=3, patch_size=16, temporal_patch_size=2,
                spatial_merge_size=2)
    return VisionConfig(**{**base, **fields})


CONFIGS = {
    "scaled_8b": Qwen3VLConfig(
        text_config=_text(vocab_size=384, hidden_size=64, intermediate_size=160, num_hidden_layers=4,
                          num_attention_heads=8, num_key_value_heads=2, head_dim=32, mrope_section=(6, 5, 5)),
        vision_config=_vision(depth=4, hidden_size=48, intermediate_size=96, num_heads=4, out_hidden_size=64,
                              num_position_embeddings=36, deepstack_visual_indexes=(1, 2)),
        tie_word_embeddings=False, **_IDS),
    "tied": Qwen3VLConfig(
        text_config=_text(vocab_size=320, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, mrope_section=(3, 3, 2),
                          attention_bias=True),
        vision_config=_vision(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=48,
                              num_position_embeddings=16, deepstack_visual_indexes=(0, 2)),
        tie_word_embeddings=True, **_IDS),
    "minimal": Qwen3VLConfig(
        text_config=_text(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, mrope_section=(4, 2, 2),
                          max_position_embeddings=2048),
        vision_config=_vision(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                              num_position_embeddings=64, deepstack_visual_indexes=(0, 1)),
        tie_word_embeddings=False, **_IDS),
}

# One row with one image (right-padded), one with images of different sizes between text (full length), one
# with an image near the end (left-padded).
IMAGE_ROWS = [[4, (4, 6), 3], [2, (2, 4), 3, (6, 4), 2, (2, 2), 1], [(4, 4), 5]]
IMAGE_SIDES = ["right", "right", "left"]
TEXT_ROWS = [[9], [6], [4]]
TEXT_SIDES = ["right", "left", "right"]


@dataclasses.dataclass
class Case:
    name: str
    seed: int  # weights seed of the checkpoint
    config: Qwen3VLConfig
    hf: object  # transformers.Qwen3VLForConditionalGeneration, float32, eager
    path: object  # checkpoint directory
    model: object  # our Qwen3VL loaded from `path`


@pytest.fixture(scope="session")
def configs() -> dict[str, Qwen3VLConfig]:
    return dict(CONFIGS)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """`checkpoints(name) -> Case`, built once per session."""
    cache: dict[str, Case] = {}

    def get(name: str) -> Case:
        if name not in cache:
            path = tmp_path_factory.mktemp(f"hf_{name}")
            seed = sorted(CONFIGS).index(name)
            hf = tiny_hf.save_checkpoint(CONFIGS[name], path, seed=seed)
            cache[name] = Case(name, seed, CONFIGS[name], hf, path, load(path))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def image_batch():
    return lambda config: tiny_hf.make_batch(config, IMAGE_ROWS, padding_side=IMAGE_SIDES, seed=11)


@pytest.fixture(scope="session")
def text_batch():
    return lambda config: tiny_hf.make_batch(config, TEXT_ROWS, padding_side=TEXT_SIDES, seed=12)
