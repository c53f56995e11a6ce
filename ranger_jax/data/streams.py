"""Endless, seeded batch streams whose position is one count (so a checkpoint saves it as `{"index": i}`)."""

from __future__ import annotations

import abc
from typing import Any

import numpy as np


class SeededBatchStream(abc.ABC):
    """Batch i depends only on (seed, i): subclasses build it in `batch(rng, index)` from the generator given."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.index = 0  # batches drawn so far

    def __iter__(self):
        return self

    def get_state(self) -> dict[str, int]:
        """The stream's position (JSON-safe), for checkpoints."""
        return {"index": self.index}

    def set_state(self, state: dict[str, int]) -> None:
        """Continues from a position `get_state` returned."""
        self.index = int(state["index"])

    def __next__(self) -> dict[str, Any]:
        index = self.index
        self.index += 1
        return self.batch(np.random.default_rng([self.seed, index]), index)

    @abc.abstractmethod
    def batch(self, rng: np.random.Generator, index: int) -> dict[str, Any]:
        """Batch `index`, drawn from `rng` (seeded by (seed, index))."""
