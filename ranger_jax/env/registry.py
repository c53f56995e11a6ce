"""`make(name, **options)`: builds a `ToolEnv` from a backend name, a shipped environment name or a TOML file.

Names resolve in this order: a backend of `BACKENDS` (`"offline"`, `"live"`), an environment file shipped in the
package (`env_files()`: `"savanna_sim"`, `"savanna_live"`, `"knowgen_live"`, from `ranger_jax/env/configs/`), then
a path to a `.toml` file of the same format. Options are flat keywords: each must be an option of the chosen
backend, an `EnvConfig` field or a reward key; options given to `make` override the file.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ranger_jax.env import config as config_lib
from ranger_jax.env import tool_env
from ranger_jax.env.backends import base


CONFIGS_DIR = Path(__file__).resolve().parent / "configs"  # the environment files shipped as package data


def env_files() -> dict[str, Path]:
    """The environment files shipped with the library, by name (`{"savanna_sim": Path(...), ...}`)."""
    return {path.stem: path for path in sorted(CONFIGS_DIR.glob("*.toml"))}


def find_env_file(name: str | os.PathLike) -> Path:
    """The file an environment name stands for: a shipped environment (`"savanna_sim"`) or a path to a TOML file.

    Raises:
        FileNotFoundError: a path that does not exist, naming it and the shipped names.
        ValueError: neither a shipped name nor a path to a file, listing the shipped names.
    """
    name = os.fspath(name)
    shipped = env_files()
    if name in shipped:
        return shipped[name]
    path = Path(name)
    if path.is_file():
        return path
    if name.endswith(".toml"):
        raise FileNotFoundError(f"environment file {name} does not exist; shipped environments: {sorted(shipped)} "
                                f"(e.g. make({next(iter(sorted(shipped)), 'savanna_sim')!r}, ...))")
    raise ValueError(f"unknown environment {name!r}; use a backend {sorted(BACKENDS)}, a shipped environment "
                     f"{sorted(shipped)} or a path to a .toml environment file")


def _world_dir(world: Any) -> str:
    """`world` checked to be a folder (a world built by `python -m ranger_jax.env.sim.build`)."""
    path = Path(os.fspath(world))
    if path.is_file():
        raise ValueError(f"world {str(path)!r} is a file, not a world folder; pass the folder that "
                         f"`python -m ranger_jax.env.sim.build` wrote (the one holding world.json, perhaps "
                         f"{str(path.parent)!r})")
    if not path.exists():
        raise FileNotFoundError(f"world folder {str(path)!r} does not exist; build one with "
                                "`python -m ranger_jax.env.sim.build --out DIR`")
    return os.fspath(world)


def _offline(options: dict[str, Any]) -> base.Backend:
    from ranger_jax.env.backends import offline  # imported when used: it loads the world's indexes

    return offline.OfflineBackend(_world_dir(options["world"]))


def _live(options: dict[str, Any]) -> base.Backend:
    from ranger_jax.env.backends import live

    return live.LiveBackend(**options)


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """How to build one named backend from its options, and which options it takes."""

    build: Callable[[dict[str, Any]], base.Backend]
    keys: tuple[str, ...]  # options the backend takes
    required: tuple[str, ...] = ()


def _live_keys() -> tuple[str, ...]:
    from ranger_jax.env.backends import live

    return live.LIVE_OPTIONS


BACKENDS: dict[str, Callable[[], BackendSpec]] = {
    "offline": lambda: BackendSpec(_offline, ("world",), required=("world",)),
    "live": lambda: BackendSpec(_live, _live_keys()),
}


def _spec(backend: str, where: str) -> BackendSpec:
    if backend not in BACKENDS:
        raise ValueError(f"{where}: unknown backend {backend!r}; known backends: {sorted(BACKENDS)}")
    return BACKENDS[backend]()


def make(name: str | os.PathLike, **options: Any) -> tool_env.ToolEnv:
    """A ToolEnv for a backend name (`"live"`, `"offline"`), a shipped environment (`"savanna_sim"`, see
    `env_files()`) or the path of an environment file (`"my_env.toml"`).

    Args:
        name: backend name, shipped environment name, or path to a TOML environment file.
        **options: backend options (e.g. `world=DIR`, `serper_base_url=…`, `allow_hosts=("127.0.0.1:8080",)`),
            EnvConfig fields (e.g. `max_turns=5`) and reward keys; they override the file's values.

    Raises:
        ValueError: an unknown name, backend or option (naming the file and key where there is one), a
            missing required option, or a `world` that is a file rather than a world folder.
        FileNotFoundError: a `.toml` path or a `world` folder that does not exist.
    """
    name = os.fspath(name)
    backend_options: dict[str, Any] = {}
    env_values: dict[str, Any] = {}
    rewards: dict[str, Any] = {}
    if name in BACKENDS:
        backend, where = name, f"env {name!r}"
        spec = _spec(backend, where)
    else:
        env_file = config_lib.load_env_file(find_env_file(name))
        backend, where = env_file.backend, env_file.path
        spec = _spec(backend, where)
        for key in env_file.backend_options:
            if key not in spec.keys:
                raise ValueError(f"{where}: unknown key {key!r} in [backend_options] for backend {backend!r}; "
                                 f"known keys: {list(spec.keys)}")
        backend_options.update(env_file.backend_options)
        env_values.update(env_file.env)
        rewards.update(env_file.rewards)
    for key, value in options.items():
        known = False
        if key in spec.keys:
            backend_options[key], known = value, True
        if key in config_lib.ENV_KEYS:
            env_values[key], known = value, True
        if key in config_lib.REWARD_KEYS:
            rewards[key], known = value, True
        if not known:
            raise ValueError(f"{where}: unknown option {key!r}; backend {backend!r} takes {list(spec.keys)}, "
                             f"the env takes {list(config_lib.ENV_KEYS)}, "
                             f"rewards take {sorted(config_lib.REWARD_KEYS)}")
    for key in spec.keys:  # shared keys (e.g. max_image_bytes) reach both sides
        if key in config_lib.ENV_KEYS and key in env_values and key not in backend_options:
            backend_options[key] = env_values[key]
    missing = [k for k in spec.required if backend_options.get(k) in (None, "")]
    if missing:
        raise ValueError(f"{where}: backend {backend!r} needs option(s) {missing}, e.g. make({name!r}, "
                         f"{missing[0]}=...)")
    env_config = config_lib.env_config(env_values, where)
    config_lib.check_rewards(rewards, where)
    try:
        backend_impl = spec.build(backend_options)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from err
    return tool_env.ToolEnv(backend_impl, env_config, rewards=rewards)
