"""One tiny transformers checkpoint (GQA 4:1, DeepStack, uneven mrope sections), our model loaded from it, and one
shared `Sampler` whose buckets keep every test on a few compiled shapes (B 4, T 32, S 128, 4 images, 16 new tokens)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from support import tiny_hf

from ranger_jax.models.qwen3_vl import Qwen3VLConfig, TextConfig, VisionConfig, load
from ranger_jax.sampling import Buckets, Sampler, Segment

CONFIG = Qwen3VLConfig(
    text_config=TextConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                           num_attention_heads=8, num_key_value_heads=2, head_dim=16, hidden_act="silu",
                           max_position_embeddings=4096, rms_norm_eps=1e-6, attention_bias=False,
                           rope_theta=5_000_000.0, mrope_section=(3, 3, 2)),
    vision_config=VisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                               hidden_act="gelu_pytorch_tanh", in_channels=3, patch_size=16, temporal_patch_size=2,
                               spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=16,
                               deepstack_visual_indexes=(0, 1)),
    image_token_id=5, video_token_id=6, vision_start_token_id=3, vision_end_token_id=4, tie_word_embeddings=False)
BUCKETS = Buckets(min_batch=4, min_length=32, min_cache=128, min_images=4, min_new_tokens=16)


@dataclasses.dataclass
class Tiny:
    config: Qwen3VLConfig
    hf: object  # transformers Qwen3VLForConditionalGeneration, eager, float32
    path: object  # checkpoint directory
    model: object  # our Qwen3VL
    sampler: Sampler
    vision_ids: tuple[int, ...] = (3, 4, 5, 6)  # vision_start, vision_end, image_pad, video_pad


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Tiny:
    path = tmp_path_factory.mktemp("sampling_ckpt")
    hf = tiny_hf.save_checkpoint(CONFIG, path, seed=7)
    model = load(path)
    return Tiny(CONFIG, hf, path, model, Sampler(model, buckets=BUCKETS))


def _segments(batch) -> list[Segment]:
    ids, mask, grid = batch["input_ids"], batch["attention_mask"].astype(bool), batch["image_grid_thw"]
    out, image, patch = [], 0, 0
    for row in range(ids.shape[0]):
        real = ids[row][mask[row]]
        count = int(np.sum(real == CONFIG.vision_start_token_id))  # make_batch: vision_start + pads + vision_end
        if count == 0:
            out.append(Segment(real))
            continue
        grids = grid[image:image + count]
        patches = int(grids.prod(-1).sum())
        out.append(Segment(real, batch["pixel_values"][patch:patch + patches], grids))
        image, patch = image + count, patch + patches
    return out


@pytest.fixture(scope="session")
def to_segments():
    """`to_segments(batch)`: a padded `tiny_hf.make_batch` batch as one unpadded Segment per row with its images."""
    return _segments
