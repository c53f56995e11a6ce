"""Learner batches that run a GRPO group's shared context once: one prefix row per group, short suffix rows.

A group that branches late (`rollout.runner.RolloutConfig.branch_turns` / `sample_turns`: the first turns played
once, one turn sampled per member) records rows whose first several hundred tokens are identical and whose trained
tokens are a few dozen at the end. A plain batch (`batching.collate`) runs the decoder over the whole of every
row; a shared-prefix batch holds the common part once per group and each member's remaining tokens as a short
row that continues it through the KV cache (`rl.train_step`). For a causal model this is exact: a suffix token
sees the same keys and values as in the full row, and the gradient reaches the prefix through them.

The split of a unit (the rows of one group) is `s = min(common prefix length, first trained token) - 1`:

- `tokens[:s]` are the same in every row: the prefix row;
- no token at a position <= s is trained: token s, the suffix's first, would be predicted by the prefix's last
  hidden state, which the learner computes once and does not score;
- a suffix row ends right after its row's last trained token (the rest changes no trained log-prob; a row that
  trains on nothing keeps token s alone), and every image placeholder lies before s: suffix rows are text only. A
  unit with an image between s and a row's last trained token is an error that names the row: share prefixes where
  the sampled turns are text after the shared context (e.g. `RolloutConfig.sample_turns`), not whole episodes.

Batch keys: `batching.collate`'s row keys for the suffixes (input_ids, attention_mask, loss_mask, sampler_logp,
row_valid, policy_version, advantages, token_advantages), each suffix row starting at its unit's token s; and

    prefix_input_ids       [G, P] int32   the prefixes, right-padded (image padding placeholders included)
    prefix_attention_mask  [G, P] int32   1 on real tokens and on the image padding's placeholders
    prefix_length          [G] int32      real prefix tokens (what a suffix may attend to); 0 for padding rows
    prefix_index           [B] int32      the prefix row each suffix row continues
    pixel_values [P_img, I], image_grid_thw [N, 3]   the prefixes' images and the image padding (`collate`'s rule)

G is `BatchSpec.prefix_rows` (or, for fewer units, the smallest of `prefix_row_buckets` that holds them, B then
scaled alike: `batch_spec_for`) and P a length bucket; suffix rows are padded to one of `suffix_buckets`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ranger_jax.data import batching, examples


def row_end(example: dict[str, Any], split: int) -> int:
    """Where a row's suffix ends: right after its last trained token (what follows changes no trained log-prob of a
    causal model), or after token `split` alone when it trains on nothing."""
    trained = np.flatnonzero(np.asarray(example["loss_mask"]))
    return int(trained[-1]) + 1 if len(trained) and trained[-1] >= split else split + 1


def split_point(unit: Sequence[dict[str, Any]], *, image_pad_id: int | None) -> int:
    """The token index s where the unit's rows split into a shared prefix `ids[:s]` and suffixes `ids[s:end]`
    (`row_end`).

    Raises:
        ValueError: an empty unit, or a row with image placeholders in its suffix (named by its index).
    """
    if not unit:
        raise ValueError("a shared-prefix unit needs at least one row")
    ids = [np.asarray(r["input_ids"]) for r in unit]
    shortest = min(len(i) for i in ids)
    common = shortest
    for other in ids[1:]:
        differ = np.flatnonzero(ids[0][:shortest] != other[:shortest])
        if len(differ):
            common = min(common, int(differ[0]))
    first_trained = shortest
    for r in unit:
        trained = np.flatnonzero(np.asarray(r["loss_mask"]))
        if len(trained):
            first_trained = min(first_trained, int(trained[0]))
    split = max(min(common, first_trained) - 1, 0)
    if image_pad_id is not None:
        for row, (i, example) in enumerate(zip(ids, unit)):
            late = int(np.sum(i[split:row_end(example, split)] == image_pad_id))
            if late:
                raise ValueError(f"row {row} of a shared-prefix unit has {late} image placeholders between the shared "
                                 f"prefix (token {split} on) and its last trained token; shared-prefix batches need "
                                 "text-only suffixes (batch these rows without shared prefixes)")
    return split


def _prefix_example(example: dict[str, Any], split: int, spec: batching.BatchSpec) -> dict[str, Any]:
    """The row's first `split` tokens with the images whose placeholders they hold (`examples.truncate`: the
    images of the untrained tail past the suffix go), as an untrained row."""
    if spec.image_pad_id is not None:
        example = examples.truncate(example, split, image_pad_id=spec.image_pad_id, merge_size=spec.merge_size)
    return {"input_ids": np.asarray(example["input_ids"])[:split], "attention_mask": np.ones(split, np.int32),
            "loss_mask": np.zeros(split, np.float32), "sampler_logp": np.zeros(split, np.float32),
            "policy_version": -1, "pixel_values": example["pixel_values"], "image_grid_thw": example["image_grid_thw"]}


def _suffix_example(example: dict[str, Any], split: int, patch_features: int) -> dict[str, Any]:
    end = row_end(example, split)
    out = {k: np.asarray(example[k])[split:end] for k in ("input_ids", "attention_mask", "loss_mask", "sampler_logp")}
    out["policy_version"] = example["policy_version"]
    out["pixel_values"] = np.zeros((0, patch_features), np.float32)
    out["image_grid_thw"] = np.zeros((0, 3), np.int32)
    if "advantage" in example:
        out["advantage"] = example["advantage"]
    if "token_advantage" in example:
        out["token_advantage"] = np.asarray(example["token_advantage"])[split:end]
    return out


def suffix_spec(spec: batching.BatchSpec) -> batching.BatchSpec:
    """The text-only spec the suffix rows are collated with: `spec`'s rows, pad id and suffix buckets."""
    return batching.BatchSpec(batch_size=spec.batch_size, length_buckets=spec.suffix_buckets, pad_id=spec.pad_id)


def prefix_spec(spec: batching.BatchSpec) -> batching.BatchSpec:
    """The spec the prefix rows are collated with: `spec` with `prefix_rows` rows and no prefix sharing."""
    return dataclasses.replace(spec, batch_size=spec.prefix_rows, prefix_rows=0, prefix_row_buckets=())


def batch_spec_for(spec: batching.BatchSpec, units: int, rows: int) -> batching.BatchSpec:
    """The spec a shared-prefix batch of `units` units and `rows` suffix rows is collated with: the smallest of
    `spec.prefix_row_buckets` that holds both (its suffix rows scaled with its prefix rows), else `spec`."""
    for bucket in spec.prefix_row_buckets:
        batch = spec.batch_size * bucket // spec.prefix_rows
        if units <= bucket and rows <= batch:
            return dataclasses.replace(spec, batch_size=batch, prefix_rows=bucket, prefix_row_buckets=())
    return spec


def collate_shared(units: Sequence[Sequence[dict[str, Any]]], spec: batching.BatchSpec) -> dict[str, np.ndarray]:
    """One shared-prefix batch (see the module docstring) from units of rows that share a context.

    Raises:
        ValueError: more units than `spec.prefix_rows`, more rows than `spec.batch_size`, a suffix longer than the
            largest suffix bucket, or what `split_point` and `batching.collate` reject (naming unit and row).
    """
    if not spec.prefix_rows:
        raise ValueError("collate_shared needs a BatchSpec with prefix_rows >= 1")
    if not 1 <= len(units) <= spec.prefix_rows:
        raise ValueError(f"collate_shared takes 1..{spec.prefix_rows} units (BatchSpec.prefix_rows), got {len(units)}")
    rows = sum(len(u) for u in units)
    if rows > spec.batch_size:
        raise ValueError(f"{len(units)} units hold {rows} rows, above BatchSpec.batch_size {spec.batch_size}")
    spec = batch_spec_for(spec, len(units), rows)
    prefixes, suffixes, index = [], [], []
    for number, unit in enumerate(units):
        try:
            split = split_point(unit, image_pad_id=spec.image_pad_id)
        except ValueError as err:
            raise ValueError(f"unit {number}: {err}") from None
        prefixes.append(_prefix_example(unit[0], split, spec))
        for row, example in enumerate(unit):
            suffix = _suffix_example(example, split, spec.patch_features)
            if len(suffix["input_ids"]) > spec.suffix_buckets[-1]:
                raise ValueError(f"unit {number} row {row}: its suffix of {len(suffix['input_ids'])} tokens (from "
                                 f"token {split}) exceeds the largest suffix bucket {spec.suffix_buckets[-1]}")
            suffixes.append(suffix)
            index.append(number)
    prefix = batching.collate(prefixes, prefix_spec(spec))
    out = batching.collate(suffixes, suffix_spec(spec))
    out["prefix_input_ids"] = prefix["input_ids"]
    out["prefix_attention_mask"] = prefix["attention_mask"]
    out["prefix_length"] = np.array([len(p["input_ids"]) for p in prefixes] + [0] * (spec.prefix_rows - len(units)),
                                    np.int32)
    out["prefix_index"] = np.array(index + [0] * (spec.batch_size - len(index)), np.int32)
    if spec.image_pad_id is not None:
        out["pixel_values"], out["image_grid_thw"] = prefix["pixel_values"], prefix["image_grid_thw"]
    return out
