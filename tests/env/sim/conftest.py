"""Worlds shared by the sim tests, built once per session into temporary folders."""

from __future__ import annotations

import pytest

from ranger_jax.env.sim import build

HARDNESS_SEED = 90210  # not a seed the generator was tuned on
HARDNESS_TASKS = 32  # two tasks per subcategory
V2_SEED = 4242  # a version-2 world whose few tasks hold every kind of request and look-alike
V2_TASKS = 12


@pytest.fixture(scope="session")
def hard_world(tmp_path_factory):
    return build.build_world(tmp_path_factory.mktemp("sim") / "hard", HARDNESS_TASKS, HARDNESS_SEED, world_version=1)


@pytest.fixture(scope="session")
def small_world(tmp_path_factory):
    return build.build_world(tmp_path_factory.mktemp("sim") / "small", 6, 7, world_version=1)


@pytest.fixture(scope="session")
def v2_world(tmp_path_factory):
    return build.build_world(tmp_path_factory.mktemp("sim") / "v2", V2_TASKS, V2_SEED)


@pytest.fixture(scope="session")
def v2_twin(tmp_path_factory):
    """The same version-2 world built again (determinism)."""
    return build.build_world(tmp_path_factory.mktemp("sim") / "v2twin", V2_TASKS, V2_SEED)


@pytest.fixture(scope="session")
def v2_other(tmp_path_factory):
    """A version-2 world of another seed."""
    return build.build_world(tmp_path_factory.mktemp("sim") / "v2other", V2_TASKS, V2_SEED + 1)
