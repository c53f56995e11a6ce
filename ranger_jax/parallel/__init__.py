"""Meshes ("data", "fsdp", "tensor"), the logical-axis partition rules, and placing models onto meshes.

Modules: `mesh` (building and checking meshes), `rules` (logical axis names to mesh axes: `TRAIN`, `SAMPLE`,
`constrain`) and `placement` (materialising an abstract model onto devices, one tensor at a time).
"""

from ranger_jax.parallel import mesh, placement, rules

__all__ = ["mesh", "placement", "rules"]
