"""Materialising an abstract NNX model onto devices, one host tensor at a time, each in its NamedSharding.

The model is built abstractly (`nnx.eval_shape`), the partition rules give every parameter a NamedSharding, and a
host callback supplies each parameter's full value as numpy; every device then receives only its own slice
(`jax.make_array_from_callback`), so neither the whole model nor an unsharded copy of a large tensor ever lands on a
device. Checkpoint loading and random initialisation share this path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax
import numpy as np
from flax import nnx

from ranger_jax.parallel import mesh as mesh_lib
from ranger_jax.parallel import rules as rules_lib

M = TypeVar("M", bound=nnx.Module)

# (dotted parameter path, abstract variable) -> the full value on the host, in the variable's shape and dtype.
Fetch = Callable[[str, nnx.Variable], np.ndarray]


def path_key(path) -> str:
    """`model.language_model.layers.0.self_attn.q_proj.weight` for a pytree key path."""
    return jax.tree_util.keystr(path, simple=True, separator=".")


def is_variable(x: Any) -> bool:
    """Whether `x` is an NNX variable (a leaf of a model's state)."""
    return isinstance(x, nnx.Variable)


def materialize(abstract: M, fetch: Fetch, *, mesh: jax.sharding.Mesh | None = None,
                rules: str | Mapping[str, rules_lib.AxisRule] = "train") -> M:
    """Replaces every variable of `abstract` by `fetch(path, variable)`, placed on `mesh` (or the default device).

    Args:
        abstract: a module from `nnx.eval_shape`.
        fetch: host values by parameter path; must match each variable's shape and dtype.
        mesh: a ("data", "fsdp", "tensor") mesh, or None for the default device.
        rules: the partition rules (a preset name or a table).

    Raises:
        ValueError: a parameter that does not fit the rules on `mesh` (see `rules.param_specs`), or a fetched value
            of the wrong shape or dtype.
    """
    graphdef, state = nnx.split(abstract)
    shardings: dict = {}
    if mesh is not None:
        mesh_lib.check_mesh(mesh)
        tree = rules_lib.param_shardings(state, mesh, rules)
        shardings = {path_key(p): s for p, s in jax.tree_util.tree_flatten_with_path(tree)[0]}

    def place(path, variable):
        key = path_key(path)
        value = fetch(key, variable)
        if value.shape != tuple(variable.shape) or value.dtype != variable.dtype:
            raise ValueError(f"{key}: host value {value.shape} {value.dtype} != parameter {tuple(variable.shape)} "
                             f"{variable.dtype}")
        if mesh is None:
            return variable.replace(jax.device_put(value))
        return variable.replace(jax.make_array_from_callback(value.shape, shardings[key], lambda index: value[index]))

    return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(place, state, is_leaf=is_variable))
