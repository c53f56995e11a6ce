"""The scenario of the multi-process learner test, shared by the test (one process, the reference) and the worker
script it starts as two processes of one JAX cluster.

    folder = write_fixture(tmp_path)           # tokenizer + tiny checkpoint + trajectory shards with images
    dataset = batches(folder, shard_index=0, shard_count=2)

Trajectories are recorded the rollout's way (`support.recorded`: tiny tokenizer, images through the processor), in
GRPO groups of 2. One length bucket, and patch/image steps above what a host's batch holds, keep every batch at one
shape, so the train step compiles once per process.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from support import recorded

from ranger_jax.data import batching, pipeline, shards
from ranger_jax.models.qwen3_vl import Qwen3VLConfig, init, save
from ranger_jax.processing import load_tokenizer
from ranger_jax.rl.learner import LearnerConfig

ROWS_PER_HOST = 2
GROUPS, G = 8, 2
# the vision tower runs (images cross processes) but is frozen: its backward pass would double the compile time
GRPO = LearnerConfig(objective="grpo", learning_rate=3e-3, max_grad_norm=1.0, adam_eps=1e-5, old_logp="sampler",
                     clip_low=0.2, clip_high=0.28, agg="seq-mean-token-sum", freeze_vision=True)
STEPS_BEFORE_SAVE, STEPS = 2, 3
MESH = {"data": 1, "fsdp": 2, "tensor": 2}  # 4 devices: 2 processes × 2


def model_config() -> Qwen3VLConfig:
    tiny = Qwen3VLConfig.tiny()
    return dataclasses.replace(tiny, text_config=dataclasses.replace(tiny.text_config, vocab_size=512))


def write_fixture(folder: Path) -> Path:
    """Writes `folder/model` (tokenizer + random tiny checkpoint) and `folder/shards`; returns `folder`."""
    renderer = recorded.tiny_renderer(folder / "model")
    save(init(model_config(), seed=3), folder / "model")
    trajectories = [recorded.record(renderer, seed=i, group_id=f"g{i // G}", sample_index=i % G, reward=(i * 7 % 5) / 4,
                                    turns=1)[0] for i in range(GROUPS * G)]
    shards.write_shard(folder / "shards" / "a-00000.array_record", trajectories[:7])
    shards.write_shard(folder / "shards" / "a-00001.array_record", trajectories[7:])
    return folder


def spec(folder: Path) -> batching.BatchSpec:
    return batching.BatchSpec.for_tokenizer(load_tokenizer(folder / "model"), batch_size=ROWS_PER_HOST,
                                            length_buckets=(192,), vision=recorded.VISION, patch_step=256,
                                            image_step=8)


def batches(folder: Path, *, shard_index: int | None = None, shard_count: int | None = None):
    """The GRPO batch dataset of one host (default: this JAX process): whole groups, advantages per group."""
    return pipeline.trajectory_dataset(shards.TrajectorySource(folder / "shards"), spec=spec(folder),
                                       vision=recorded.VISION, grpo_groups=True, seed=1, window_batches=2,
                                       shard_index=shard_index, shard_count=shard_count)
