"""Trajectory records and shards, SFT files, and the Grain pipelines that turn them into learner batches.

Modules: `trajectory` (the `Trajectory` record), `shards` (atomic ArrayRecord shards, `TrajectorySource`),
`viewer` (HTML shard viewer), `examples` (one training row from a trajectory), `sft_file` (Gen-Searcher's
LLaMA-Factory SFT file), `filters` (termination, staleness and length rules with their counts), `batching`
(`BatchSpec`, `collate`: static-shape batches and the image padding scheme) and `pipeline` (Grain datasets with
per-host sharding and a resumable iterator). They are listed in `__all__` but not imported here: the rollout
writes trajectories without loading the learner's pipeline.
"""

__all__ = ["batching", "examples", "filters", "pipeline", "sft_file", "shards", "trajectory", "viewer"]
