"""HF safetensors checkpoints <-> `Qwen3VL` parameters, tensor by tensor.

Parameter paths are the HF keys (module attributes carry the torch names), so the one table below, `LAYOUTS`,
records only layout changes: torch Linear weights `[out, in]` are stored transposed as `[*in, *out]` (q_proj as
`[D, N, H]`, o_proj as `[N, H, D]`), the patch Conv3d as a `[I, C]` matmul, and per-head biases as `[N, H]`.

`load` reads a checkpoint directory (one `model.safetensors`, or shards listed in `model.safetensors.index.json`)
through memory maps: the abstract model comes from `nnx.eval_shape`, and each tensor is read, re-laid out, cast and
placed straight into its NamedSharding (each device receives only its own slice), so the whole model never sits on
one host. `save` writes `config.json` and safetensors that transformers' `from_pretrained` loads, sharded with an
index above `max_shard_bytes`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from safetensors.numpy import save_file

from ranger_jax import fileio
from ranger_jax.models.qwen3_vl import config as config_lib
from ranger_jax.models.qwen3_vl import model as model_lib
from ranger_jax.parallel import placement

log = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30  # transformers' default shard size for save_pretrained
_SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")

_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: missing, unexpected or mis-shaped keys, or unreadable files."""


class Layout(NamedTuple):
    """How our parameter relates to the HF tensor of the same name."""

    kind: str  # "same" | "flat" (HF 1-D of our [N, H]) | "linear" (HF [out, in] of our [*in, *out]) | "conv"
    in_dims: int = 1  # for "linear": how many leading dims of ours are torch's `in`


SAME, FLAT = Layout("same"), Layout("flat")
LINEAR, LINEAR_IN2, CONV = Layout("linear"), Layout("linear", in_dims=2), Layout("conv")

# HF key suffix -> layout; the longest matching suffix wins.
LAYOUTS: Mapping[str, Layout] = {
    "patch_embed.proj.weight": CONV,
    "patch_embed.proj.bias": SAME,
    "pos_embed.weight": SAME,
    "norm1.weight": SAME, "norm1.bias": SAME, "norm2.weight": SAME, "norm2.bias": SAME,
    "attn.qkv.weight": LINEAR, "attn.qkv.bias": FLAT,
    "attn.proj.weight": LINEAR_IN2, "attn.proj.bias": SAME,
    "linear_fc1.weight": LINEAR, "linear_fc1.bias": SAME, "linear_fc2.weight": LINEAR, "linear_fc2.bias": SAME,
    "norm.weight": SAME, "norm.bias": SAME,  # mergers' LayerNorm and the LM's final RMSNorm
    "embed_tokens.weight": SAME,
    "q_proj.weight": LINEAR, "k_proj.weight": LINEAR, "v_proj.weight": LINEAR, "o_proj.weight": LINEAR_IN2,
    "q_proj.bias": FLAT, "k_proj.bias": FLAT, "v_proj.bias": FLAT, "o_proj.bias": SAME,
    "q_norm.weight": SAME, "k_norm.weight": SAME,
    "gate_proj.weight": LINEAR, "up_proj.weight": LINEAR, "down_proj.weight": LINEAR,
    "input_layernorm.weight": SAME, "post_attention_layernorm.weight": SAME,
    "lm_head.weight": LINEAR,
}


def layout_of(key: str) -> Layout:
    """The layout of an HF key: the entry of its longest suffix in `LAYOUTS`."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        layout = LAYOUTS.get(".".join(parts[-n:]))
        if layout is not None:
            return layout
    raise CheckpointError(f"parameter {key} has no entry in checkpoint.LAYOUTS")


def hf_shape(layout: Layout, shape: tuple[int, ...], config: config_lib.Qwen3VLConfig) -> tuple[int, ...]:
    """The HF tensor shape of a parameter of ours with `shape`."""
    if layout.kind == "same":
        return shape
    if layout.kind == "flat":
        return (math.prod(shape),)
    if layout.kind == "conv":
        v = config.vision_config
        return (shape[1], v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    return (math.prod(shape[layout.in_dims:]), math.prod(shape[:layout.in_dims]))


def to_ours(layout: Layout, tensor: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """An HF tensor in our layout, reshaped to `shape`."""
    if layout.kind in ("same", "flat"):
        return tensor.reshape(shape)
    return np.ascontiguousarray(tensor.reshape(tensor.shape[0], -1).T).reshape(shape)


def to_hf(layout: Layout, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Our array in the HF layout, reshaped to the HF `shape`."""
    if layout.kind in ("same", "flat"):
        return array.reshape(shape)
    in_dims = layout.in_dims if layout.kind == "linear" else 1
    return np.ascontiguousarray(array.reshape(math.prod(array.shape[:in_dims]), -1).T).reshape(shape)


# ----- reading ---------------------------------------------------------------------------------------------------


class SafetensorsFile:
    """Memory-mapped tensors of one .safetensors file (any dtype, bf16 included, via ml_dtypes)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            with open(path, "rb") as f:
                (header_len,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(header_len))
        except (OSError, struct.error, ValueError) as err:
            raise CheckpointError(f"cannot read safetensors header of {path}: {err}") from err
        header.pop("__metadata__", None)
        self.entries: dict[str, dict[str, Any]] = header
        self.data_start = 8 + header_len

    def shape(self, key: str) -> tuple[int, ...]:
        """The shape of tensor `key`, read from the header."""
        return tuple(self.entries[key]["shape"])

    def get(self, key: str) -> np.ndarray:
        """Tensor `key` as a read-only memory map of the file (nothing is copied)."""
        entry = self.entries[key]
        if entry["dtype"] not in _SAFETENSORS_DTYPES:
            raise CheckpointError(f"{self.path}: key {key} has unsupported dtype {entry['dtype']}")
        dtype = np.dtype(_SAFETENSORS_DTYPES[entry["dtype"]])
        begin, end = entry["data_offsets"]
        count = (end - begin) // dtype.itemsize
        data = np.memmap(self.path, dtype=dtype, mode="r", offset=self.data_start + begin, shape=(count,))
        return data.reshape(entry["shape"])


def checkpoint_files(path: Path) -> dict[str, SafetensorsFile]:
    """HF key -> the file holding it, for a single-file or index-sharded checkpoint directory."""
    if (path / INDEX_FILE).exists():
        weight_map = json.loads((path / INDEX_FILE).read_text("utf-8"))["weight_map"]
        files = {name: SafetensorsFile(path / name) for name in sorted(set(weight_map.values()))}
        for key, name in weight_map.items():
            if key not in files[name].entries:
                raise CheckpointError(f"{INDEX_FILE} maps key {key} to {name}, which does not hold it")
        return {key: files[name] for key, name in weight_map.items()}
    if (path / SINGLE_FILE).exists():
        single = SafetensorsFile(path / SINGLE_FILE)
        return {key: single for key in single.entries}
    raise CheckpointError(f"{path} holds neither {SINGLE_FILE} nor {INDEX_FILE}")


def load(path: str | os.PathLike, *, dtype: Any = jnp.float32, mesh: jax.sharding.Mesh | None = None,
         param_dtype: Any = None, remat: str = "none", attention: str = "blocked",
         sharding_rules: str = "train") -> model_lib.Qwen3VL:
    """Loads an HF Qwen3-VL checkpoint directory, each tensor straight into its sharding.

    Args:
        path: directory with `config.json` and `model.safetensors` or `model.safetensors.index.json` + shards.
        dtype: compute dtype (float32 or bfloat16); also the parameter dtype unless `param_dtype` is given.
        mesh: a ("data", "fsdp", "tensor") mesh (`parallel.mesh.make_mesh`); None = the default device.
        param_dtype: storage dtype of the parameters.
        remat, attention, sharding_rules: the `Qwen3VLConfig` runtime fields.

    Raises:
        CheckpointError: a missing, unexpected or mis-shaped key (naming the key and both shapes).
        ValueError: an unsupported config value, or parameters that do not fit the mesh.
    """
    path = Path(path)
    config = config_lib.Qwen3VLConfig.from_hf(
        path, dtype=jnp.dtype(dtype).name, param_dtype=jnp.dtype(param_dtype or dtype).name, remat=remat,
        attention=attention, sharding_rules=sharding_rules)
    files = checkpoint_files(path)
    abstract = nnx.eval_shape(lambda: model_lib.Qwen3VL(config, rngs=nnx.Rngs(0)))
    state = nnx.state(abstract)
    variables = jax.tree_util.tree_flatten_with_path(state, is_leaf=placement.is_variable)[0]
    expected = {placement.path_key(p): hf_shape(layout_of(placement.path_key(p)), tuple(v.shape), config)
                for p, v in variables}
    missing = sorted(set(expected) - set(files))
    if missing:
        shown = ", ".join(f"{k} (expected shape {expected[k]})" for k in missing[:5])
        raise CheckpointError(f"{path}: {len(missing)} keys missing from the checkpoint: {shown}")
    ignored = {"lm_head.weight"} if config.tie_word_embeddings else set()  # a redundant copy of a tied head
    unexpected = sorted(set(files) - set(expected) - ignored)
    if unexpected:
        shown = ", ".join(f"{k} (shape {files[k].shape(k)})" for k in unexpected[:5])
        raise CheckpointError(f"{path}: {len(unexpected)} unexpected keys in the checkpoint: {shown}")
    for key, shape in expected.items():
        if files[key].shape(key) != shape:
            raise CheckpointError(f"{path}: key {key} has shape {files[key].shape(key)} in the checkpoint, the model "
                                  f"expects {shape}")

    def read(key: str, variable: nnx.Variable) -> np.ndarray:
        log.debug("loading %s %s", key, tuple(variable.shape))
        return to_ours(layout_of(key), files[key].get(key), tuple(variable.shape)).astype(variable.dtype)

    return placement.materialize(abstract, read, mesh=mesh, rules=config.sharding_rules)


# ----- writing ---------------------------------------------------------------------------------------------------


def _host_array(value: jax.Array) -> np.ndarray:
    if not value.is_fully_addressable:
        value = multihost_utils.process_allgather(value, tiled=True)
    return np.asarray(jax.device_get(value))


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"format": "pt"})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save(model: model_lib.Qwen3VL, path: str | os.PathLike, *,
         max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> None:
    """Writes `config.json` and safetensors in the HF layout (transformers' `from_pretrained` loads them).

    Tensors keep the parameter dtype. Above `max_shard_bytes` the weights are split into
    `model-0000i-of-0000n.safetensors` shards plus `model.safetensors.index.json`; each file is written under a
    temporary name and renamed into place, one shard in host memory at a time. Stale weight files of an earlier
    save in `path` are removed. Only process 0 writes.
    """
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be > 0, got {max_shard_bytes}")
    path = Path(path)
    config = model.config
    state = nnx.state(model, nnx.Param)
    entries = []  # (key, layout, hf shape, variable), in key order
    for p, variable in jax.tree_util.tree_flatten_with_path(state, is_leaf=placement.is_variable)[0]:
        key = placement.path_key(p)
        layout = layout_of(key)
        entries.append((key, layout, hf_shape(layout, tuple(variable.shape), config), variable))
    shards: list[list[tuple]] = [[]]
    size = 0
    for entry in entries:
        nbytes = entry[3].get_value().nbytes
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes
    names = ([SINGLE_FILE] if len(shards) == 1
             else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    writer = jax.process_index() == 0
    if writer:
        path.mkdir(parents=True, exist_ok=True)
    weight_map, total = {}, 0
    for name, shard in zip(names, shards):
        tensors = {key: to_hf(layout, _host_array(variable.get_value()), shape)
                   for key, layout, shape, variable in shard}
        total += sum(t.nbytes for t in tensors.values())
        weight_map.update({key: name for key in tensors})
        if writer:
            _write_safetensors(path / name, tensors)
            log.info("wrote %s (%d tensors)", path / name, len(tensors))
    if not writer:
        return
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        fileio.write_atomic(path / INDEX_FILE, json.dumps(index, indent=2).encode("utf-8"))
    keep = set(names) | ({INDEX_FILE} if len(shards) > 1 else set())
    for stale in path.iterdir():
        weights = stale.name in (SINGLE_FILE, INDEX_FILE) or _SHARD_NAME.fullmatch(stale.name)
        if weights and stale.name not in keep:
            stale.unlink()
    fileio.write_atomic(path / "config.json", json.dumps(config.to_hf(), indent=2).encode("utf-8"))
