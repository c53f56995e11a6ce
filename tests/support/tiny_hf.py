"""Tiny random transformers Qwen3-VL checkpoints and matching inputs, for parity tests against the real library.

    from support import tiny_hf
    hf_model = tiny_hf.save_checkpoint(config, tmp_path / "ckpt", seed=0)   # eager attention, float32
    batch = tiny_hf.make_batch(config, [[3, (4, 6), 5], [7]], padding_side=["right", "left"], seed=1)
    logits = tiny_hf.hf_logits(hf_model, batch)                               # numpy [B, T, V]

`config` is a `Qwen3VLConfig` (converted with its `to_hf()`) or an HF `config.json` dict. Weights are re-drawn so
every part matters: matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 1), norm weights ~ 1 + N(0, 0.2), biases ~
N(0, 0.1). In a batch, an int part is that many random text tokens and an (h, w) part is one image with a patch
grid of h x w (t = 1), expanded to vision_start + h*w/merge**2 image pads + vision_end.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from ranger_jax.models.qwen3_vl import config as config_lib


def hf_config(config: config_lib.Qwen3VLConfig | Mapping[str, Any]) -> transformers.Qwen3VLConfig:
    """An HF config with eager attention, from our config or a config.json dict."""
    fields = config.to_hf() if isinstance(config, config_lib.Qwen3VLConfig) else dict(config)
    hf = transformers.Qwen3VLConfig(**fields)
    hf._attn_implementation = "eager"
    return hf


@torch.no_grad()
def perturb_(model: torch.nn.Module, seed: int) -> None:
    """Re-draws all weights in place so that norms, biases and every projection visibly matter."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        if name.endswith("bias"):
            value = 0.1 * torch.randn(p.shape, generator=gen)
        elif p.ndim == 1:  # LayerNorm / RMSNorm weights
            value = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
        elif "embed_tokens" in name or "pos_embed" in name:
            value = torch.randn(p.shape, generator=gen)
        else:  # torch weights are [out, in, ...]: scale by fan-in
            value = torch.randn(p.shape, generator=gen) / math.sqrt(math.prod(p.shape[1:]))
        p.copy_(value.to(p.dtype))


def build_model(config: config_lib.Qwen3VLConfig | Mapping[str, Any], *, seed: int = 0,
                dtype: torch.dtype = torch.float32) -> transformers.Qwen3VLForConditionalGeneration:
    """A perturbed random `Qwen3VLForConditionalGeneration` in eval mode."""
    torch.manual_seed(seed)
    model = transformers.Qwen3VLForConditionalGeneration(hf_config(config)).eval()
    perturb_(model, seed)
    return model.to(dtype)


def save_checkpoint(config: config_lib.Qwen3VLConfig | Mapping[str, Any], path: str | os.PathLike, *,
                    seed: int = 0, dtype: torch.dtype = torch.float32,
                    max_shard_size: str | int | None = None) -> transformers.Qwen3VLForConditionalGeneration:
    """Builds, saves (`save_pretrained`, safetensors) and returns a perturbed tiny HF model.

    Args:
        config: our config or a config.json dict.
        path: the checkpoint directory to write.
        seed: weights seed.
        dtype: saved tensor dtype (torch.bfloat16 for a bf16 checkpoint); the returned model has it too.
        max_shard_size: e.g. "20KB" to force a sharded checkpoint with `model.safetensors.index.json`.
    """
    model = build_model(config, seed=seed, dtype=dtype)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(Path(path), **kwargs)
    return model


def _first_text_id(config: config_lib.Qwen3VLConfig) -> int:
    return max(config.image_token_id, config.video_token_id, config.vision_start_token_id,
               config.vision_end_token_id) + 1


def make_batch(config: config_lib.Qwen3VLConfig, sequences: Sequence[Sequence[int | tuple[int, int]]], *,
               padding_side: str | Sequence[str] = "right", seed: int = 0) -> dict[str, np.ndarray | None]:
    """A padded batch in transformers' conventions.

    Args:
        config: our config (token ids, vocabulary, vision patch sizes).
        sequences: per row, parts: an int = that many random text tokens, (h, w) = one image of h x w patches.
        padding_side: "right", "left", or one of them per row.
        seed: numpy seed for tokens and pixels.

    Returns:
        input_ids, attention_mask, mm_token_type_ids: [B, T] int64; pixel_values: [P, I] float32 and
        image_grid_thw: [num_images, 3] int64 (both None without images).
    """
    rng = np.random.default_rng(seed)
    v = config.vision_config
    sides = [padding_side] * len(sequences) if isinstance(padding_side, str) else list(padding_side)
    if len(sides) != len(sequences) or set(sides) - {"left", "right"}:
        raise ValueError(f"padding_side {padding_side!r} must be 'left'/'right' or one per row ({len(sequences)})")
    rows, grids = [], []
    low = _first_text_id(config)
    for parts in sequences:
        row: list[int] = []
        for part in parts:
            if isinstance(part, tuple):
                h, w = part
                if h % v.spatial_merge_size or w % v.spatial_merge_size:
                    raise ValueError(f"image grid {part} must be divisible by merge {v.spatial_merge_size}")
                grids.append((1, h, w))
                tokens = h * w // v.spatial_merge_size**2
                row += [config.vision_start_token_id] + [config.image_token_id] * tokens + [config.vision_end_token_id]
            else:
                row += rng.integers(low, config.text_config.vocab_size, size=part).tolist()
        rows.append(row)
    length = max(len(r) for r in rows)
    input_ids = np.zeros((len(rows), length), np.int64)
    attention_mask = np.zeros((len(rows), length), np.int64)
    for i, (row, side) in enumerate(zip(rows, sides)):
        span = slice(0, len(row)) if side == "right" else slice(length - len(row), length)
        input_ids[i, span] = row
        attention_mask[i, span] = 1
    pad_id = low  # a text token; never read
    input_ids[attention_mask == 0] = pad_id
    batch: dict[str, np.ndarray | None] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "mm_token_type_ids": (input_ids == config.image_token_id).astype(np.int64),
        "pixel_values": None,
        "image_grid_thw": None,
    }
    if grids:
        grid = np.asarray(grids, np.int64)
        batch["image_grid_thw"] = grid
        batch["pixel_values"] = rng.standard_normal((int(grid.prod(-1).sum()), v.patch_features)).astype(np.float32)
    return batch


def torch_inputs(batch: Mapping[str, np.ndarray | None]) -> dict[str, torch.Tensor]:
    """The batch as torch tensors for `model(**inputs)`; image entries only when there are images."""
    out = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items() if v is not None}
    if batch.get("pixel_values") is None:
        out.pop("mm_token_type_ids", None)
    return out


def jax_inputs(batch: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray | None]:
    """The keyword arguments of `Qwen3VL.__call__` (no mm_token_type_ids)."""
    return {k: batch[k] for k in ("attention_mask", "pixel_values", "image_grid_thw")}


@torch.no_grad()
def hf_logits(model: transformers.Qwen3VLForConditionalGeneration,
              batch: Mapping[str, np.ndarray | None]) -> np.ndarray:
    """[B, T, V] float32 logits of the transformers model on `batch`."""
    return model(**torch_inputs(batch)).logits.float().numpy()
