"""The held-out world an evaluation runs in, built on demand in the generation the policy trained in.

A checkpoint's `ranger_env.json` records the offline world generation it learned (`world.world_version`); a
world of another generation measures transfer, not the policy. `ensure_world(dir, seed=S, num_tasks=N,
policy=P)` builds a world of seed S at `dir` in P's generation when `dir` holds none, and otherwise checks that
the world there is that one (seed, task count, generation), naming what differs. `evals/savanna_sim.py
--build-seed S` uses it, so "evaluate this policy on a world of a seed it has never seen" is one command.
"""

from __future__ import annotations

import os
from pathlib import Path

from ranger_jax.env.sim import build, world as world_lib
from ranger_jax.rollout import trained_env


def trained_world_version(policy: str | os.PathLike) -> int | None:
    """The world generation a checkpoint folder's `ranger_env.json` records; None for a scripted agent's name, a
    folder without the file, or a file that does not say."""
    if not (Path(policy) / "config.json").is_file():
        return None
    trained = trained_env.read(policy)
    return None if trained is None else trained.world.get("world_version")


def ensure_world(world_dir: str | os.PathLike, *, seed: int, num_tasks: int, policy: str | os.PathLike | None = None,
                 world_version: int | None = None, progress: bool = False) -> tuple[Path, bool]:
    """Returns `(world_dir, built)`: the world at `world_dir`, built there first when the folder is missing or empty.

    The generation is `world_version` when given, else the one `policy` trained in (`trained_world_version`), else
    `build.DEFAULT_WORLD_VERSION`. When neither pins it (a scripted policy, no version asked for), the default only
    chooses what a new world is built in: an existing world of any generation is accepted (its seed and task count
    must still match), so scripted agents can be scored on the world a checkpoint was evaluated on.

    Raises:
        ValueError: the folder holds another world (its seed, task count or generation differs: all are named), or
            files that are not a world, or `num_tasks` / `world_version` is out of range; nothing is written then.
    """
    world_dir = Path(world_dir)
    recorded = trained_world_version(policy) if policy is not None else None
    pinned = world_version if world_version is not None else recorded
    if world_version is not None and recorded is not None and world_version != recorded:
        raise ValueError(f"world_version {world_version} is not the generation {policy} trained in ({recorded}); "
                         "leave it out to build the policy's")
    if (world_dir / world_lib.WORLD_FILE).exists():
        differ = world_lib.differences(world_dir, seed=seed, num_tasks=num_tasks, world_version=pinned)
        if differ:
            raise ValueError(f"{world_dir} already holds another world: {', '.join(differ)}; pick a new folder")
        return world_dir, False
    version = build.DEFAULT_WORLD_VERSION if pinned is None else pinned
    return build.build_world(world_dir, num_tasks, seed, world_version=version, progress=progress), True
