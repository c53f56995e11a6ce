"""Learner batches: rows right-padded to a bucket length, a fixed row count, images padded to static sizes.

`collate(examples, spec)` turns up to B examples (`data.examples`) into one batch of static shape:

    input_ids       [B, T] int32    pads are the tokenizer's pad id
    attention_mask  [B, T] int32    1 on real tokens (and on image-padding placeholders, below), 0 on padding
    loss_mask       [B, T] float32  token-aligned: 1 where token t is trained (predicted from tokens < t)
    sampler_logp    [B, T] float32  0 where loss_mask is 0
    row_valid       [B] float32     0 for padding rows added to fill the batch
    policy_version  [B] int32       -1 for SFT rows and padding rows
    advantages      [B] float32     when the examples carry `advantage` (GRPO)
    token_advantages [B, T] float32 when they also carry `token_advantage` (token-aligned, 0 on padding)
    pixel_values    [P, I] float32, image_grid_thw [N, 3] int32   when `spec.image_pad_id` is set

T is the smallest of `spec.length_buckets` that holds every row (and the image padding, below).

Image padding. `Qwen3VL.check_inputs` demands that the grids own exactly the P patch rows and that every grid's
t·h·w/m² placeholders (m = merge size) sit, contiguous, at attended positions — so padding patches need
placeholder tokens too. The batch therefore always carries k ≥ 1 padding images after its n real ones:

    N = n + 1      rounded up to a multiple of `image_step`; k = N − n ≥ 1 padding images
    P = P_real + m²·k  rounded up to a multiple of `patch_step`; the padding takes Q = (P − P_real)/m² ≥ k tokens
    grids: (1, m, m·(Q − k + 1)) then k − 1 fillers (1, m, m); pixel rows zero

Their Q `<|image_pad|>` tokens are written right after the last real token of the shortest row (a padding row
when there is one), with attention_mask 1, loss_mask 0 and sampler_logp 0, and the padding images are listed in
`image_grid_thw` at that point of the batch's token order (images are consumed row-major). Attention is causal
and the vision tower attends within each image only, so no real token, feature or loss sees the padding; the
placeholders only cost compute. Q < patch_step/m² + image_step tokens (`BatchSpec.image_headroom`), so a batch
fits its largest length bucket whenever every row is at most `BatchSpec.max_row_length` long. (The sampler's
`sampling.buckets.pad_images` adds grids that own no placeholders, which its own compiled calls allow but
`check_inputs`, and so the learner's batch check, rejects.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ranger_jax.processing.tokenizer import Tokenizer
from ranger_jax.rollout import sequence

DEFAULT_SUFFIX_BUCKETS = (32, 64, 128, 256, 512, 1024)


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchSpec:
    """Static shapes of the learner's batches (see the module docstring)."""

    batch_size: int  # B: rows per batch on this host; short batches get padding rows (row_valid 0)
    length_buckets: tuple[int, ...]  # allowed T, ascending; the largest bounds every row
    pad_id: int  # the tokenizer's pad id, for padding tokens
    image_pad_id: int | None = None  # the tokenizer's <|image_pad|> id; None = text-only batches, no pixel keys
    merge_size: int = 2  # vision_config.spatial_merge_size (m)
    patch_features: int = 1536  # I = 3 · temporal_patch_size · patch_size²
    patch_step: int = 1024  # P rounds up to a multiple of this (a multiple of m²)
    image_step: int = 8  # N rounds up to a multiple of this
    # shared-prefix batches (`data.shared_prefix`): G prefix rows per batch (0 = plain rows) and the suffix rows'
    # length buckets
    prefix_rows: int = 0
    suffix_buckets: tuple[int, ...] = DEFAULT_SUFFIX_BUCKETS
    # smaller shared-prefix batches for fewer units: a batch of u units takes the smallest of these prefix-row counts
    # b >= u (with batch_size·b/prefix_rows suffix rows, when its rows fit them), else `prefix_rows`. A learner that
    # leaves zero-advantage batches out then runs a round's few leftover groups in a small batch, not a full one,
    # each size compiled once. () = every batch has `prefix_rows`. One learner process only (`trajectory_dataset`
    # refuses several): hosts batching their own shares could pick different sizes for one step's program
    prefix_row_buckets: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "length_buckets", tuple(int(b) for b in self.length_buckets))
        object.__setattr__(self, "suffix_buckets", tuple(int(b) for b in self.suffix_buckets))
        suffix = self.suffix_buckets
        if not suffix or any(b < 2 for b in suffix) or list(suffix) != sorted(set(suffix)):
            raise ValueError(f"suffix_buckets must be >= 2 and strictly ascending, got {list(suffix)}")
        if self.prefix_rows < 0:
            raise ValueError(f"BatchSpec.prefix_rows must be >= 0, got {self.prefix_rows}")
        object.__setattr__(self, "prefix_row_buckets", tuple(int(b) for b in self.prefix_row_buckets))
        row_buckets = self.prefix_row_buckets
        if row_buckets:
            if not self.prefix_rows:
                raise ValueError("BatchSpec.prefix_row_buckets needs prefix_rows >= 1 (shared-prefix batches)")
            if any(b < 1 for b in row_buckets) or list(row_buckets) != sorted(set(row_buckets)) \
                    or row_buckets[-1] >= self.prefix_rows:
                raise ValueError(f"BatchSpec.prefix_row_buckets must be >= 1, strictly ascending and below "
                                 f"prefix_rows {self.prefix_rows}, got {list(row_buckets)}")
            uneven = [b for b in row_buckets if self.batch_size * b % self.prefix_rows]
            if uneven:
                raise ValueError(f"BatchSpec.prefix_row_buckets {uneven}: batch_size {self.batch_size} x bucket must "
                                 f"be a multiple of prefix_rows {self.prefix_rows} (the suffix rows scale with it)")
        buckets = self.length_buckets
        if not buckets or any(b < 1 for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise ValueError(f"length_buckets must be positive and strictly ascending, got {list(buckets)}")
        for name in ("batch_size", "merge_size", "patch_features", "patch_step", "image_step"):
            if getattr(self, name) < 1:
                raise ValueError(f"BatchSpec.{name} must be >= 1, got {getattr(self, name)}")
        if self.patch_step % (self.merge_size * self.merge_size):
            raise ValueError(f"BatchSpec.patch_step={self.patch_step} must be a multiple of merge_size² "
                             f"({self.merge_size * self.merge_size})")
        if self.max_row_length < 1:
            raise ValueError(f"the largest length bucket ({buckets[-1]}) leaves no room for rows after the image "
                             f"padding headroom ({self.image_headroom} tokens); add a larger bucket or lower "
                             "patch_step / image_step")

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer, *, batch_size: int, length_buckets: Sequence[int],
                      vision: sequence.VisionSettings | None = sequence.VisionSettings(), patch_step: int = 1024,
                      image_step: int = 8) -> BatchSpec:
        """A spec whose pad and image-pad ids come from `tokenizer` (`vision=None`: text-only batches)."""
        if vision is None:
            return cls(batch_size=batch_size, length_buckets=tuple(length_buckets), pad_id=tokenizer.pad_id)
        return cls(batch_size=batch_size, length_buckets=tuple(length_buckets), pad_id=tokenizer.pad_id,
                   image_pad_id=tokenizer.image_pad_id, merge_size=vision.merge_size,
                   patch_features=3 * vision.temporal_patch_size * vision.patch_size ** 2, patch_step=patch_step,
                   image_step=image_step)

    @property
    def image_headroom(self) -> int:
        """Most placeholder tokens the image padding can take (0 for text-only batches)."""
        if self.image_pad_id is None:
            return 0
        return self.patch_step // (self.merge_size * self.merge_size) + self.image_step

    @property
    def max_row_length(self) -> int:
        """Longest row a batch always has room for: the largest bucket less the image headroom."""
        return self.length_buckets[-1] - self.image_headroom

    def length_bucket(self, n: int) -> int:
        """The smallest bucket >= n.

        Raises:
            ValueError: n is above the largest bucket.
        """
        for bucket in self.length_buckets:
            if bucket >= n:
                return bucket
        raise ValueError(f"{n} tokens exceed the largest length bucket {self.length_buckets[-1]}")


def _check_example(example: dict[str, Any], row: int, spec: BatchSpec) -> None:
    ids = example["input_ids"]
    for key in ("attention_mask", "loss_mask", "sampler_logp"):
        if example[key].shape != ids.shape:
            raise ValueError(f"row {row}: {key} shape {example[key].shape} != input_ids shape {ids.shape}")
    grid = example["image_grid_thw"]
    if spec.image_pad_id is None:
        if len(grid):
            raise ValueError(f"row {row} has {len(grid)} images but the batch spec is text-only (image_pad_id=None)")
        return
    m2 = spec.merge_size * spec.merge_size
    patches = int(grid.prod(axis=-1).sum()) if len(grid) else 0
    if example["pixel_values"].shape != (patches, spec.patch_features):
        raise ValueError(f"row {row}: pixel_values shape {example['pixel_values'].shape} != (patches of "
                         f"image_grid_thw {patches}, {spec.patch_features})")
    placeholders = int(np.sum(ids == spec.image_pad_id))
    if placeholders != patches // m2:
        raise ValueError(f"row {row}: {placeholders} image_pad tokens ({spec.image_pad_id}) != merged patches "
                         f"{patches // m2} of image_grid_thw={grid.tolist()}")


def image_padding(num_images: int, num_patches: int, spec: BatchSpec) -> np.ndarray:
    """Grids of the padding images for a batch with `num_images` real images of `num_patches` patch rows.

    Returns:
        [k, 3] int32 grids, k >= 1: one (1, m, m·(Q − k + 1)) image then k − 1 fillers (1, m, m).
    """
    m = spec.merge_size
    total_images = _round_up(num_images + 1, spec.image_step)
    k = total_images - num_images
    total_patches = _round_up(num_patches + m * m * k, spec.patch_step)
    q = (total_patches - num_patches) // (m * m)
    grids = np.tile(np.array([[1, m, m]], np.int32), (k, 1))
    grids[0, 2] = m * (q - k + 1)
    return grids


def collate(examples: Sequence[dict[str, Any]], spec: BatchSpec) -> dict[str, np.ndarray]:
    """One batch of `spec.batch_size` rows from 1..B examples (see the module docstring for keys and padding).

    Raises:
        ValueError: no examples or more than B, a row longer than `spec.max_row_length`, an `advantage` on some
            rows only, or an example whose arrays, pixels and placeholders disagree (naming the row).
    """
    batch, count = spec.batch_size, len(examples)
    if not 1 <= count <= batch:
        raise ValueError(f"collate takes 1..{batch} examples, got {count}")
    for row, example in enumerate(examples):
        _check_example(example, row, spec)
        if len(example["input_ids"]) > spec.max_row_length:
            raise ValueError(f"row {row} has {len(example['input_ids'])} tokens, above max_row_length "
                             f"{spec.max_row_length} (largest bucket {spec.length_buckets[-1]} less image headroom "
                             f"{spec.image_headroom}); filter or truncate rows first")
    grpo = "advantage" in examples[0]
    for row, example in enumerate(examples):
        if ("advantage" in example) != grpo:
            raise ValueError(f"row {row} {'lacks' if grpo else 'carries'} an advantage but row 0 "
                             f"{'carries' if grpo else 'lacks'} one")
    per_token = "token_advantage" in examples[0]
    for row, example in enumerate(examples):
        if ("token_advantage" in example) != per_token:
            raise ValueError(f"row {row} {'lacks' if per_token else 'carries'} a token_advantage but row 0 "
                             f"{'carries' if per_token else 'lacks'} one")
        if per_token and not grpo:
            raise ValueError(f"row {row} carries a token_advantage without an advantage")
        if per_token and len(example["token_advantage"]) != len(example["input_ids"]):
            raise ValueError(f"row {row}: token_advantage has {len(example['token_advantage'])} values for "
                             f"{len(example['input_ids'])} tokens")
    lengths = [len(e["input_ids"]) for e in examples] + [0] * (batch - count)

    padding_grids = np.zeros((0, 3), np.int32)
    host, needed = 0, max(lengths)
    if spec.image_pad_id is not None:
        real_grids = [e["image_grid_thw"] for e in examples]
        num_images = sum(len(g) for g in real_grids)
        num_patches = sum(int(g.prod(axis=-1).sum()) for g in real_grids if len(g))
        padding_grids = image_padding(num_images, num_patches, spec)
        host = len(lengths) - 1 - int(np.argmin(lengths[::-1]))  # the shortest row, the last one on ties
        needed = max(needed, lengths[host] + int(padding_grids.prod(axis=-1).sum()) // spec.merge_size ** 2)
    length = spec.length_bucket(needed)

    out = {
        "input_ids": np.full((batch, length), spec.pad_id, np.int32),
        "attention_mask": np.zeros((batch, length), np.int32),
        "loss_mask": np.zeros((batch, length), np.float32),
        "sampler_logp": np.zeros((batch, length), np.float32),
        "row_valid": np.zeros(batch, np.float32),
        "policy_version": np.full(batch, -1, np.int32),
    }
    if grpo:
        out["advantages"] = np.zeros(batch, np.float32)
    if per_token:
        out["token_advantages"] = np.zeros((batch, length), np.float32)
    for row, example in enumerate(examples):
        n = lengths[row]
        for key in ("input_ids", "attention_mask", "loss_mask", "sampler_logp"):
            out[key][row, :n] = example[key]
        out["row_valid"][row] = 1.0
        out["policy_version"][row] = example["policy_version"]
        if grpo:
            out["advantages"][row] = example["advantage"]
        if per_token:
            out["token_advantages"][row, :n] = example["token_advantage"]
    if spec.image_pad_id is None:
        return out

    pixels, grids = [], []
    for row in range(batch):
        if row < count and len(examples[row]["image_grid_thw"]):
            pixels.append(examples[row]["pixel_values"].astype(np.float32, copy=False))
            grids.append(examples[row]["image_grid_thw"].astype(np.int32))
        if row == host:  # the padding images come after this row's last token, so here in token order
            num_tokens = int(padding_grids.prod(axis=-1).sum()) // spec.merge_size ** 2
            start = lengths[row]
            out["input_ids"][row, start:start + num_tokens] = spec.image_pad_id
            out["attention_mask"][row, start:start + num_tokens] = 1
            pixels.append(np.zeros((int(padding_grids.prod(axis=-1).sum()), spec.patch_features), np.float32))
            grids.append(padding_grids)
    out["pixel_values"] = np.concatenate(pixels)
    out["image_grid_thw"] = np.concatenate(grids)
    return out
