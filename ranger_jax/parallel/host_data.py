"""One global batch from every process's own rows: the host side of the learner's SPMD program.

Each process reads its own share of the data (Grain shards by `jax.process_index()`), so each holds B rows of the
learner batch contract. The global batch is every process's rows, in the order the mesh lays rows out (process 0's
block first on a mesh built from `jax.devices()`), with:

- **rows** (`[B, T]` and `[B]` keys) placed with `jax.make_array_from_process_local_data`: each process sends only
  its own rows to its own devices. Processes may have filled different length buckets, so every process first
  learns the others' T and right-pads its rows to the largest (pad token = the batch's own pad id, attention and
  loss masks 0, log-probs 0): the same batch one process would have collated.
- **images** (`pixel_values [P, I]`, `image_grid_thw [N, 3]`) replicated, as the vision tower reads every image:
  every process gathers all processes' images and concatenates them in row-block order. Each process's images
  are already in its rows' token order (its padding images included), so the concatenation is in the global
  batch's token order, as the model requires.

With one process all of this reduces to placing the arrays. `gather_json` collects one JSON value per process
(e.g. each data iterator's state for a checkpoint). Every function here is a collective: all processes call it,
in the same order, with the same mesh.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

ROW_FILL = {"input_ids": None, "attention_mask": 0, "loss_mask": 0.0, "sampler_logp": 0.0, "ref_logp": 0.0}
IMAGE_KEYS = ("pixel_values", "image_grid_thw")


def gather_json(value: Any) -> list[Any]:
    """Every process's `value` (JSON-able), in process order; with one process `[value]`."""
    if jax.process_count() == 1:
        return [value]
    data = np.frombuffer(json.dumps(value, sort_keys=True).encode("utf-8"), np.uint8)
    sizes = multihost_utils.process_allgather(np.array([data.size], np.int64))
    padded = np.zeros(int(np.max(sizes)), np.uint8)
    padded[:data.size] = data
    gathered = multihost_utils.process_allgather(padded)
    return [json.loads(bytes(row[:int(size)]).decode("utf-8")) for row, size in zip(gathered, np.ravel(sizes))]


def _gather_rows(array: np.ndarray) -> np.ndarray:
    """[process_count, *array.shape] from every process (same shape everywhere)."""
    if jax.process_count() == 1:
        return array[None]
    return np.asarray(multihost_utils.process_allgather(array))


def row_block_order(mesh: Mesh, axes: Sequence[str], num_rows: int) -> list[int]:
    """Process indices in the order their row blocks appear in a [num_rows, ...] array sharded over `axes`."""
    sharding = NamedSharding(mesh, PartitionSpec(tuple(axes)))
    starts: dict[int, int] = {}
    for device, index in sharding.devices_indices_map((num_rows,)).items():
        start = index[0].start or 0
        starts[device.process_index] = min(start, starts.get(device.process_index, num_rows))
    return sorted(starts, key=lambda p: starts[p])


def _pad_id(input_ids: np.ndarray, attention_mask: np.ndarray) -> int:
    """The id the batch pads with (its first token under attention_mask 0), 0 when no row is padded."""
    padded = input_ids[attention_mask == 0]
    return int(padded[0]) if padded.size else 0


def _pad_columns(rows: Mapping[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
    """Right-pads every [B, T] array to T = `length` (see the module docstring for the fill values)."""
    ids = rows["input_ids"]
    extra = length - ids.shape[1]
    if extra == 0:
        return dict(rows)
    pad_id = _pad_id(ids, rows["attention_mask"])
    out = {}
    for key, value in rows.items():
        if value.ndim == 2:
            fill = pad_id if key == "input_ids" else ROW_FILL.get(key, 0)
            value = np.concatenate([value, np.full((value.shape[0], extra), fill, value.dtype)], axis=1)
        out[key] = value
    return out


def _global_images(images: Mapping[str, np.ndarray], order: list[int], features: int) -> dict[str, np.ndarray]:
    """Every process's images concatenated in row-block order (each process pads to the largest count to gather)."""
    pixels = images.get("pixel_values", np.zeros((0, features), np.float32))
    grids = images.get("image_grid_thw", np.zeros((0, 3), np.int32))
    counts = _gather_rows(np.array([pixels.shape[0], grids.shape[0]], np.int64))
    if int(counts[:, 1].sum()) == 0:
        return {}
    top_p, top_n = int(counts[:, 0].max()), int(counts[:, 1].max())
    all_pixels = _gather_rows(np.concatenate([pixels, np.zeros((top_p - pixels.shape[0], features), pixels.dtype)]))
    all_grids = _gather_rows(np.concatenate([grids, np.zeros((top_n - grids.shape[0], 3), grids.dtype)]))
    return {"pixel_values": np.concatenate([all_pixels[p, :counts[p, 0]] for p in order]),
            "image_grid_thw": np.concatenate([all_grids[p, :counts[p, 1]] for p in order])}


def global_batch(rows: Mapping[str, np.ndarray], images: Mapping[str, np.ndarray], mesh: Mesh,
                 axes: Sequence[str] = ("data", "fsdp"), *, image_features: int | None = None
                 ) -> dict[str, jax.Array]:
    """The global batch of every process's `rows` and `images` (see the module docstring), placed on `mesh`.

    Args:
        rows: this process's [B, T] and [B] arrays (must hold "input_ids" and "attention_mask").
        images: this process's "pixel_values" [P, I] and "image_grid_thw" [N, 3] (empty: no images here).
        mesh: the learner's mesh.
        axes: the mesh axes rows are split over.
        image_features: I, needed when this process has no images but others may.

    Raises:
        ValueError: processes with different row counts, or images without a feature size (naming the numbers).
    """
    ids = rows["input_ids"]
    shape = _gather_rows(np.array([ids.shape[0], ids.shape[1]], np.int64))
    if len(set(shape[:, 0].tolist())) > 1:
        raise ValueError(f"processes hold different numbers of batch rows {shape[:, 0].tolist()}; every process "
                         "must give the same rows per batch (BatchSpec.batch_size is per host)")
    rows = _pad_columns(rows, int(shape[:, 1].max()))
    num_rows = ids.shape[0] * jax.process_count()
    placed = {}
    for key, value in rows.items():
        sharding = NamedSharding(mesh, PartitionSpec(tuple(axes), *(None,) * (value.ndim - 1)))
        placed[key] = jax.make_array_from_process_local_data(sharding, value, (num_rows, *value.shape[1:]))
    if "pixel_values" in images:
        image_features = images["pixel_values"].shape[1]
    if jax.process_count() == 1:
        merged = dict(images)
    else:
        if image_features is None:
            raise ValueError("global_batch needs image_features when this process's batch holds no images")
        merged = _global_images(images, row_block_order(mesh, axes, num_rows), image_features)
    replicated = NamedSharding(mesh, PartitionSpec())
    for key, value in merged.items():
        placed[key] = jax.make_array_from_callback(value.shape, replicated, lambda index, v=value: v[index])
    return placed


def local_rows(array: jax.Array, mesh: Mesh, axes: Sequence[str] = ("data", "fsdp")) -> np.ndarray:
    """This process's rows of a global [B, ...] array sharded over `axes` (the inverse of `global_batch` for rows)."""
    if array.is_fully_addressable:
        return np.asarray(jax.device_get(array))
    spec = PartitionSpec(tuple(axes), *(None,) * (array.ndim - 1))
    return np.asarray(multihost_utils.global_array_to_host_local_array(array, mesh, spec))


def global_rows(local: int) -> int:
    """Rows of the global batch when every process holds `local` rows."""
    return local * jax.process_count()
