"""Grain pipelines from SFT files and trajectory shards to the learner's batches (`data.batching`).

    dataset = pipeline.trajectory_dataset(shards.TrajectorySource(folder), spec=spec, config=rules)
    iterator = iter(dataset)                  # a grain.DatasetIterator
    batch = next(iterator)                    # dict of numpy arrays, static shapes per bucket
    state = iterator.get_state()              # JSON-able; iterator.set_state(state) resumes at the same batch

Stages, per host:

1. **Units.** An SFT row, a trajectory record, or (GRPO) all records of one `group_id`, found once by
   `group_records` in an order of their own (groups by id, members by sample index), whatever the order the
   shards hold them in. Units are split between hosts by `jax.process_index()` / `process_count()` (unit i goes to
   host i mod count: disjoint, and together complete), shuffled with `seed` (a new order each epoch) and
   repeated `num_epochs` times (None: forever).
2. **Examples.** Each unit is read in Grain's reader threads: trajectories exactly as recorded
   (`examples.trajectory_example`), SFT rows rendered (`sft_file.SftFile.example`); termination labels and
   over-long rows are handled there (`filters`).
3. **Windows.** `WindowBatchIterDataset` reads `window_batches · batch_size` rows at a time, decides staleness
   against the learner's version read once per window, computes GRPO advantages per group (over its valid
   members), sorts the window by length and cuts it into batches, emitted in a seeded random order; a
   window's last batch is filled with padding rows. Its state is the upstream state at the window's start,
   the window's index, the learner version it used and the batches already emitted: restoring re-reads the
   window and skips those, so a resumed run yields exactly the batches the first run would have.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grain
import jax
import numpy as np

from ranger_jax.data import batching, examples, filters, shards, sft_file, shared_prefix
from ranger_jax.processing import chat
from ranger_jax.rl import grpo
from ranger_jax.rollout import sequence

log = logging.getLogger(__name__)

DEFAULT_WINDOW_BATCHES = 8  # batches sorted by length together: more = less length padding, more memory


def group_records(source: shards.TrajectorySource) -> list[tuple[int, ...]]:
    """Record indices of each GRPO group (`group_id`): groups sorted by id, members by `sample_index`.

    The order follows the records, not where they sit in the shards: an actor writes each group as it finishes, so
    two runs of one round can hold the same records in another order, and the batches built from them (with the
    update's floating-point sums) must not change with it. Reads every record once (a corrupt one raises
    `CorruptShardError` naming its shard and record).

    Raises:
        ValueError: a group holds two records with one `sample_index` (a group written twice, e.g. by an actor
            that replayed a round, would count its samples twice); the message names the group and both records.
    """
    groups: dict[str, list[tuple[int, int]]] = {}
    for index in range(len(source)):
        record = source[index]
        groups.setdefault(record.group_id, []).append((record.sample_index, index))
    for group_id, members in groups.items():
        members.sort()
        for (sample, earlier), (next_sample, later) in zip(members, members[1:]):
            if sample == next_sample:
                raise ValueError(f"group {group_id!r} holds sample_index {sample} twice: at "
                                 f"{_where(source, earlier)} and {_where(source, later)}")
    log.info("indexed %d trajectories in %d groups", len(source), len(groups))
    return [tuple(index for _, index in groups[group_id]) for group_id in sorted(groups)]


def _where(source: shards.TrajectorySource, index: int) -> str:
    path, local = source.locate(index)
    return f"shard {path} record {local}"


class LoadTrajectories:
    """Grain map: a unit of record indices -> its examples after the termination and length rules (picklable).

    Each example carries `_valid` (False for zero-loss rows), read by the window stage for group statistics.
    """

    def __init__(self, source: shards.TrajectorySource, *, spec: batching.BatchSpec,
                 vision: sequence.VisionSettings, config: filters.FilterConfig, max_length: int,
                 stats: filters.FilterStats):
        self.source, self.spec, self.vision, self.config = source, spec, vision, config
        self.max_length, self.stats = max_length, stats

    def __call__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        rows = []
        for index in indices:
            trajectory = self.source[int(index)]
            action = self.config.termination_action(trajectory.termination)
            if action == "drop":
                self.stats.count("dropped", f"termination:{trajectory.termination}")
                continue
            path, local = self.source.locate(int(index))
            if self.spec.image_pad_id is not None and trajectory.merge_size != self.spec.merge_size:
                raise ValueError(f"shard {path} record {local}: recorded with merge_size={trajectory.merge_size} "
                                 f"but the batch spec's is {self.spec.merge_size}")
            pad_id = trajectory.image_pad_id if self.spec.image_pad_id is None else self.spec.image_pad_id
            example = examples.trajectory_example(trajectory, image_pad_id=pad_id, patch_size=self.vision.patch_size,
                                                  temporal_patch_size=self.vision.temporal_patch_size,
                                                  where=f"shard {path} record {local}")
            example = filters.fit_length(example, self.config, self.max_length, self.stats, image_pad_id=pad_id,
                                         merge_size=trajectory.merge_size)
            if example is None:
                continue
            if action == "zero":
                self.stats.count("zeroed", f"termination:{trajectory.termination}")
                example = filters.zero_loss(example)
            example["_valid"] = action == "keep"
            rows.append(example)
        return rows


class LoadSftRows:
    """Grain map: an SFT row index -> [its rendered example], or [] when it is dropped as over-long (picklable)."""

    def __init__(self, sft: sft_file.SftFile, *, renderer: chat.ChatRenderer, vision: sequence.VisionSettings,
                 config: filters.FilterConfig, max_length: int, stats: filters.FilterStats):
        self.sft, self.renderer, self.vision = sft, renderer, vision
        self.config, self.max_length, self.stats = config, max_length, stats

    def __call__(self, index: int) -> list[dict[str, Any]]:
        example = self.sft.example(int(index), renderer=self.renderer, vision=self.vision)
        pad_id = self.renderer.tokenizer.image_pad_id
        example = filters.fit_length(example, self.config, self.max_length, self.stats, image_pad_id=pad_id,
                                     merge_size=self.vision.merge_size)
        return [] if example is None else [example]


ADVANTAGE_ESTIMATORS = ("group", "prefix-tree")


class WindowBatchIterDataset(grain.IterDataset):
    """Length-bucketed, fixed-size batches from a stream of units (lists of examples); see the module docstring.

    Args:
        parent: yields lists of examples (a GRPO group, or one row).
        spec: batch shapes.
        config: staleness rule (termination and length were applied upstream).
        stats: where dropped / flagged rows are counted.
        group_advantages: compute GRPO advantages per unit (each unit one group).
        advantages: "group" (one advantage per row, `grpo.group_advantages`) or "prefix-tree" (also one per token,
            `grpo.prefix_tree_advantages`: `token_advantages` in the batch); only with `group_advantages`.
        window_batches: batches per window.
        seed: seeds the batch order inside each window.
        zero_advantage_apart: pack the units whose advantages are all zero (GRPO groups whose rewards are all
            equal) into batches of their own, after the others in length order, so that a learner can leave them
            out of the forward and backward (`Learner.accumulated_step(skip_zero_advantage=True)`).
    """

    def __init__(self, parent: grain.IterDataset, *, spec: batching.BatchSpec, config: filters.FilterConfig,
                 stats: filters.FilterStats, group_advantages: bool, advantages: str = "group",
                 window_batches: int = DEFAULT_WINDOW_BATCHES, seed: int = 0, zero_advantage_apart: bool = False):
        super().__init__(parent)
        if window_batches < 1:
            raise ValueError(f"window_batches must be >= 1, got {window_batches}")
        if advantages not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"unknown advantages {advantages!r}; known: {list(ADVANTAGE_ESTIMATORS)}")
        if advantages != "group" and not group_advantages:
            raise ValueError(f"advantages={advantages!r} needs GRPO groups (group_advantages=True)")
        self.advantages = advantages
        self.spec, self.config, self.stats = spec, config, stats
        self.group_advantages, self.window_batches, self.seed = group_advantages, window_batches, seed
        self.zero_advantage_apart = zero_advantage_apart

    def __iter__(self) -> _WindowBatchIterator:
        return _WindowBatchIterator(self._parent.__iter__(), self)

    def __str__(self) -> str:
        return (f"WindowBatchIterDataset(batch_size={self.spec.batch_size}, window_batches={self.window_batches}, "
                f"length_buckets={self.spec.length_buckets})")


def _zero_advantage(rows: Sequence[dict[str, Any]]) -> bool:
    """Whether every row has advantage 0 (per token too, when it has token advantages)."""
    return all(float(r.get("advantage", 1.0)) == 0.0 and not np.any(np.asarray(r.get("token_advantage", 0.0)) != 0)
               for r in rows)


def _unit_chunks(units: list[list[dict[str, Any]]], batch: int, prefix_rows: int, *, apart: bool = False
                 ) -> list[list[list[dict[str, Any]]]]:
    """Units (each one shared prefix) packed in order of their longest row into chunks of at most `batch` rows and
    `prefix_rows` units: the shared-prefix batches of a window. `apart`: the units of zero advantages in chunks of
    their own, after the others.

    Raises:
        ValueError: a unit with more rows than a batch holds.
    """
    chunks: list[list[list[dict[str, Any]]]] = []
    rows = 0
    keys = [(apart and _zero_advantage(u), max(len(r["input_ids"]) for r in u)) for u in units]
    previous = None
    for i in sorted(range(len(units)), key=keys.__getitem__):  # stable
        unit, kind = units[i], keys[i][0]
        if len(unit) > batch:
            raise ValueError(f"a GRPO group of {len(unit)} rows does not fit a shared-prefix batch of {batch} rows; "
                             "raise BatchSpec.batch_size to at least the group size")
        if not chunks or rows + len(unit) > batch or len(chunks[-1]) == prefix_rows or kind != previous:
            chunks.append([])
            rows = 0
        previous = kind
        chunks[-1].append(unit)
        rows += len(unit)
    return chunks


class _WindowBatchIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, dataset: WindowBatchIterDataset):
        super().__init__(parent)
        self._ds = dataset
        self._window = 0  # index of the current (or next) window
        self._start: dict[str, Any] | None = None  # upstream state at the current window's start
        self._version = -1  # learner version the current window's staleness used
        self._plan: list[list[dict[str, Any]]] | None = None  # the current window's batches, in emission order
        self._emitted = 0

    def _rows(self, unit: list[dict[str, Any]], version: int) -> list[dict[str, Any]]:
        config, stats, rows = self._ds.config, self._ds.stats, []
        for example in unit:
            example = dict(example)
            if config.max_staleness is not None:
                if config.is_newer(int(example["policy_version"]), version):
                    stats.count("dropped", "newer")
                    continue
                stale = config.is_stale(int(example["policy_version"]), version)
                if stale and config.stale == "drop":
                    stats.count("dropped", "stale")
                    continue
                if stale:  # kept: its policy_version tells the learner how far behind it is
                    stats.count("flagged_stale")
            rows.append(example)
        valid = [bool(r.pop("_valid", True)) for r in rows]
        if self._ds.group_advantages and rows:
            # dropped members are gone and zero-loss ones invalid: neither shifts the others' mean and std
            advantages = grpo.group_advantages(np.array([r["reward"] for r in rows], np.float64), np.zeros(len(rows)),
                                               valid=np.array(valid))
            for row, advantage in zip(rows, advantages):
                row["advantage"] = np.float32(advantage)
            if self._ds.advantages == "prefix-tree":
                per_token = grpo.prefix_tree_advantages([r["input_ids"] for r in rows], [r["reward"] for r in rows],
                                                        valid=np.array(valid))
                for row, advantage in zip(rows, per_token):
                    row["token_advantage"] = advantage
        return rows

    def _read_window(self, version: int) -> None:
        self._start, self._version = self._parent.get_state(), version
        target, rows, units = self._ds.window_batches * self._ds.spec.batch_size, [], []
        while len(rows) < target:
            try:
                unit = next(self._parent)
            except StopIteration:
                break
            kept = self._rows(unit, version)
            rows.extend(kept)
            if kept:
                units.append(kept)
        self._ds.stats.count("kept", n=len(rows))
        batch = self._ds.spec.batch_size
        if self._ds.spec.prefix_rows:
            chunks = _unit_chunks(units, batch, self._ds.spec.prefix_rows, apart=self._ds.zero_advantage_apart)
        else:
            zero = [self._ds.zero_advantage_apart and _zero_advantage([r]) for r in rows]
            chunks = []
            for part in sorted(set(zero)):  # rows with a learning signal, then (apart) those of zero advantage
                order = sorted((i for i in range(len(rows)) if zero[i] == part),
                               key=lambda i: len(rows[i]["input_ids"]))  # stable: ties keep read order
                chunks += [[rows[i] for i in order[k:k + batch]] for k in range(0, len(order), batch)]
        permutation = np.random.default_rng([self._ds.seed, self._window]).permutation(len(chunks))
        self._plan = [chunks[i] for i in permutation]
        self._emitted = 0

    def __next__(self) -> dict[str, np.ndarray]:
        if self._plan is None:
            self._read_window(self._ds.config.version_now())
        if not self._plan:
            self._plan = None
            raise StopIteration
        chunk = self._plan[self._emitted]
        self._emitted += 1
        if self._emitted == len(self._plan):
            self._plan, self._window = None, self._window + 1
        if self._ds.spec.prefix_rows:
            return shared_prefix.collate_shared(chunk, self._ds.spec)
        return batching.collate(chunk, self._ds.spec)

    def get_state(self) -> dict[str, Any]:
        if self._plan is not None:
            return {"upstream": self._start, "window": self._window, "version": self._version,
                    "emitted": self._emitted}
        return {"upstream": self._parent.get_state(), "window": self._window, "version": -1, "emitted": 0}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["upstream"])
        self._window, self._plan = int(state["window"]), None
        if int(state["emitted"]):
            self._read_window(int(state["version"]))
            self._emitted = int(state["emitted"])

    def __str__(self) -> str:
        return f"WindowBatchIterator(window={self._window}, emitted={self._emitted})"


def _host_units(units: grain.MapDataset, *, seed: int, num_epochs: int | None, shard_index: int | None,
                shard_count: int | None) -> grain.MapDataset:
    index = jax.process_index() if shard_index is None else shard_index
    count = jax.process_count() if shard_count is None else shard_count
    if not 0 <= index < count:
        raise ValueError(f"shard_index {index} is not in [0, shard_count={count})")
    mine = units[index::count]
    if len(mine) == 0:
        raise ValueError(f"host {index} of {count} gets none of the {len(units)} units; use fewer hosts or more data")
    return mine.shuffle(seed=seed).repeat(num_epochs)


def _max_length(config: filters.FilterConfig, spec: batching.BatchSpec) -> int:
    if config.max_length is None:
        return spec.max_row_length
    if config.max_length > spec.max_row_length:
        raise ValueError(f"FilterConfig.max_length={config.max_length} exceeds the batch spec's max_row_length "
                         f"{spec.max_row_length} (largest bucket {spec.length_buckets[-1]} less image headroom "
                         f"{spec.image_headroom}); add a larger length bucket")
    return config.max_length


def _read_options(read_options: grain.ReadOptions | None, spec: batching.BatchSpec) -> grain.ReadOptions:
    # Grain's default buffers 500 elements; one trajectory's pixel values can be tens of MB.
    return read_options or grain.ReadOptions(num_threads=2, prefetch_buffer_size=spec.batch_size)


def trajectory_dataset(source: shards.TrajectorySource, *, spec: batching.BatchSpec,
                       vision: sequence.VisionSettings = sequence.VisionSettings(),
                       config: filters.FilterConfig = filters.FilterConfig(), stats: filters.FilterStats | None = None,
                       grpo_groups: bool = True, seed: int = 0, num_epochs: int | None = None,
                       window_batches: int = DEFAULT_WINDOW_BATCHES, shard_index: int | None = None,
                       shard_count: int | None = None, read_options: grain.ReadOptions | None = None,
                       augment: Callable[[list[dict[str, Any]], np.random.Generator], list[dict[str, Any]]]
                       | None = None, advantages: str = "group", zero_advantage_apart: bool = False
                       ) -> WindowBatchIterDataset:
    """Batches of recorded trajectories: exact tokens, masks, sampler log-probs and pixels.

    Args:
        source: the shards.
        spec: batch shapes; its `image_pad_id` must be the id the trajectories were recorded with.
        vision: the vision tower's patching (`patch_size`, `temporal_patch_size`).
        config: termination, staleness and length rules.
        stats: counts of dropped / zeroed / truncated / flagged rows (a new one when None; `dataset.stats`).
        grpo_groups: units are whole `group_id` groups with GRPO advantages (`advantages` in the batch); False
            reads records one by one without advantages (e.g. SFT on expert trajectories).
        seed: shuffle and batch-order seed.
        num_epochs: passes over this host's units; None repeats forever.
        window_batches: batches sorted by length together.
        shard_index, shard_count: this host and the number of hosts (default: JAX's process index and count).
        read_options: Grain reader threads and prefetch (default 2 threads, one batch of units buffered).
        augment: a random transform of each unit's rows (e.g. `data.augment.TokenPermutation`), drawn from `seed`
            and the element's position so a restored iterator repeats it. For GRPO groups it must transform a
            group's rows alike (`per_unit=True`), so they keep one context.
        advantages: "group" or "prefix-tree" (GRPO groups only; `WindowBatchIterDataset`).
        zero_advantage_apart: batches of zero-advantage groups kept apart (`WindowBatchIterDataset`).
    """
    if augment is not None and grpo_groups and not getattr(augment, "per_unit", False):
        raise ValueError("augmenting GRPO groups needs one draw per group (e.g. TokenPermutation(per_unit=True)): "
                         "a group's rows share their context")
    hosts = jax.process_count() if shard_count is None else shard_count
    if spec.prefix_row_buckets and hosts > 1:
        raise ValueError(f"BatchSpec.prefix_row_buckets {list(spec.prefix_row_buckets)} with {hosts} hosts: each "
                         "host would size its own batches, and their steps must run one program; use () there")
    stats = filters.FilterStats() if stats is None else stats
    units = group_records(source) if grpo_groups else [(i,) for i in range(len(source))]
    load = LoadTrajectories(source, spec=spec, vision=vision, config=config, max_length=_max_length(config, spec),
                            stats=stats)
    mine = _host_units(grain.MapDataset.source(units), seed=seed, num_epochs=num_epochs, shard_index=shard_index,
                       shard_count=shard_count)
    loaded = mine.map(load)
    if augment is not None:
        loaded = loaded.random_map(augment, seed=seed)
    stream = loaded.to_iter_dataset(_read_options(read_options, spec))
    return WindowBatchIterDataset(stream, spec=spec, config=config, stats=stats, group_advantages=grpo_groups,
                                  advantages=advantages, window_batches=window_batches, seed=seed,
                                  zero_advantage_apart=zero_advantage_apart)


def sft_dataset(sft: sft_file.SftFile, *, renderer: chat.ChatRenderer, spec: batching.BatchSpec,
                vision: sequence.VisionSettings = sequence.VisionSettings(),
                config: filters.FilterConfig = filters.FilterConfig(), stats: filters.FilterStats | None = None,
                seed: int = 0, num_epochs: int | None = None, window_batches: int = DEFAULT_WINDOW_BATCHES,
                shard_index: int | None = None, shard_count: int | None = None,
                read_options: grain.ReadOptions | None = None) -> WindowBatchIterDataset:
    """Batches of an SFT file's rows, rendered with `renderer` (assistant-only loss) and images preprocessed with
    `vision`'s pixel bounds; `policy_version` is -1 and there are no advantages. Other arguments as
    `trajectory_dataset` (termination and staleness rules do not apply to SFT rows).

    Raises:
        ValueError: `spec` ids differ from the renderer's tokenizer.
    """
    tokenizer = renderer.tokenizer
    if spec.pad_id != tokenizer.pad_id or spec.image_pad_id not in (None, tokenizer.image_pad_id):
        raise ValueError(f"batch spec ids (pad {spec.pad_id}, image_pad {spec.image_pad_id}) differ from the "
                         f"tokenizer's (pad {tokenizer.pad_id}, image_pad {tokenizer.image_pad_id})")
    stats = filters.FilterStats() if stats is None else stats
    load = LoadSftRows(sft, renderer=renderer, vision=vision, config=config, max_length=_max_length(config, spec),
                       stats=stats)
    mine = _host_units(grain.MapDataset.range(len(sft)), seed=seed, num_epochs=num_epochs, shard_index=shard_index,
                       shard_count=shard_count)
    stream = mine.map(load).to_iter_dataset(_read_options(read_options, spec))
    unbounded = dataclasses.replace(config, max_staleness=None, current_version=None)  # no policy sampled SFT rows
    return WindowBatchIterDataset(stream, spec=spec, config=unbounded, stats=stats, group_advantages=False,
                                  window_batches=window_batches, seed=seed)
