"""ranger_jax: agentic image generation in the wild, on JAX.

Importing `ranger_jax` loads nothing heavy; import the part you use:

    from ranger_jax import env                  # the tool environment and its offline world (env.sim)
    from ranger_jax.models import qwen3_vl      # Qwen3-VL in Flax NNX: load, save, Qwen3VL
    from ranger_jax import processing           # preprocess_image, chat rendering, tokenizers
    from ranger_jax import rollout, sampling    # agent loop, actors, the KV-cache sampler
    from ranger_jax import data, rewards, clients, parallel
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import tomllib


def _version() -> str:
    """The installed distribution's version, else (a source tree that was never installed) pyproject.toml's."""
    try:
        return importlib.metadata.version("ranger_jax")
    except importlib.metadata.PackageNotFoundError:
        pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
        return tomllib.loads(pyproject.read_text("utf-8"))["project"]["version"]


__version__ = _version()

__all__ = ["__version__"]
