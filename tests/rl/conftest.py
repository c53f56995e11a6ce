"""The tiny config as a perturbed transformers checkpoint, shared by the learner tests."""

from __future__ import annotations

import pytest
from support import tiny_hf
from support.learner_batches import CONFIG


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Directory of a perturbed random transformers checkpoint of the tiny config (float32)."""
    path = tmp_path_factory.mktemp("tiny_hf")
    tiny_hf.save_checkpoint(CONFIG, path, seed=0)
    return path
