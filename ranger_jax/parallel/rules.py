"""One table from logical axis names to mesh axes, with presets for training and sampling.

Every `nnx.Param` carries logical names as `out_sharding=` metadata (one name per dimension) and every activation
is pinned at sublayer boundaries by `constrain(x, "batch", "seq", "embed")`. The table turns names into a
`PartitionSpec`; each mesh axis is used at most once per array (a later dimension asking for an axis already taken
is replicated, e.g. `embed` of an activation whose `batch` already holds "fsdp").

Failures are loud for parameters: no names, a name missing from the table, or a size not divisible by its mesh
axes is a ValueError naming the parameter path, the name and the sizes. Activations degrade instead: an axis group
that does not divide an activation dimension (a decode batch of 1, say) is dropped from the right until it does.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AxisRule = str | tuple[str, ...] | None

# Data and FSDP split the batch; FSDP also splits parameters along their model width; tensor parallelism splits
# heads, MLP width and vocabulary.
TRAIN: Mapping[str, AxisRule] = {
    "batch": ("data", "fsdp"),  # B
    "seq": None,  # T
    "kv_seq": None,  # S
    "embed": "fsdp",  # D
    "mlp": "tensor",  # F
    "heads": "tensor",  # N
    "kv_heads": "tensor",  # K
    "head_dim": None,  # H
    "vocab": "tensor",  # V
    "layers": None,  # L, stacked layers (reserved)
    "experts": None,  # E (reserved)
    "patches": ("data", "fsdp"),  # P and M, vision patches / merged vision tokens
    "patch_features": None,  # I, one flattened pixel patch
    "vision_pos": None,  # rows of the learned vision position table
    "vision_embed": "fsdp",  # C
    "vision_heads": "tensor",  # vision attention heads
    "vision_mlp": "tensor",  # vision MLP and merger hidden width
    "vision_merged": "fsdp",  # merger input, spatial_merge_size**2 * C
    "qkv": None,  # the 3 of the fused vision qkv projection
}

# Sampling keeps whole parameters on each data replica (no FSDP gathers per decode step) and splits them by tensor.
SAMPLE: Mapping[str, AxisRule] = {
    **TRAIN,
    "embed": None,
    "vision_embed": None,
    "vision_merged": None,
}

PRESETS: Mapping[str, Mapping[str, AxisRule]] = {"train": TRAIN, "sample": SAMPLE}

_CURRENT: contextvars.ContextVar[Mapping[str, AxisRule]] = contextvars.ContextVar("sharding_rules", default=TRAIN)


def get_rules(rules: str | Mapping[str, AxisRule]) -> Mapping[str, AxisRule]:
    """Resolves a preset name ("train", "sample") or returns a table as is."""
    if isinstance(rules, str):
        if rules not in PRESETS:
            raise ValueError(f"sharding rules {rules!r} are not a preset; known presets: {sorted(PRESETS)}")
        return PRESETS[rules]
    return rules


@contextlib.contextmanager
def use_rules(rules: str | Mapping[str, AxisRule]) -> Iterator[Mapping[str, AxisRule]]:
    """Makes `rules` the table `constrain` reads while tracing the enclosed code."""
    token = _CURRENT.set(get_rules(rules))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)


def current_rules() -> Mapping[str, AxisRule]:
    """The partition rules in effect (the `TRAIN` preset unless `use_rules` set others)."""
    return _CURRENT.get()


def _axes(rule: AxisRule) -> tuple[str, ...]:
    if rule is None:
        return ()
    return (rule,) if isinstance(rule, str) else tuple(rule)


def logical_to_spec(names: Sequence[str], rules: Mapping[str, AxisRule], *, what: str = "array",
                    shape: Sequence[int] | None = None, mesh: Any = None, strict: bool = True) -> PartitionSpec:
    """Maps one logical name per dimension to a PartitionSpec.

    Args:
        names: logical axis names, one per dimension.
        rules: the table (e.g. TRAIN).
        what: how to call the array in error messages (a parameter path).
        shape: the array's shape; with `mesh`, checked for divisibility.
        mesh: a Mesh or AbstractMesh giving axis sizes.
        strict: raise on a size not divisible by its mesh axes (parameters); otherwise drop axes from the right of
            that dimension's group until it divides (activations).

    Raises:
        ValueError: a name missing from the table, a mesh axis the mesh lacks, or (strict) an indivisible size.
    """
    if shape is not None and len(names) != len(shape):
        raise ValueError(f"{what} has {len(shape)} dimensions {tuple(shape)} but {len(names)} logical names "
                         f"{tuple(names)}")
    mesh_sizes = dict(mesh.shape) if mesh is not None else None
    used: set[str] = set()
    spec = []
    for dim, name in enumerate(names):
        if name not in rules:
            raise ValueError(f"{what}: logical axis name {name!r} is not in the sharding rules; add it to the table "
                             f"(known names: {sorted(rules)})")
        axes = tuple(a for a in _axes(rules[name]) if a not in used)
        if mesh_sizes is not None:
            missing = [a for a in axes if a not in mesh_sizes]
            if missing:
                raise ValueError(f"{what}: rule {name!r} -> {rules[name]!r} names mesh axes {missing} that the mesh "
                                 f"{tuple(mesh_sizes)} lacks")
            if shape is not None:
                total = math.prod(mesh_sizes[a] for a in axes)
                if shape[dim] % total and strict:
                    raise ValueError(
                        f"{what}: dimension {dim} ({name!r}) has size {shape[dim]}, not divisible by mesh axes "
                        f"{axes} of total size {total}; fix: map {name!r} to fewer axes in the rules "
                        f"(e.g. {{**rules, {name!r}: None}}) or use a mesh whose {axes} sizes divide {shape[dim]}")
                while axes and shape[dim] % math.prod(mesh_sizes[a] for a in axes):
                    axes = axes[:-1]
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*spec)


def _param_path(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator=".")


def param_specs(state: Any, rules: str | Mapping[str, AxisRule], mesh: Mesh | None = None) -> Any:
    """A tree like `state` with one PartitionSpec per `nnx.Variable`, checked as described in the module docstring.

    Args:
        state: an `nnx.State` (real or abstract from `nnx.eval_shape`).
        rules: a preset name or a table.
        mesh: when given, every size is checked against the mesh axis sizes.
    """
    table = get_rules(rules)

    def spec(path, variable):
        where = f"parameter {_param_path(path)}"
        names = variable.get_metadata().get("out_sharding")
        if not names:
            raise ValueError(f"{where} {tuple(variable.shape)} has no logical axis names; create it with "
                             "nnx.Param(value, out_sharding=(name, ...))")
        return logical_to_spec(names, table, what=where, shape=variable.shape, mesh=mesh, strict=True)

    return jax.tree_util.tree_map_with_path(spec, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def param_shardings(state: Any, mesh: Mesh, rules: str | Mapping[str, AxisRule]) -> Any:
    """A tree like `state` with one NamedSharding per variable on `mesh` (see `param_specs`)."""
    specs = param_specs(state, rules, mesh)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def constrain(x: jax.Array, *names: str) -> jax.Array:
    """Pins activation `x` to the sharding its logical `names` get under the current mesh and rules.

    A no-op without a mesh (`jax.set_mesh`); applies on CPU meshes too, so tests exercise it.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = logical_to_spec(names, current_rules(), what="activation", shape=x.shape, mesh=mesh, strict=False)
    return jax.lax.with_sharding_constraint(x, spec)
