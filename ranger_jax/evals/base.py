"""What every benchmark adapter provides to the runner and the reports (`evals.knowgen`, `evals.savanna`,
`evals.mind_bench`, `evals.wise`): judging one item, and scoring a run exactly as the benchmark publishes it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ranger_jax.evals import agent as agent_lib
from ranger_jax.evals import items as items_lib


@dataclasses.dataclass(frozen=True)
class Judged:
    """A benchmark's verdict on one item.

    Attributes:
        scores: the per-item numbers the benchmark's aggregation reads (JSON-ready).
        judge: the judge's output worth showing (verdicts, rationales, raw replies).
        reward: the item's headline score in [0, 1] (recorded as the episode's reward).
        error: why the item could not be judged, or None.
    """

    scores: Mapping[str, Any]
    judge: Mapping[str, Any]
    reward: float = 0.0
    error: str | None = None


class Benchmark(Protocol):
    """A benchmark adapter.

    Attributes:
        name: the benchmark's name (`knowgen`, `savanna`, `mind_bench`, `wise`).
        t2i_suffix: appended to an item's prompt when it goes to the generator without an agent's answer (the
            generator-alone baseline and the fallback of an answer without references).
    """

    name: str
    t2i_suffix: str

    async def ajudge(self, item: items_lib.Item, image: bytes | None, agent: agent_lib.AgentResult | None,
                     folder: Path) -> Judged:
        """Judges one item: `image` is the generated PNG (None when generation failed), `agent` the policy's
        result (None without a policy), `folder` the item's folder (reference files are relative to it)."""

    def summarize(self, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
        """The run's scores as the benchmark's published scorer computes them, from finished records by item id
        (items without a record count as not run)."""

    def table(self, summary: Mapping[str, Any], label: str) -> str:
        """The run's headline scores as a markdown table, its row(s) named `label`."""

    def bars(self, summary: Mapping[str, Any]) -> dict[str, dict[str, float]]:
        """Bar charts of the summary: {chart title: {label: value}} (values on the benchmark's reported scale)."""

    def export(self, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]],
               run_dir: Path) -> list[Path]:
        """Writes the run in the benchmark's own result format (so its published scorer can read it); returns the
        files written."""

    async def aclose(self) -> None:
        """Closes the judge clients."""
