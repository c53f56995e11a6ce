"""Meshes ("data", "fsdp", "tensor"), the logical-axis partition rules, placing models onto meshes, and running one
SPMD program over several processes.

Modules: `mesh` (building and checking meshes), `rules` (logical axis names to mesh axes: `TRAIN`, `SAMPLE`,
`constrain`), `placement` (materialising an abstract model onto devices, one tensor at a time), `distributed`
(joining the processes of a TPU pod, a GPU cluster or one machine: `initialize`) and `host_data` (one global batch
from every process's own rows).
"""

from ranger_jax.parallel import distributed, host_data, mesh, placement, rules

__all__ = ["distributed", "host_data", "mesh", "placement", "rules"]
