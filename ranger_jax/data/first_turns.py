"""Short SFT rows: each episode cut after its first assistant turn (a text-only request -> first tool call).

A policy trained from scratch learns to copy from its context far more cheaply on these rows than on whole
episodes: a first turn is ~100 tokens instead of ~900, and in an agent's episodes it is the purest copy there is
(the request goes into the first search). Trained on them right after the copy warm-up, with every content word
permuted (`augment.content_words`), the tiny policy's held-out first-turn loss falls from ~2 to ~0.03 in a few
hundred steps, which whole-episode SFT then builds on (measured in `docs/sim_tiny.md`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ranger_jax.data import streams


def first_turn(token_ids: Sequence[int], loss_mask: Sequence[int], *, image_pad_id: int | None = None,
               where: str = "episode") -> tuple[np.ndarray, np.ndarray]:
    """The tokens up to the end of the first assistant turn and their loss mask.

    Raises:
        ValueError: no assistant token, mismatched lengths, or an image inside the cut (the rows are text-only);
            `where` names the episode in the message.
    """
    ids, mask = np.asarray(token_ids, np.int64), np.asarray(loss_mask, np.int64)
    if ids.shape != mask.shape or ids.ndim != 1:
        raise ValueError(f"{where}: token_ids {ids.shape} and loss_mask {mask.shape} must be 1-D of one length")
    assistant = np.nonzero(mask > 0)[0]
    if not assistant.size:
        raise ValueError(f"{where} has no assistant token (loss_mask is all zero)")
    after = np.nonzero(mask[assistant[0]:] == 0)[0]
    end = assistant[0] + (after[0] if after.size else mask.size - assistant[0])
    if image_pad_id is not None and np.any(ids[:end] == image_pad_id):
        raise ValueError(f"{where} has an image before the end of its first assistant turn; first-turn rows are "
                         "text-only")
    return ids[:end], mask[:end]


class FirstTurnBatches(streams.SeededBatchStream):
    """An endless, seeded stream of first-turn batches (learner batch contract, text only).

    Args:
        source: episodes with `token_ids`, `loss_mask` and `image_pad_id` (e.g. a `shards.TrajectorySource`).
        pad_id: the tokenizer's padding id.
        batch_size: rows per batch (episodes drawn with replacement).
        seed: the stream's seed; batch i depends only on (seed, i), so its state is a count.
        augment: a `TokenPermutation` drawn afresh for every row, or None.
    """

    def __init__(self, source: Any, *, pad_id: int, batch_size: int, seed: int = 0, augment: Any = None):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"FirstTurnBatches batch_size must be a positive int; got {batch_size!r}")
        self.rows = []
        for i in range(len(source)):
            record = source[i]
            self.rows.append(first_turn(record.token_ids, record.loss_mask, image_pad_id=record.image_pad_id,
                                        where=f"episode {i} ({record.task_id})"))
        if not self.rows:
            raise ValueError("FirstTurnBatches needs at least one episode")
        self.length = max(ids.size for ids, _ in self.rows)
        super().__init__(seed)
        self.pad_id, self.batch_size, self.augment = pad_id, batch_size, augment

    def batch(self, rng: np.random.Generator, index: int) -> dict[str, np.ndarray]:
        """Batch `index`: `batch_size` first turns drawn from `rng`, each permuted afresh, padded to one length."""
        shape = (self.batch_size, self.length)
        ids, loss_mask = np.full(shape, self.pad_id, np.int64), np.zeros(shape, np.float32)
        attention = np.zeros(shape, np.int32)
        for row, pick in enumerate(rng.integers(len(self.rows), size=self.batch_size)):
            tokens, mask = self.rows[pick]
            if self.augment is not None:
                tokens = self.augment.apply(tokens, self.augment.table(rng))
            ids[row, :tokens.size], loss_mask[row, :tokens.size], attention[row, :tokens.size] = tokens, mask, 1
        return {"input_ids": ids.astype(np.int32), "attention_mask": attention, "loss_mask": loss_mask,
                "row_valid": np.ones(self.batch_size, np.float32)}
