"""Trajectories recorded the way the rollout records them (for data-pipeline tests), with a tiny tokenizer.

    renderer = tiny_renderer(tmp_path, image_pad_id=40)
    trajectory, prepared = record(renderer, VISION, seed=0, group_id="g0")
    # prepared[i].pixel_values: the pixels the sampler encoded for image i

Each trajectory is a system + user prompt with one image, then `turns` rounds of: generation prompt, sampled
ids (random text tokens + `<|im_end|>`, random log-probs), and a tool response with one image. Images go through
`rollout.sequence.prepare_image` and `TokenSequence`, exactly as in an episode.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from ranger_jax.data import trajectory as trajectory_lib
from ranger_jax.processing import ChatRenderer, load_tokenizer
from ranger_jax.rollout import sequence
from support.tiny_tokenizer import DEFAULT_SPECIAL_IDS, write_tiny_tokenizer

VISION = sequence.VisionSettings(min_pixels=1024, max_pixels=8192)


def tiny_renderer(directory: Path, *, image_pad_id: int | None = None, vocab_size: int = 512) -> ChatRenderer:
    """A renderer over the tiny test tokenizer; `image_pad_id` moves `<|image_pad|>` (swapping with the holder)."""
    ids = dict(DEFAULT_SPECIAL_IDS)
    if image_pad_id is not None:
        ids["<|image_pad|>"] = image_pad_id
    write_tiny_tokenizer(directory, vocab_size=vocab_size, special_ids=ids)
    return ChatRenderer(load_tokenizer(directory))


def random_image(rng: np.random.Generator) -> Image.Image:
    height, width = (int(x) for x in rng.integers(24, 90, 2))
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def record(renderer: ChatRenderer, vision: sequence.VisionSettings = VISION, *, seed: int, group_id: str = "g0",
           sample_index: int = 0, policy_version: int = 0, reward: float = 0.0, termination: str | None = "answer",
           turns: int = 2, answer_tokens: int = 5, sample_seed: int | None = None
           ) -> tuple[trajectory_lib.Trajectory, list[sequence.PreparedImage]]:
    """One recorded trajectory and its prepared images (the sampler's pixel values). With `sample_seed`, the
    turns (sampled tokens, tool images) draw from it and the context from `seed`: the members of a group that
    branched after its first message."""
    rng = np.random.default_rng(seed)
    tok = renderer.tokenizer
    seq = sequence.TokenSequence(image_pad_id=tok.image_pad_id, merge_size=vision.merge_size)
    first = sequence.prepare_image(random_image(rng), vision, img_id="IMG_001")
    seq.append(renderer.render_prefix("You ground prompts.", f"Draw thing {seed}.", date="2026-05-01",
                                      images_grid_thw=[first.grid_thw]), [first])
    text_ids = [i for i in tok.encode("the quick brown fox jumps over the lazy dog 1234") if i not in tok.vision_ids]
    if sample_seed is not None:
        rng = np.random.default_rng([seed, sample_seed])
    for turn in range(turns):
        seq.append(renderer.generation_prompt())
        sampled = rng.choice(text_ids, answer_tokens).tolist() + [tok.im_end_id]
        seq.append_generated(np.array(sampled), -rng.random(len(sampled)).astype(np.float32))
        seq.append(renderer.assistant_suffix())
        image = sequence.prepare_image(random_image(rng), vision, img_id=f"IMG_{turn + 2:03d}")
        seq.append(renderer.render_tool_response(f"result {turn}", images_grid_thw=[image.grid_thw]), [image])
    trajectory = trajectory_lib.Trajectory(
        task_id=f"task-{seed}", group_id=group_id, sample_index=sample_index, policy_version=policy_version,
        images=tuple(seq.images), termination=termination, reward=reward, image_pad_id=tok.image_pad_id,
        merge_size=vision.merge_size, **seq.arrays())
    return trajectory, list(seq.prepared)
