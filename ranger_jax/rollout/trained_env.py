"""The environment a checkpoint was trained in: `ranger_env.json` next to its weights.

A policy learns one environment's tools, system prompt style, limits and image sizes; evaluating it elsewhere
measures something else. A checkpoint folder may therefore carry the settings it was trained with:

    {"env":     {EnvConfig fields: "tools", "prompt_style", "max_turns", "max_answer_refs", …},
     "rewards": {REWARD_KEYS: "kind", "text_coef", "min_references", …},
     "image":   {"min_pixels": …, "max_pixels": …},                   # observation image bounds
     "episode": {"max_new_tokens": …, "max_context_tokens": …},      # per-turn and whole-episode token budgets
     "world":   {"world_version": …}}                                 # the offline world generation it trained in

Every table is optional; missing keys keep their defaults. `world` says which offline world generation
(`env.sim.build`'s `world_version`) the policy learned: an evaluation on another generation measures transfer, and
`evaluate_checkpoint` says so (`world_mismatch`). `write` records a run's settings (machine-local
paths and keys, such as `image_store`, are left out); `read` checks every key and value and returns None when
the folder has no such file.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ranger_jax import fileio
from ranger_jax.env import config as config_lib
from ranger_jax.rollout import episode as episode_lib
from ranger_jax.rollout import sequence

FILE_NAME = "ranger_env.json"
TABLES = ("env", "rewards", "image", "episode", "world")
IMAGE_KEYS = ("min_pixels", "max_pixels")
EPISODE_KEYS = ("max_new_tokens", "max_context_tokens")
WORLD_KEYS = ("world_version",)
# EnvConfig fields that describe one machine (folders, secrets), not the environment the policy learned.
LOCAL_ENV_KEYS = ("image_store", "summarizer_api_key", "summarizer_cache_dir")


@dataclasses.dataclass(frozen=True)
class TrainedEnv:
    """The parsed content of a checkpoint's `ranger_env.json` (see the module docstring)."""

    env: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    rewards: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    image: Mapping[str, int] = dataclasses.field(default_factory=dict)
    episode: Mapping[str, int] = dataclasses.field(default_factory=dict)
    world: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_run(cls, tool_env: Any, config: episode_lib.EpisodeConfig) -> "TrainedEnv":
        """The settings of a training run: its env (`ToolEnv`: config and rewards) and its episode config."""
        env = {f.name: getattr(tool_env.config, f.name) for f in dataclasses.fields(tool_env.config)
               if f.name not in LOCAL_ENV_KEYS}
        env["tools"] = list(env["tools"])
        return cls(env=env, rewards=dict(tool_env.rewards),
                   image={"min_pixels": config.vision.min_pixels, "max_pixels": config.vision.max_pixels},
                   episode={"max_new_tokens": config.max_new_tokens, "max_context_tokens": config.max_context_tokens})

    def world_mismatch(self, world_version: int) -> str | None:
        """Why a world of generation `world_version` is not the one the policy trained in (None: it is, or the
        file does not say)."""
        trained = self.world.get("world_version")
        if trained is None or trained == world_version:
            return None
        return (f"the policy trained in offline worlds of version {trained}; this world is version {world_version} "
                f"(build one with `python -m ranger_jax.env.sim.build ... --world-version {trained}` to evaluate it "
                "where it learned)")

    def vision(self, *, patch_size: int, merge_size: int, temporal_patch_size: int) -> sequence.VisionSettings:
        """The observation image settings: the recorded pixel bounds (else the defaults) and the model's patching."""
        return sequence.VisionSettings(patch_size=patch_size, merge_size=merge_size,
                                       temporal_patch_size=temporal_patch_size, **self.image)

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON object."""
        return {name: dict(getattr(self, name)) for name in TABLES}


def _counts(table: Mapping[str, Any], keys: tuple[str, ...], where: str) -> dict[str, int]:
    for key, value in table.items():
        if key not in keys:
            raise ValueError(f"{where}: unknown key {key!r}; known keys: {list(keys)}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {key!r} must be a positive integer; got {value!r}")
    return dict(table)


def parse(data: Any, where: str) -> TrainedEnv:
    """A `TrainedEnv` from the file's JSON object.

    Raises:
        ValueError: naming `where`, the table and the key that is unknown or has a bad value.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: must hold a JSON object with the tables {list(TABLES)}")
    unknown = [key for key in data if key not in TABLES]
    if unknown:
        raise ValueError(f"{where}: unknown tables {unknown}; known tables: {list(TABLES)}")
    tables = {}
    for name in TABLES:
        table = data.get(name, {})
        if not isinstance(table, Mapping):
            raise ValueError(f"{where}: {name!r} must be a JSON object; got {type(table).__name__}")
        tables[name] = dict(table)
    for key in tables["env"]:
        if key not in config_lib.ENV_KEYS:
            raise ValueError(f"{where}: unknown key {key!r} in 'env'; known keys: {list(config_lib.ENV_KEYS)}")
    config_lib.env_config(tables["env"], f"{where} 'env'")
    trained = TrainedEnv(env=tables["env"], rewards=config_lib.check_rewards(tables["rewards"], f"{where} 'rewards'"),
                         image=_counts(tables["image"], IMAGE_KEYS, f"{where} 'image'"),
                         episode=_counts(tables["episode"], EPISODE_KEYS, f"{where} 'episode'"),
                         world=_counts(tables["world"], WORLD_KEYS, f"{where} 'world'"))
    if trained.image:
        sequence.VisionSettings(**trained.image)  # min_pixels <= max_pixels, naming both
    return trained


def read(checkpoint_dir: str | os.PathLike) -> TrainedEnv | None:
    """The checkpoint's `ranger_env.json`, or None when it has none.

    Raises:
        ValueError: the file is not JSON or holds an unknown key or bad value (naming the file and the key).
    """
    path = Path(checkpoint_dir) / FILE_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text("utf-8"))
    except ValueError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    return parse(data, str(path))


def write(checkpoint_dir: str | os.PathLike, trained: TrainedEnv) -> Path:
    """Writes `ranger_env.json` into `checkpoint_dir` atomically; returns its path."""
    path = Path(checkpoint_dir) / FILE_NAME
    parse(trained.to_dict(), str(path))  # what is written can be read back
    fileio.write_atomic(path, (json.dumps(trained.to_dict(), indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return path
