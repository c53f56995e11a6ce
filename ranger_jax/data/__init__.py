"""Trajectory records and shards, task and SFT files, and the Grain pipelines that turn them into learner batches.

Modules: `trajectory` (the `Trajectory` record), `shards` (atomic ArrayRecord shards, `TrajectorySource`),
`viewer` (HTML shard viewer), `examples` (one training row from a trajectory), `sft_file` (Gen-Searcher's
LLaMA-Factory SFT file), `tasks` (published task files: Gen-Searcher RL data and its registered parquet,
KnowGen-Bench, the SFT file, offline worlds), `knowgen_eval` (our eval results as KnowGen_Eval's `results.json`
and images; its `results_eval.json` read back), `filters` (termination, staleness and length rules with their
counts), `batching` (`BatchSpec`, `collate`: static-shape batches and the image padding scheme) and `pipeline`
(Grain datasets with per-host sharding and a resumable iterator). They are listed in `__all__` but not imported
here: the rollout writes trajectories without loading the learner's pipeline. `load_tasks(path)` is the one entry
point for task files.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ranger_jax.env import core

__all__ = ["batching", "examples", "filters", "knowgen_eval", "load_tasks", "pipeline", "sft_file", "shards", "tasks",
           "trajectory", "viewer"]


def load_tasks(path: str | os.PathLike) -> list[core.Task]:
    """The tasks of a published task file (Gen-Searcher RL data, its registered parquet, KnowGen-Bench as a JSON
    array or JSON lines, the SFT file or its `dataset_info.json`, our task JSONL, an offline world).

    See `ranger_jax.data.tasks` for the formats and how each is recognised.

    Raises:
        FileNotFoundError: no such file.
        ValueError (`tasks.TaskFormatError`, `sft_file.SftFormatError`): a malformed file or row, naming the
            file, the line or row and the field.
    """
    from ranger_jax.data import tasks  # imported on use: the package itself stays light

    return tasks.load_tasks(path)
