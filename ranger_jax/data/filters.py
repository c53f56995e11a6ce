"""Which rows reach the learner: termination labels, staleness, overlong rows, and the counts of what was done.

Three rules, each configured in `FilterConfig`:

- **termination** — a trajectory whose label is in `drop_terminations` is dropped; one in
  `zero_loss_terminations` is kept with loss mask (and sampler log-probs) zeroed. Neither kind is a valid
  member of its GRPO group: both are left out of the group's mean and std (`rl.grpo.group_advantages`'s
  `valid`), so a filtered reward never shifts the advantages of the others.
- **staleness** — with `max_staleness = k` and `current_version()` giving the learner's weights version v, a
  trajectory with `policy_version < v − k` is dropped (`stale="drop"`) or kept and counted (`stale="flag"`:
  the batch's `policy_version` tells an importance-corrected loss how far behind each row is). A row newer than
  v (sampled by a version withdrawn when a learner resumed from an earlier checkpoint) is always dropped, counted
  "newer". It is decided
  when a batching window is read, with the version recorded in the iterator state, so a resumed run makes the
  same decisions.
- **length** — a row longer than `max_length` is dropped (`overlong="drop"`) or cut (`overlong="truncate"`,
  `examples.truncate`).

`FilterStats` counts rows per reason; it is shared by the threads of one process (a pipeline with
multiprocessing workers counts in each worker).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ranger_jax.data import examples

OVERLONG = ("drop", "truncate")
STALE = ("drop", "flag")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FilterConfig:
    """What the pipeline drops, zeroes, cuts or flags (see the module docstring)."""

    max_length: int | None = None  # tokens per row; None = the batch spec's longest row
    overlong: str = "drop"  # "drop" or "truncate" rows above max_length
    drop_terminations: frozenset[str] = frozenset()  # labels whose trajectories are dropped
    zero_loss_terminations: frozenset[str] = frozenset()  # labels whose trajectories train on nothing
    max_staleness: int | None = None  # k: versions a trajectory may lag the learner; None = no bound
    current_version: Callable[[], int] | None = None  # the learner's weights version now (picklable)
    stale: str = "drop"  # "drop" trajectories beyond max_staleness, or "flag" (keep and count) them
    # cut each row after its last trained token (`examples.trim_untrained_tail`: the loss is unchanged), before the
    # length rule
    trim_untrained_tail: bool = False

    def __post_init__(self):
        object.__setattr__(self, "drop_terminations", frozenset(self.drop_terminations))
        object.__setattr__(self, "zero_loss_terminations", frozenset(self.zero_loss_terminations))
        if self.overlong not in OVERLONG:
            raise ValueError(f"FilterConfig.overlong={self.overlong!r}; known: {', '.join(OVERLONG)}")
        if self.stale not in STALE:
            raise ValueError(f"FilterConfig.stale={self.stale!r}; known: {', '.join(STALE)}")
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"FilterConfig.max_length must be >= 1, got {self.max_length}")
        both = self.drop_terminations & self.zero_loss_terminations
        if both:
            raise ValueError(f"termination labels {sorted(both)} are both dropped and zero-loss; pick one")
        if self.max_staleness is not None:
            if self.max_staleness < 0:
                raise ValueError(f"FilterConfig.max_staleness must be >= 0, got {self.max_staleness}")
            if self.current_version is None:
                raise ValueError("FilterConfig.max_staleness needs current_version, a callable giving the "
                                 "learner's weights version")

    def termination_action(self, label: str | None) -> str:
        """"drop", "zero" or "keep" for a trajectory with termination `label`."""
        if label in self.drop_terminations:
            return "drop"
        if label in self.zero_loss_terminations:
            return "zero"
        return "keep"

    def version_now(self) -> int:
        """The learner's version (-1 when staleness is not bounded)."""
        if self.max_staleness is None:
            return -1
        version = self.current_version()
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"current_version() must return an int, got {type(version).__name__} {version!r}")
        return version

    def is_newer(self, policy_version: int, version_now: int) -> bool:
        """Whether a row was sampled by a version after `version_now` (one withdrawn when the learner resumed from an
        earlier checkpoint): always dropped while staleness is bounded."""
        return self.max_staleness is not None and policy_version > version_now

    def is_stale(self, policy_version: int, version_now: int) -> bool:
        """Whether a row sampled by `policy_version` lags `version_now` by more than max_staleness."""
        return self.max_staleness is not None and policy_version < version_now - self.max_staleness


class FilterStats:
    """Rows per reason: `dropped` and `zeroed` (Counters keyed "termination:<label>", "stale", "newer",
    "overlong"), `truncated`, `flagged_stale`, and `kept` (rows that went on to batching)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.dropped: collections.Counter[str] = collections.Counter()
        self.zeroed: collections.Counter[str] = collections.Counter()
        self.truncated = 0
        self.flagged_stale = 0
        self.kept = 0

    @classmethod
    def from_dict(cls, snapshot: dict[str, Any]) -> FilterStats:
        """The stats an `as_dict` snapshot holds (e.g. saved with a checkpoint), to count on from.

        Raises:
            ValueError: a snapshot without one of the `as_dict` keys (naming it).
        """
        missing = [k for k in ("dropped", "zeroed", "truncated", "flagged_stale", "kept") if k not in snapshot]
        if missing:
            raise ValueError(f"a FilterStats snapshot needs the keys {missing}; got {sorted(snapshot)}")
        stats = cls()
        stats.dropped.update({str(k): int(v) for k, v in snapshot["dropped"].items()})
        stats.zeroed.update({str(k): int(v) for k, v in snapshot["zeroed"].items()})
        stats.truncated, stats.flagged_stale, stats.kept = (int(snapshot[k]) for k in ("truncated", "flagged_stale",
                                                                                        "kept"))
        return stats

    def __getstate__(self) -> dict[str, Any]:  # picklable for Grain workers: the lock is rebuilt, not copied
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def count(self, kind: str, reason: str | None = None, n: int = 1) -> None:
        """Adds `n` to `dropped[reason]`, `zeroed[reason]`, or the `truncated` / `flagged_stale` / `kept` tally."""
        with self._lock:
            if kind in ("dropped", "zeroed"):
                getattr(self, kind)[reason] += n
            elif kind in ("truncated", "flagged_stale", "kept"):
                setattr(self, kind, getattr(self, kind) + n)
            else:
                raise ValueError(f"unknown FilterStats kind {kind!r}")

    def as_dict(self) -> dict[str, Any]:
        """A plain snapshot (for logs and metrics)."""
        with self._lock:
            return {"dropped": dict(sorted(self.dropped.items())), "zeroed": dict(sorted(self.zeroed.items())),
                    "truncated": self.truncated, "flagged_stale": self.flagged_stale, "kept": self.kept}

    def __repr__(self) -> str:
        return f"FilterStats({self.as_dict()})"


def zero_loss(example: dict[str, Any]) -> dict[str, Any]:
    """The example with nothing to train on (loss mask and sampler log-probs zero)."""
    out = dict(example)
    out["loss_mask"] = np.zeros_like(example["loss_mask"])
    out["sampler_logp"] = np.zeros_like(example["sampler_logp"])
    return out


def fit_length(example: dict[str, Any], config: FilterConfig, max_length: int, stats: FilterStats, *,
               image_pad_id: int, merge_size: int) -> dict[str, Any] | None:
    """The example (after `trim_untrained_tail` when configured) if it fits `max_length` tokens, else cut
    (`overlong="truncate"`) or None (counted dropped)."""
    if config.trim_untrained_tail:
        example = examples.trim_untrained_tail(example, image_pad_id=image_pad_id, merge_size=merge_size)
    if len(example["input_ids"]) <= max_length:
        return example
    if config.overlong == "drop":
        stats.count("dropped", "overlong")
        return None
    stats.count("truncated")
    return examples.truncate(example, max_length, image_pad_id=image_pad_id, merge_size=merge_size)
