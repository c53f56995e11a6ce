"""Device meshes with the project's three axes, ("data", "fsdp", "tensor"), all of `AxisType.Auto`.

jax 0.10 `jax.make_mesh` defaults to Explicit axes, under which `with_sharding_constraint` refuses logical specs,
so every mesh here is built with Auto axes and activated with `jax.set_mesh(mesh)`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

AXES = ("data", "fsdp", "tensor")


def make_mesh(*, data: int = 1, fsdp: int = -1, tensor: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Builds a ("data", "fsdp", "tensor") mesh over `devices` (default: all of them).

    Args:
        data: size of the pure data-parallel axis.
        fsdp: size of the data-parallel axis that also shards parameters; -1 takes the devices left over.
        tensor: size of the tensor-parallel axis (heads, MLP width, vocabulary).
        devices: the devices to arrange, in order; default `jax.devices()`.

    Raises:
        ValueError: the axis sizes do not multiply to the number of devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
    fill = [name for name, size in sizes.items() if size == -1]
    if len(fill) > 1 or any(size == 0 or size < -1 for size in sizes.values()):
        raise ValueError(f"mesh sizes must be positive, with at most one -1 to fill; got {sizes}")
    known = math.prod(size for size in sizes.values() if size != -1)
    if fill:
        if len(devices) % known:
            raise ValueError(f"cannot fill mesh axis {fill[0]!r}: {len(devices)} devices are not divisible by the "
                             f"other axes' product {known} (sizes {sizes})")
        sizes[fill[0]] = len(devices) // known
    if math.prod(sizes.values()) != len(devices):
        raise ValueError(f"mesh sizes {sizes} multiply to {math.prod(sizes.values())}, but there are "
                         f"{len(devices)} devices; pass sizes whose product is {len(devices)}")
    grid = np.array(devices, dtype=object).reshape(tuple(sizes[a] for a in AXES))
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def check_mesh(mesh: Mesh) -> None:
    """Raises ValueError unless `mesh` has this project's axis names, all of `AxisType.Auto`."""
    if tuple(mesh.axis_names) != AXES:
        raise ValueError(f"mesh axes {tuple(mesh.axis_names)} != {AXES}; build it with parallel.mesh.make_mesh")
    if any(t != AxisType.Auto for t in mesh.axis_types):
        raise ValueError(f"mesh axis types {mesh.axis_types} must all be AxisType.Auto (jax.make_mesh defaults to "
                         "Explicit); build it with parallel.mesh.make_mesh")
