"""Qwen3-VL configuration: frozen dataclasses whose field names are the HF `config.json` names.

`Qwen3VLConfig.from_hf` reads a checkpoint's `config.json` (both the `rope_scaling` + `rope_theta` form written by
transformers 4.57 and the `rope_parameters` form of 5.x) and `to_hf` writes the dict `save` puts in `config.json`.
Every choice by name (activations, remat policies, attention kernels, dtypes, sharding presets) resolves through a
plain dict; an unknown name is a ValueError that names the field and lists the known names.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from ranger_jax.models.qwen3_vl import attention
from ranger_jax.parallel import rules as sharding_rules

# torch's `ACT2FN` names -> JAX functions. `gelu_pytorch_tanh` is the tanh approximation, `gelu` the exact erf form.
ACTIVATIONS = {
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}

# Rematerialisation of each decoder layer / vision block in the backward pass; None = keep every activation.
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# HF class defaults (transformers configuration_qwen3_vl.py), used only for keys a config.json leaves out.
_HF_TEXT_DEFAULTS = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 128000, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "attention_bias": False,
    "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
}
_HF_VISION_DEFAULTS = {
    "depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 4304, "num_heads": 16,
    "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 3584,
    "num_position_embeddings": 2304, "deepstack_visual_indexes": (8, 16, 24), "initializer_range": 0.02,
}
_HF_TOP_DEFAULTS = {
    "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
}
_HF_TEXT_ROPE_THETA = 500000.0  # Qwen3VLTextConfig.default_theta, when neither rope form names a theta
_HF_VISION_ROPE_THETA = 10000.0
_TEXT_ROPE_TYPES = {"default": "default", "mrope": "default"}  # transformers maps the legacy "mrope" to default


def _choice(field: str, value: str, known: Mapping[str, Any]) -> None:
    if value not in known:
        raise ValueError(f"{field}={value!r} is not supported; known values: {sorted(known)}")


def _positive(owner: str, **values: int | float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{owner}.{name} must be > 0, got {value!r}")


def interleaved_mrope_axes(mrope_section: tuple[int, int, int], half_dim: int) -> tuple[int, ...]:
    """Axis (0 = t, 1 = h, 2 = w) used by each of the `half_dim` rotary frequency slots (interleaved MRoPE).

    Mirrors `Qwen3VLTextRotaryEmbedding.recomposition_frequencies`: every slot starts as t, then slots
    `1, 4, 7, …` below `3 * mrope_section[1]` become h and slots `2, 5, 8, …` below `3 * mrope_section[2]` become w.
    """
    axes = [0] * half_dim
    for axis in (1, 2):
        for slot in range(axis, min(3 * mrope_section[axis], half_dim), 3):
            axes[slot] = axis
    return tuple(axes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TextConfig:
    """The language model (`Qwen3VLTextConfig`)."""

    vocab_size: int  # V, embedding rows (151936 in every released size; the tokenizer has 151669)
    hidden_size: int  # D
    intermediate_size: int  # F, SwiGLU width
    num_hidden_layers: int  # decoder layers
    num_attention_heads: int  # N, query heads
    num_key_value_heads: int  # K, key/value heads; N % K == 0 (GQA)
    head_dim: int  # H, independent of D / N in Qwen3
    hidden_act: str  # MLP gate activation, a key of ACTIVATIONS ("silu")
    max_position_embeddings: int  # longest position the checkpoint was trained for (kept for config.json)
    rms_norm_eps: float  # RMSNorm epsilon, 1e-6
    attention_bias: bool  # biases on q/k/v/o projections (False in Qwen3-VL)
    rope_theta: float  # MRoPE base, 5e6 in Qwen3-VL
    mrope_section: tuple[int, int, int]  # rotary slots given to (t, h, w); sums to head_dim / 2
    rope_type: str = "default"  # only plain (unscaled) rotary frequencies are implemented
    mrope_interleaved: bool = True  # Qwen3-VL's THWTHW… layout; the chunked Qwen2-VL layout is not supported
    initializer_range: float = 0.02  # std of the random normal init (tests and fresh models)
    bos_token_id: int | None = None  # kept only so config.json round-trips
    eos_token_id: int | tuple[int, ...] | None = None  # kept only so config.json round-trips
    pad_token_id: int | None = None  # kept only so config.json round-trips

    def __post_init__(self):
        _positive("text_config", vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                  intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
                  num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                  head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta)
        _choice("text_config.hidden_act", self.hidden_act, ACTIVATIONS)
        _choice("text_config.rope_type", self.rope_type, {"default": None})
        object.__setattr__(self, "mrope_section", tuple(int(s) for s in self.mrope_section))
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"text_config.num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}). Received: {self.num_attention_heads} / "
                f"{self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"text_config.head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not self.mrope_interleaved:
            raise ValueError("text_config.mrope_interleaved=False (the chunked Qwen2-VL layout) is not supported: "
                             "Qwen3-VL always interleaves t/h/w frequency slots")
        half = self.head_dim // 2
        if len(self.mrope_section) != 3 or sum(self.mrope_section) != half:
            raise ValueError(f"text_config.mrope_section={list(self.mrope_section)} must have 3 entries summing to "
                             f"head_dim / 2 = {half}")
        counts = [interleaved_mrope_axes(self.mrope_section, half).count(axis) for axis in range(3)]
        if counts != list(self.mrope_section):
            raise ValueError(f"text_config.mrope_section={list(self.mrope_section)} cannot be laid out interleaved in "
                             f"{half} slots: (t, h, w) would get {counts} slots")

    @property
    def num_key_value_groups(self) -> int:
        """G = N / K, query heads per key/value head."""
        return self.num_attention_heads // self.num_key_value_heads


@dataclasses.dataclass(frozen=True, kw_only=True)
class VisionConfig:
    """The vision tower (`Qwen3VLVisionConfig`)."""

    depth: int  # vision blocks
    hidden_size: int  # C, tower width
    intermediate_size: int  # vision MLP width
    num_heads: int  # vision attention heads; head_dim = hidden_size / num_heads, a multiple of 4 (2-D RoPE)
    hidden_act: str  # block MLP activation ("gelu_pytorch_tanh"); the mergers always use exact GELU
    in_channels: int  # 3 (RGB)
    patch_size: int  # 16 pixels
    temporal_patch_size: int  # 2 frames per patch (a still image is repeated)
    spatial_merge_size: int  # 2: a 2x2 block of patches becomes one LM token
    out_hidden_size: int  # merger output width, = text hidden_size
    num_position_embeddings: int  # learned position table rows, a perfect square (48 x 48 = 2304)
    deepstack_visual_indexes: tuple[int, ...]  # 0-based blocks tapped for DeepStack, fed after LM layers 0, 1, …
    rope_theta: float = _HF_VISION_ROPE_THETA  # base of the axial 2-D vision RoPE
    initializer_range: float = 0.02  # std of the random normal init

    def __post_init__(self):
        _positive("vision_config", depth=self.depth, hidden_size=self.hidden_size,
                  intermediate_size=self.intermediate_size, num_heads=self.num_heads, in_channels=self.in_channels,
                  patch_size=self.patch_size, temporal_patch_size=self.temporal_patch_size,
                  spatial_merge_size=self.spatial_merge_size, out_hidden_size=self.out_hidden_size,
                  num_position_embeddings=self.num_position_embeddings, rope_theta=self.rope_theta)
        _choice("vision_config.hidden_act", self.hidden_act, ACTIVATIONS)
        object.__setattr__(self, "deepstack_visual_indexes", tuple(int(i) for i in self.deepstack_visual_indexes))
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4:
            raise ValueError(
                f"vision_config.hidden_size ({self.hidden_size}) / num_heads ({self.num_heads}) must be an integer "
                "head_dim divisible by 4 (2-D rotary embedding over rows and columns)")
        side = math.isqrt(self.num_position_embeddings)
        if side * side != self.num_position_embeddings:
            raise ValueError(f"vision_config.num_position_embeddings={self.num_position_embeddings} must be a "
                             "perfect square (the learned position grid is side x side)")
        bad = [i for i in self.deepstack_visual_indexes if not 0 <= i < self.depth]
        if bad or len(set(self.deepstack_visual_indexes)) != len(self.deepstack_visual_indexes):
            raise ValueError(f"vision_config.deepstack_visual_indexes={list(self.deepstack_visual_indexes)} must be "
                             f"distinct block ids in [0, depth={self.depth})")

    @property
    def head_dim(self) -> int:
        """Width of one vision attention head (hidden_size / num_heads)."""
        return self.hidden_size // self.num_heads

    @property
    def patch_features(self) -> int:
        """I, features of one flattened pixel patch (rows of `pixel_values`): 3 * 2 * 16 * 16 = 1536."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merged_size(self) -> int:
        """Width of a merger input: spatial_merge_size**2 patch rows concatenated."""
        return self.hidden_size * self.spatial_merge_size**2


@dataclasses.dataclass(frozen=True, kw_only=True)
class Qwen3VLConfig:
    """Qwen3-VL (`Qwen3VLConfig`) plus the runtime choices of this port."""

    text_config: TextConfig
    vision_config: VisionConfig
    image_token_id: int  # <|image_pad|>, 151655
    video_token_id: int  # <|video_pad|>, 151656 (kept for config.json; video input is not implemented)
    vision_start_token_id: int  # <|vision_start|>, 151652
    vision_end_token_id: int  # <|vision_end|>, 151653
    tie_word_embeddings: bool  # logits use embed_tokens (2B, 4B) instead of a separate lm_head (8B)
    dtype: str = "float32"  # compute dtype, a key of DTYPES; norms, softmax and logits always run in float32
    param_dtype: str = "float32"  # storage dtype of parameters, a key of DTYPES
    remat: str = "none"  # a key of REMAT_POLICIES, applied per decoder layer and vision block
    attention: str = "blocked"  # a key of attention.KERNELS for the text decoder ("blocked": fastest, any mask)
    sharding_rules: str = "train"  # a key of parallel.rules.PRESETS: logical axis -> mesh axes

    def __post_init__(self):
        if isinstance(self.text_config, Mapping) or isinstance(self.vision_config, Mapping):
            raise TypeError("Qwen3VLConfig takes TextConfig / VisionConfig objects; use Qwen3VLConfig.from_hf(dict) "
                            "for a config.json dict")
        _choice("dtype", self.dtype, DTYPES)
        _choice("param_dtype", self.param_dtype, DTYPES)
        _choice("remat", self.remat, REMAT_POLICIES)
        _choice("attention", self.attention, attention.KERNELS)
        _choice("sharding_rules", self.sharding_rules, sharding_rules.PRESETS)
        if self.vision_config.out_hidden_size != self.text_config.hidden_size:
            raise ValueError(f"vision_config.out_hidden_size ({self.vision_config.out_hidden_size}) must equal "
                             f"text_config.hidden_size ({self.text_config.hidden_size})")
        if len(self.vision_config.deepstack_visual_indexes) > self.text_config.num_hidden_layers:
            raise ValueError(
                f"{len(self.vision_config.deepstack_visual_indexes)} DeepStack taps need as many decoder layers, got "
                f"text_config.num_hidden_layers={self.text_config.num_hidden_layers}")
        ids = {"image_token_id": self.image_token_id, "video_token_id": self.video_token_id,
               "vision_start_token_id": self.vision_start_token_id, "vision_end_token_id": self.vision_end_token_id}
        for name, value in ids.items():
            if not 0 <= value < self.text_config.vocab_size:
                raise ValueError(f"{name}={value} is outside the vocabulary [0, {self.text_config.vocab_size})")
        if len(set(ids.values())) != len(ids):
            raise ValueError(f"special token ids must be distinct, got {ids}")

    @property
    def compute_dtype(self) -> jnp.dtype:
        """The jnp dtype of activations and matmuls (`dtype`)."""
        return DTYPES[self.dtype]

    @property
    def parameter_dtype(self) -> jnp.dtype:
        """The jnp dtype parameters are stored in (`param_dtype`)."""
        return DTYPES[self.param_dtype]

    # ----- presets ---------------------------------------------------------------------------------------------

    @classmethod
    def qwen3_vl_8b(cls, **runtime: Any) -> Qwen3VLConfig:
        """Qwen/Qwen3-VL-8B-Instruct shapes (its `config.json`; about 8.77 B parameters)."""
        return cls._released(hidden=4096, intermediate=12288, layers=36, heads=32, tied=False, vision_depth=27,
                             vision_hidden=1152, vision_intermediate=4304, taps=(8, 16, 24), **runtime)

    @classmethod
    def qwen3_vl_4b(cls, **runtime: Any) -> Qwen3VLConfig:
        """Qwen/Qwen3-VL-4B-Instruct shapes (tied embeddings)."""
        return cls._released(hidden=2560, intermediate=9728, layers=36, heads=32, tied=True, vision_depth=24,
                             vision_hidden=1024, vision_intermediate=4096, taps=(5, 11, 17), **runtime)

    @classmethod
    def qwen3_vl_2b(cls, **runtime: Any) -> Qwen3VLConfig:
        """Qwen/Qwen3-VL-2B-Instruct shapes (tied embeddings)."""
        return cls._released(hidden=2048, intermediate=6144, layers=28, heads=16, tied=True, vision_depth=24,
                             vision_hidden=1024, vision_intermediate=4096, taps=(5, 11, 17), **runtime)

    @classmethod
    def _released(cls, *, hidden, intermediate, layers, heads, tied, vision_depth, vision_hidden,
                  vision_intermediate, taps, **runtime) -> Qwen3VLConfig:
        text = TextConfig(
            vocab_size=151936, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=8, head_dim=128, hidden_act="silu",
            max_position_embeddings=262144, rms_norm_eps=1e-6, attention_bias=False, rope_theta=5_000_000.0,
            mrope_section=(24, 20, 20), bos_token_id=151643, eos_token_id=151645)
        vision = VisionConfig(
            depth=vision_depth, hidden_size=vision_hidden, intermediate_size=vision_intermediate, num_heads=16,
            hidden_act="gelu_pytorch_tanh", in_channels=3, patch_size=16, temporal_patch_size=2,
            spatial_merge_size=2, out_hidden_size=hidden, num_position_embeddings=2304, deepstack_visual_indexes=taps)
        return cls(text_config=text, vision_config=vision, **_HF_TOP_DEFAULTS, tie_word_embeddings=tied, **runtime)

    @classmethod
    def tiny(cls, **runtime: Any) -> Qwen3VLConfig:
        """A seconds-on-2-cores model: hidden 32, 2 layers, 4 heads / 2 kv heads, head_dim 8, vision depth 2."""
        text = TextConfig(
            vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, hidden_act="silu", max_position_embeddings=2048, rms_norm_eps=1e-6,
            attention_bias=False, rope_theta=5_000_000.0, mrope_section=(2, 1, 1))
        vision = VisionConfig(
            depth=2, hidden_size=16, intermediate_size=32, num_heads=2, hidden_act="gelu_pytorch_tanh",
            in_channels=3, patch_size=16, temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=32,
            num_position_embeddings=16, deepstack_visual_indexes=(0, 1))
        return cls(text_config=text, vision_config=vision, image_token_id=5, video_token_id=6,
                   vision_start_token_id=3, vision_end_token_id=4, tie_word_embeddings=False, **runtime)

    # ----- HF config.json --------------------------------------------------------------------------------------

    @classmethod
    def from_hf(cls, path_or_dict: str | os.PathLike | Mapping[str, Any], **runtime: Any) -> Qwen3VLConfig:
        """Reads an HF `config.json` (a file, a checkpoint directory, or the parsed dict).

        Args:
            path_or_dict: `config.json`, the directory holding it, or its parsed contents.
            **runtime: this port's settings (`dtype`, `param_dtype`, `remat`, `attention`, `sharding_rules`).

        Raises:
            ValueError: a `model_type` other than qwen3_vl, an unsupported rope type or activation, or a field
                value that breaks a relation checked by the dataclasses.
        """
        if isinstance(path_or_dict, Mapping):
            hf = dict(path_or_dict)
        else:
            path = Path(path_or_dict)
            if path.is_dir():
                path = path / "config.json"
            hf = json.loads(path.read_text("utf-8"))
        model_type = hf.get("model_type", "qwen3_vl")
        if model_type != "qwen3_vl":
            raise ValueError(f"model_type={model_type!r} is not supported; expected 'qwen3_vl'")
        text_hf = dict(hf.get("text_config") or {})
        vision_hf = dict(hf.get("vision_config") or {})

        text = {k: text_hf.get(k, default) for k, default in _HF_TEXT_DEFAULTS.items()}
        if text["num_key_value_heads"] is None:
            text["num_key_value_heads"] = text["num_attention_heads"]
        if text["eos_token_id"] is None and hf.get("eos_token_id") is not None:
            text["eos_token_id"] = hf["eos_token_id"]
        text.update(_text_rope(text_hf))

        vision = {k: vision_hf.get(k, default) for k, default in _HF_VISION_DEFAULTS.items()}
        for key in ("patch_size", "temporal_patch_size"):
            if not isinstance(vision[key], int):
                raise ValueError(f"vision_config.{key}={vision[key]!r} is not supported; expected one int")
        vision_rope = vision_hf.get("rope_parameters") or {}
        rope_type = vision_rope.get("rope_type", "axial")
        _choice("vision_config.rope_parameters.rope_type", rope_type, {"axial": None})
        vision["rope_theta"] = float(vision_rope.get("rope_theta", _HF_VISION_ROPE_THETA))

        top = {k: hf.get(k, default) for k, default in _HF_TOP_DEFAULTS.items()}
        tie = hf.get("tie_word_embeddings", text_hf.get("tie_word_embeddings", False))
        return cls(text_config=TextConfig(**text), vision_config=VisionConfig(**vision), **top,
                   tie_word_embeddings=bool(tie), **runtime)

    def to_hf(self) -> dict[str, Any]:
        """The `config.json` dict (transformers 5.x form, `rope_parameters`) that `save` writes."""
        t, v = self.text_config, self.vision_config
        text = {
            "model_type": "qwen3_vl_text",
            **{k: getattr(t, k) for k in _HF_TEXT_DEFAULTS},
            "rope_parameters": {"rope_type": t.rope_type, "rope_theta": t.rope_theta,
                                "mrope_section": list(t.mrope_section), "mrope_interleaved": t.mrope_interleaved},
            "attention_dropout": 0.0,
            "use_cache": True,
            "dtype": self.param_dtype,
        }
        if isinstance(t.eos_token_id, tuple):
            text["eos_token_id"] = list(t.eos_token_id)
        vision = {
            "model_type": "qwen3_vl_vision",
            **{k: getattr(v, k) for k in _HF_VISION_DEFAULTS},
            "deepstack_visual_indexes": list(v.deepstack_visual_indexes),
            "rope_parameters": {"rope_type": "axial", "rope_theta": v.rope_theta},
            "dtype": self.param_dtype,
        }
        return {
            "architectures": ["Qwen3VLForConditionalGeneration"],
            "model_type": "qwen3_vl",
            "dtype": self.param_dtype,
            "image_token_id": self.image_token_id,
            "video_token_id": self.video_token_id,
            "vision_start_token_id": self.vision_start_token_id,
            "vision_end_token_id": self.vision_end_token_id,
            "tie_word_embeddings": self.tie_word_embeddings,
            "text_config": text,
            "vision_config": vision,
        }


def _text_rope(text_hf: Mapping[str, Any]) -> dict[str, Any]:
    """Text rope fields from either form: `rope_parameters` (5.x) or `rope_scaling` + `rope_theta` (4.57)."""
    if text_hf.get("rope_parameters"):
        params = dict(text_hf["rope_parameters"])
        theta = params.get("rope_theta", text_hf.get("rope_theta", _HF_TEXT_ROPE_THETA))
    else:
        params = dict(text_hf.get("rope_scaling") or {})
        theta = text_hf.get("rope_theta", params.get("rope_theta", _HF_TEXT_ROPE_THETA))
    rope_type = params.get("rope_type", params.get("type", "default"))
    _choice("text_config rope_type", rope_type, _TEXT_ROPE_TYPES)
    unsupported = sorted(set(params) - {"rope_type", "type", "rope_theta", "mrope_section", "mrope_interleaved"})
    if unsupported:
        raise ValueError(f"text_config rope parameters {unsupported} are not supported (got {params})")
    return {
        "rope_type": _TEXT_ROPE_TYPES[rope_type],
        "rope_theta": float(theta),
        "mrope_section": tuple(params.get("mrope_section", (24, 20, 20))),
        "mrope_interleaved": bool(params.get("mrope_interleaved", True)),
    }
