"""Launching runs on rented hardware: `tpu` composes the gcloud commands of a Cloud TPU slice (create, set up every
worker, run on all of them, logs, stop, delete); `tpu/launch.py` is its command line."""

from ranger_jax.launch import tpu

__all__ = ["tpu"]
