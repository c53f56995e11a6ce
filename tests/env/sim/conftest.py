"""Worlds shared by the sim tests, built once per session into temporary folders."""

from __future__ import annotations

import pytest

from ranger_jax.env.sim import build

HARDNESS_SEED = 90210  # not a seed the generator was tuned on
HARDNESS_TASKS = 32  # two tasks per subcategory


@pytest.fixture(scope="session")
def hard_world(tmp_path_factory):
    return build.build_world(tmp_path_factory.mktemp("sim") / "hard", HARDNESS_TASKS, HARDNESS_SEED)


@pytest.fixture(scope="session")
def small_world(tmp_path_factory):
    return build.build_world(tmp_path_factory.mktemp("sim") / "small", 6, 7)
