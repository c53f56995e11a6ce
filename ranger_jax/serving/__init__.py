"""Serving the policy and the image generator with SGLang on GPU nodes, and keeping them on the learner's weights.

Modules: `sglang_server` (SGLang policy, diffusion and router processes: flags, start, health, logs, stop) and
`weight_sync` (published weight versions loaded by every policy server with `/update_weights_from_disk`). SGLang
itself runs from its own virtual environment (see `sglang_server`); nothing here imports it.
"""

from ranger_jax.serving import sglang_server, weight_sync

__all__ = ["sglang_server", "weight_sync"]
