"""`make(name, **options)`: builds a `ToolEnv` from a backend name or an `envs/*.toml` file.

Backends resolve through `BACKENDS`. Options are flat keywords: each must be an option of the chosen backend, an
`EnvConfig` field or a reward key; options given to `make` override the file.
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


def _offline(options: dict[str, Any]) -> base.Backend:
    from ranger_jax.env.backends import offline  # the sim engineer's module; imported when used

    return offline.OfflineBackend(options["world"])


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
    """A ToolEnv for a backend name (`"live"`, `"offline"`) or an environment file (`envs/savanna_sim.toml`).

    Args:
        name: backend name or path to a TOML environment file.
        **options: backend options (e.g. `world=DIR`, `serper_base_url=…`, `allow_hosts=("127.0.0.1:8080",)`),
            EnvConfig fields (e.g. `max_turns=5`) and reward keys; they override the file's values.

    Raises:
        ValueError: an unknown name, backend or option (naming the file and key where there is one), or a
            missing required option.
        FileNotFoundError: a `.toml` path that does not exist.
    """
    name = os.fspath(name)
    backend_options: dict[str, Any] = {}
    env_values: dict[str, Any] = {}
    rewards: dict[str, Any] = {}
    if name in BACKENDS:
        backend, where = name, f"env {name!r}"
        spec = _spec(backend, where)
    elif name.endswith(".toml") or Path(name).is_file():
        env_file = config_lib.load_env_file(name)
        backend, where = env_file.backend, env_file.path
        spec = _spec(backend, where)
        for key in env_file.backend_options:
            if key not in spec.keys:
                raise ValueError(f"{where}: unknown key {key!r} in [backend_options] for backend {backend!r}; "
                                 f"known keys: {list(spec.keys)}")
        backend_options.update(env_file.backend_options)
        env_values.update(env_file.env)
        rewards.update(env_file.rewards)
    else:
        raise ValueError(f"unknown environment {name!r}; use one of {sorted(BACKENDS)} or a path to an "
                         "envs/*.toml file")
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
