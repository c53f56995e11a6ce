"""Per-example dicts for the learner: one training row, before batching.

An example is a dict of numpy arrays (shapes: L tokens, P_i patch rows, n_i images, I patch features):

    input_ids       [L] int32     token ids exactly as recorded or rendered
    attention_mask  [L] int32     all ones (padding is added by `batching.collate`)
    loss_mask       [L] float32   1 on tokens the policy produced and is trained on; position 0 is never trained
    sampler_logp    [L] float32   the sampler's log-prob of token t (0 where loss_mask is 0)
    pixel_values    [P_i, I] float32, image_grid_thw [n_i, 3] int32   (HF conventions, images in token order)
    policy_version  int32 scalar  weights version that sampled the row (-1 for SFT data)
    reward          float32 scalar (trajectories only: GRPO advantages come from it; batches do not carry it)

`trajectory_example` reads a recorded `Trajectory` without re-tokenising anything. Its pixel values come from
the stored PNG: the rollout records each image already resized to its patch grid (`rollout.sequence.
prepare_image`), so patching the PNG at exactly its own size (`min_pixels = max_pixels = width · height`, no
resize) reproduces the `pixel_values` the sampler encoded, bit for bit, whatever pixel bounds the rollout used.
"""

from __future__ import annotations

import collections
import hashlib
import io
import threading
from typing import Any

import numpy as np
from PIL import Image

from ranger_jax.data.trajectory import Trajectory, TrajectoryImage
from ranger_jax.processing import image as image_lib

SFT_POLICY_VERSION = -1  # policy_version of rows that no policy sampled (SFT data)
PIXEL_MEMO_BYTES = 256 * 2**20  # patch rows kept for images seen again (`image_pixels`)


class _PixelMemo:
    """Recently patched images, by their PNG's digest and the patching: the members of a GRPO group record the same
    context images, so a round of groups of 8 decodes each image once instead of 8 times. Bounded by the bytes of
    the arrays it holds (least recently used go first); shared by the data pipeline's reader threads."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = max_bytes, 0
        self._items: collections.OrderedDict[tuple, np.ndarray] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> np.ndarray | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: tuple, value: np.ndarray) -> None:
        if value.nbytes > self.max_bytes:
            return
        value.setflags(write=False)  # shared between examples: nothing may write into it
        with self._lock:
            if key in self._items:
                return
            self._items[key] = value
            self.bytes += value.nbytes
            while self.bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self.bytes -= old.nbytes


_PIXEL_MEMO = _PixelMemo(PIXEL_MEMO_BYTES)


def image_pixels(image: TrajectoryImage, *, patch_size: int, merge_size: int, temporal_patch_size: int,
                 where: str = "image") -> np.ndarray:
    """Patch rows of one recorded image, as the policy's processor produced them.

    Args:
        image: the recorded image (PNG at its processor size, and its grid).
        patch_size, merge_size, temporal_patch_size: the vision tower's patching.
        where: names the image in errors (e.g. "shard s.array_record record 4 image 2 (IMG_003)").

    Returns:
        [t·h·w, 3·temporal_patch_size·patch_size²] float32, read-only (an image seen again, e.g. by the other
        members of a GRPO group, returns the array made the first time: `_PixelMemo`).

    Raises:
        ValueError: the PNG's size is not its grid times `patch_size` (it was not recorded at processor size).
    """
    key = (hashlib.blake2b(image.png, digest_size=16).digest(), tuple(image.grid_thw), patch_size, merge_size,
           temporal_patch_size)
    if (memo := _PIXEL_MEMO.get(key)) is not None:
        return memo
    pixel_values = _patched(image, patch_size=patch_size, merge_size=merge_size,
                            temporal_patch_size=temporal_patch_size, where=where)
    _PIXEL_MEMO.put(key, pixel_values)
    return pixel_values


def _patched(image: TrajectoryImage, *, patch_size: int, merge_size: int, temporal_patch_size: int,
             where: str) -> np.ndarray:
    _, grid_h, grid_w = image.grid_thw
    with Image.open(io.BytesIO(image.png)) as decoded:
        decoded.load()
        rgb = decoded.convert("RGB")
    if rgb.size != (grid_w * patch_size, grid_h * patch_size):
        raise ValueError(f"{where}: PNG is {rgb.width}x{rgb.height} but grid_thw={list(image.grid_thw)} with "
                         f"patch_size={patch_size} needs {grid_w * patch_size}x{grid_h * patch_size}")
    area = rgb.width * rgb.height
    pixel_values, grid = image_lib.preprocess_image(rgb, min_pixels=area, max_pixels=area, patch_size=patch_size,
                                                    merge_size=merge_size, temporal_patch_size=temporal_patch_size)
    if tuple(int(g) for g in grid) != image.grid_thw:  # a multi-frame grid (t > 1) cannot come from one PNG
        raise ValueError(f"{where}: PNG patches to grid {grid.tolist()}, recorded grid_thw={list(image.grid_thw)}")
    return pixel_values


def trajectory_example(trajectory: Trajectory, *, image_pad_id: int, patch_size: int = 16,
                       temporal_patch_size: int = 2, where: str = "trajectory") -> dict[str, Any]:
    """The example of one recorded trajectory: its exact tokens, masks, log-probs and pixels.

    Args:
        trajectory: a validated record (from `shards.TrajectorySource` or `read_shard`).
        image_pad_id: the tokenizer's `<|image_pad|>` id the learner's model uses (`Tokenizer.image_pad_id`);
            it must equal the id the record was written with.
        patch_size, temporal_patch_size: the vision tower's patching (merge size comes from the record).
        where: names the record in errors.

    Returns:
        The example dict of the module docstring, with `reward`.

    Raises:
        ValueError: the record's image pad id differs from `image_pad_id`, or an image's PNG does not match its
            grid (both naming `where`).
    """
    if trajectory.image_pad_id != image_pad_id:
        raise ValueError(f"{where}: recorded with image_pad_id={trajectory.image_pad_id} but the learner's "
                         f"tokenizer uses {image_pad_id}; these trajectories belong to another tokenizer")
    features = 3 * temporal_patch_size * patch_size * patch_size
    pixels = [image_pixels(image, patch_size=patch_size, merge_size=trajectory.merge_size,
                           temporal_patch_size=temporal_patch_size,
                           where=f"{where} image {i}" + (f" ({image.img_id})" if image.img_id else ""))
              for i, image in enumerate(trajectory.images)]
    loss_mask = trajectory.loss_mask.astype(np.float32)
    sampler_logp = trajectory.sampler_logprobs.astype(np.float32)
    if loss_mask.size:  # token 0 has no context to be predicted from
        loss_mask[0] = sampler_logp[0] = 0.0
    return {
        "input_ids": trajectory.token_ids.astype(np.int32),
        "attention_mask": np.ones(trajectory.num_tokens, np.int32),
        "loss_mask": loss_mask,
        "sampler_logp": sampler_logp,
        "pixel_values": np.concatenate(pixels) if pixels else np.zeros((0, features), np.float32),
        "image_grid_thw": np.array([im.grid_thw for im in trajectory.images], np.int32).reshape(-1, 3),
        "policy_version": np.int32(trajectory.policy_version),
        "reward": np.float32(trajectory.reward),
    }


def num_image_tokens(example: dict[str, Any], merge_size: int) -> int:
    """Placeholders the example's images take: Σ t·h·w / merge²."""
    grid = example["image_grid_thw"]
    return int(grid.prod(axis=-1).sum()) // (merge_size * merge_size) if len(grid) else 0


def truncate(example: dict[str, Any], max_length: int, *, image_pad_id: int, merge_size: int) -> dict[str, Any]:
    """The example cut to at most `max_length` tokens; an image whose placeholder run would be cut is dropped
    with everything after it (its pixels and grid too), so placeholders and pixels keep matching.

    Raises:
        ValueError: the example's placeholder runs disagree with its grids.
    """
    ids = example["input_ids"]
    if len(ids) <= max_length:
        return example
    grid = example["image_grid_thw"]
    tokens = grid.prod(axis=-1) // (merge_size * merge_size) if len(grid) else np.zeros(0, np.int64)
    starts = _run_starts(ids, tokens, image_pad_id)
    cut, kept = max_length, len(grid)
    for i, (start, count) in enumerate(zip(starts, tokens)):
        if start + count > max_length:
            cut, kept = min(max_length, int(start)), i
            break
    patches = int(grid[:kept].prod(axis=-1).sum()) if kept else 0
    out = dict(example)
    for key in ("input_ids", "attention_mask", "loss_mask", "sampler_logp"):
        out[key] = example[key][:cut]
    out["pixel_values"] = example["pixel_values"][:patches]
    out["image_grid_thw"] = grid[:kept]
    return out


def trim_untrained_tail(example: dict[str, Any], *, image_pad_id: int, merge_size: int) -> dict[str, Any]:
    """The example cut right after its last trained token (unchanged when it trains on nothing or ends there).

    A causal model's log-probs of the trained tokens do not depend on what follows them, so the cut loses nothing
    of the loss or its gradient; it saves the learner the context after the last sampled turn (e.g. the greedy
    turns after a GRPO group's sampled turn) and the images in it.
    """
    trained = np.flatnonzero(example["loss_mask"])
    if not len(trained):
        return example
    return truncate(example, int(trained[-1]) + 1, image_pad_id=image_pad_id, merge_size=merge_size)


def _run_starts(ids: np.ndarray, tokens: np.ndarray, image_pad_id: int) -> np.ndarray:
    """First placeholder index of each image: images consume the pad tokens in order, `tokens[i]` each."""
    pads = np.flatnonzero(ids == image_pad_id)
    if len(pads) != int(tokens.sum()):
        raise ValueError(f"example holds {len(pads)} image_pad tokens ({image_pad_id}) but its grids need "
                         f"{int(tokens.sum())}")
    return pads[np.cumsum(tokens) - tokens] if len(tokens) else np.zeros(0, np.int64)
