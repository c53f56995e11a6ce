"""Learner batches for tests, in the learner's batch contract: rows right-padded to T, loss_mask on each row's
"assistant" tail, one row_valid per row.

    from support.learner_batches import CONFIG, text_batch
    batch = text_batch(seed=1, rows=8, length=16)
"""

from __future__ import annotations

import numpy as np

from ranger_jax.models.qwen3_vl import Qwen3VLConfig

CONFIG = Qwen3VLConfig.tiny()
FIRST_TEXT_ID = 7  # above the tiny config's special ids (3..6)
PAD_ID = 0


def text_batch(seed: int, *, rows: int = 8, length: int = 16) -> dict[str, np.ndarray]:
    """Random rows of length/2..length real tokens (row 0 full); loss_mask from a random prompt end to the row's
    last real token."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(length // 2, length + 1, rows)
    lengths[0] = length
    attention_mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    prompt_ends = rng.integers(2, length // 2, rows)
    loss_mask = (np.arange(length)[None] >= prompt_ends[:, None]) & attention_mask.astype(bool)
    input_ids = np.where(attention_mask, rng.integers(FIRST_TEXT_ID, CONFIG.text_config.vocab_size, (rows, length)),
                         PAD_ID)
    return {"input_ids": input_ids.astype(np.int32), "attention_mask": attention_mask,
            "loss_mask": loss_mask.astype(np.float32), "row_valid": np.ones(rows, np.float32)}
