"""Running one stage over its items: resumable, concurrent, with a progress bar; and the run's kept/dropped report.

`run_stage` takes the stage's ledger and its items as (key, payload) pairs. Items whose key the ledger already
holds are skipped (a rerun does only the rest); the others run concurrently, at most `concurrency` at once (each
service's client has its own limit on top), and each finished item is appended to the ledger at once. An item whose
call fails for good (a service error after its retries, a judge that never gave a usable answer) is NOT written to
the ledger: it is counted as failed in this run and tried again by the next. Anything else that goes wrong is a bug
and stops the run.

`Report` collects, per stage, the kept and dropped counts by reason (from the ledgers, so a resumed run reports
the whole run) and this run's failures, and writes `report.json` and a readable `report.md` atomically.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tqdm

from ranger_jax import fileio
from ranger_jax.clients import http
from ranger_jax.datagen import ledger as ledger_lib
from ranger_jax.env.backends import base
from ranger_jax.rewards import judge

log = logging.getLogger(__name__)

# Failures of a service that a later run may not meet again; everything else propagates.
RETRYABLE_FAILURES = (http.ClientError, base.BackendError, judge.JudgeError)
Outcome = tuple[str, str, Mapping[str, Any]]  # (status, reason, record)


@dataclasses.dataclass
class StageStats:
    """What one call of `run_stage` did: items skipped (already done), finished, failed (with the first errors)."""

    skipped: int = 0
    finished: int = 0
    failed: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)


async def run_stage(name: str, ledger: ledger_lib.Ledger, items: Sequence[tuple[str, Any]],
                    work: Callable[[Any], Awaitable[Outcome]], *, concurrency: int = 8,
                    progress: bool = True) -> StageStats:
    """Runs `work` on every item whose key is not in `ledger` (see the module docstring).

    Args:
        name: the stage's name (progress bar, logs).
        ledger: the stage's ledger.
        items: (key, payload) pairs; a key that repeats is done once.
        work: payload -> (status, reason, record); raises one of RETRYABLE_FAILURES when a service failed.
        concurrency: items in flight at once.
        progress: show a progress bar with kept / dropped / failed counts.

    Returns:
        The stage's StageStats.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    stats, todo, seen = StageStats(), [], set()
    for key, payload in items:
        if key in seen:
            continue
        seen.add(key)
        if ledger.done(key):
            stats.skipped += 1
        else:
            todo.append((key, payload))
    counts = collections.Counter()
    bar = tqdm.tqdm(total=len(todo), desc=name, unit="item", disable=not progress or not todo)
    slots = asyncio.Semaphore(concurrency)

    async def one(key: str, payload: Any) -> None:
        async with slots:
            try:
                status, reason, record = await work(payload)
            except RETRYABLE_FAILURES as err:
                stats.failed += 1
                counts["failed"] += 1
                if len(stats.errors) < 20:
                    stats.errors.append(f"{key}: {type(err).__name__}: {err}")
                log.warning("stage %s: item %s failed (%s); a rerun tries it again", name, key, err)
            else:
                ledger.add(key, status, reason, record)
                stats.finished += 1
                counts[status] += 1
            bar.update(1)
            bar.set_postfix(kept=counts["kept"], dropped=counts["dropped"], failed=counts["failed"])

    try:
        await asyncio.gather(*(one(k, p) for k, p in todo))
    finally:
        bar.close()
    return stats


class Report:
    """Kept and dropped counts per reason per stage (see the module docstring).

    Args:
        path: where `report.json` goes (`report.md` beside it).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.stages: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []  # stages in the order they were first reported
        self.figures: dict[str, Any] = {}

    def _set(self, stage: str, row: dict[str, Any]) -> None:
        if stage not in self.order:
            self.order.append(stage)
        self.stages[stage] = row

    def load(self) -> None:
        """Takes the counts of an earlier run's report at `path` (stages this run does not redo keep them)."""
        if self.path.is_file():
            saved = json.loads(self.path.read_text("utf-8"))
            for stage in saved.get("order", sorted(saved.get("stages", {}))):
                self._set(stage, saved["stages"][stage])
            self.figures.update(saved.get("figures", {}))

    def add_ledger(self, stage: str, ledger: ledger_lib.Ledger, stats: StageStats | None = None) -> None:
        """Counts of a ledger-backed stage (plus this run's failures)."""
        counts = ledger.counts()
        self._set(stage, {"kept": counts["kept"], "dropped": counts["dropped"],
                              "num_kept": sum(counts["kept"].values()), "num_dropped": sum(counts["dropped"].values()),
                              "failed_this_run": stats.failed if stats else 0,
                              "errors": list(stats.errors) if stats else []})

    def add_counts(self, stage: str, kept: Mapping[str, int], dropped: Mapping[str, int]) -> None:
        """Counts of a stage computed in memory (e.g. de-duplication)."""
        self._set(stage, {"kept": dict(sorted(kept.items())), "dropped": dict(sorted(dropped.items())),
                          "num_kept": sum(kept.values()), "num_dropped": sum(dropped.values()),
                          "failed_this_run": 0, "errors": []})

    def add_figures(self, **figures: Any) -> None:
        """Measured figures that belong in the report (sizes, scores)."""
        self.figures.update(figures)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON."""
        return {"stages": self.stages, "order": list(self.order), "figures": self.figures}

    def markdown(self) -> str:
        """The report as a readable table."""
        lines = ["| stage | kept | dropped | reasons |", "|---|---|---|---|"]
        for stage in self.order:
            row = self.stages[stage]
            reasons = [f"kept {r}: {n}" for r, n in row["kept"].items()]
            reasons += [f"dropped {r}: {n}" for r, n in row["dropped"].items()]
            if row["failed_this_run"]:
                reasons.append(f"failed this run: {row['failed_this_run']}")
            lines.append(f"| {stage} | {row['num_kept']} | {row['num_dropped']} | {'; '.join(reasons)} |")
        if self.figures:
            lines += ["", "| figure | value |", "|---|---|"]
            lines += [f"| {k} | {v} |" for k, v in self.figures.items()]
        return "\n".join(lines) + "\n"

    def write(self) -> Path:
        """Writes `report.json` and `report.md` (each atomically); returns the JSON path."""
        ledger_lib.write_json(self.path, self.to_dict())
        fileio.write_atomic(self.path.with_suffix(".md"), self.markdown().encode("utf-8"))
        return self.path
