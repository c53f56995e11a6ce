"""Environment settings: the `EnvConfig` dataclass, reward settings, and the environment file (TOML) format.

An environment file names a backend and sets options in three tables; `env.make(name_or_path, **options)` reads
it and lets keyword options override it. The files shipped with the library live in `ranger_jax/env/configs/`
(`env.env_files()`, addressed by name: `env.make("savanna_sim", world=...)`):

    description = "…"            # free text
    backend = "offline"           # or "live"
    [backend_options]             # keys of the chosen backend (e.g. world, serper_base_url, cache_dir)
    [env]                         # EnvConfig fields: tools, limits, image store, summariser
    [rewards]                     # REWARD_KEYS: read by the reward code, not by the tool loop

A wrong or unknown key is an error naming the file, the key and the known keys.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from ranger_jax.env import images, tools

FILE_KEYS = ("description", "backend", "backend_options", "env", "rewards")

# Reward settings an environment may carry, read by `ToolEnv.score` (ranger_jax.rewards.env_reward). The upper
# limit on an answer's references is not among them: it is the env's `max_answer_refs`, which the system prompt
# states, the answer parser applies and the reward checks.
REWARD_KEYS: dict[str, type | tuple[type, ...]] = {
    "kind": str,  # "sim" (exact offline rewards, env.sim.rewards; the default) or "judge" (generator + judges)
    "text_coef": (int, float),  # α in R = (1 - α)·R_image + α·R_text (rewards.combine); 0 when unset
    "min_references": int,  # fewer references → reward 0 (Gen-Searcher's GEN_MIN_INPUT_IMAGES = 1)
    "coverage_min": (int, float),  # sim: fraction of the target box a reference must contain
    "share_min": (int, float),  # sim: fraction of the reference the target must fill
    "rival_max": (int, float),  # sim: a sibling this large relative to the target makes it ambiguous
    "judge_url": str,  # judge: OpenAI-compatible base URL incl. /v1
    "judge_model": str,
    "judge_api_key_env": str,  # judge: environment variable holding its bearer key (unset: no key is sent)
    "generator_kind": str,  # judge: "sglang" (SGLang images API, the default) or "gen_searcher" (its /generate)
    "generator_url": (str, list),  # judge: service root; gen_searcher also takes a list of roots
    "generator_model": str,
    "generator_api_key_env": str,  # judge, sglang generator: environment variable holding its bearer key
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvConfig:
    """Tools and limits of one `ToolEnv` (defaults follow Gen-Searcher's agent loop)."""

    tools: tuple[str, ...] = tools.TOOL_NAMES  # enabled tools, canonical names
    # system prompt: "full" (rules + JSON tool schemas), "compact" (small policies) or "date" (only today's date, for
    # policies trained from scratch)
    prompt_style: str = "full"
    show_links: bool = True  # URLs in search results; without web_fetch they are only noise to a small policy
    max_turns: int = 9  # policy turns before the forced final-answer turn
    final_answer_turn: bool = True  # after max_turns, one "FINAL STEP" turn (else the episode ends: max_turns)
    max_tool_calls: int = 8  # executed tool calls per episode; then the next turn is the final one
    max_images_per_turn: int = 5  # images attached to one observation (image_search top_k cap)
    max_queries: int = 3  # queries per text_search call
    max_response_chars: int | None = None  # longer policy turns are treated as truncated (None: no limit)
    max_observation_chars: int = 12_000  # tool output cut beyond this
    max_page_chars: int = 8_000  # web_fetch text per call without a summariser
    max_answer_refs: int = 5  # references an answer may cite (the prompt states it, parser and reward apply it)
    min_crop_side: int = images.DEFAULT_MIN_CROP_SIDE  # pixels
    image_store: str | None = None  # image folder (None: a temporary folder owned by the env)
    max_image_bytes: int = images.DEFAULT_MAX_IMAGE_BYTES  # encoded bytes of one image
    max_image_pixels: int = images.DEFAULT_MAX_IMAGE_PIXELS  # decompression-bomb guard (width × height)
    min_image_side: int = images.DEFAULT_MIN_IMAGE_SIDE  # smaller downloads are refused
    summarizer_url: str | None = None  # OpenAI-compatible base URL incl. /v1; None: web_fetch returns page text
    summarizer_model: str = "Qwen/Qwen3-VL-30B-A3B-Instruct"
    summarizer_api_key: str | None = None
    summarizer_max_tokens: int = 2048  # answer tokens per page chunk
    summarizer_chunk_chars: int = 200_000  # page characters per summariser call
    summarizer_max_retries: int = 2  # retries of one summariser call; on failure web_fetch returns page text
    summarizer_cache_dir: str | None = None

    def __post_init__(self):
        if self.prompt_style not in ("full", "compact", "date"):
            raise ValueError(f"prompt_style must be 'full', 'compact' or 'date'; got {self.prompt_style!r}")
        if isinstance(self.tools, str) or not isinstance(self.tools, (list, tuple)):
            raise ValueError(f"tools must be a list of tool names from {list(tools.TOOL_NAMES)}; got {self.tools!r}")
        object.__setattr__(self, "tools", tuple(self.tools))
        unknown = [t for t in self.tools if t not in tools.ALL_TOOL_NAMES]
        if unknown or not self.tools:
            raise ValueError(f"tools {list(self.tools)} must be a non-empty subset of {list(tools.ALL_TOOL_NAMES)}")
        if len(set(self.tools)) != len(self.tools):
            raise ValueError(f"tools {list(self.tools)} names a tool more than once")
        if not isinstance(self.final_answer_turn, bool):
            raise ValueError(f"final_answer_turn must be true or false; got {self.final_answer_turn!r}")
        for name in ("image_store", "summarizer_url", "summarizer_api_key", "summarizer_cache_dir"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ValueError(f"{name} must be a string or None; got {value!r}")
        if not isinstance(self.summarizer_model, str) or not self.summarizer_model:
            raise ValueError(f"summarizer_model must be a non-empty string; got {self.summarizer_model!r}")
        for name in ("max_turns", "max_tool_calls", "max_images_per_turn", "max_queries", "max_observation_chars",
                     "max_page_chars", "max_answer_refs", "min_crop_side", "max_image_bytes", "max_image_pixels",
                     "min_image_side", "summarizer_max_tokens", "summarizer_chunk_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if isinstance(self.summarizer_max_retries, bool) or not isinstance(self.summarizer_max_retries, int) \
                or self.summarizer_max_retries < 0:
            raise ValueError(f"summarizer_max_retries must be an integer >= 0; got {self.summarizer_max_retries!r}")
        if self.max_response_chars is not None and (isinstance(self.max_response_chars, bool)
                                                    or not isinstance(self.max_response_chars, int)
                                                    or self.max_response_chars < 1):
            raise ValueError(f"max_response_chars must be a positive integer or None; got {self.max_response_chars!r}")


ENV_KEYS = tuple(f.name for f in dataclasses.fields(EnvConfig))


REWARD_KINDS = ("sim", "judge")
GENERATOR_KINDS = ("sglang", "gen_searcher")
_ENV_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FRACTION_KEYS = ("coverage_min", "share_min", "rival_max")  # in (0, 1], as env.sim.rewards.Criteria checks
# Former reward keys and where their setting lives now (an old environment file gets told).
MOVED_REWARD_KEYS = {"max_references": "[env] max_answer_refs", "max_ref_images": "[env] max_answer_refs"}


def check_rewards(rewards: dict[str, Any], where: str) -> dict[str, Any]:
    """Validates reward settings (names, types and ranges).

    Raises:
        ValueError: naming `where`, the key and the known keys or the allowed range.
    """
    for key, value in rewards.items():
        if key in MOVED_REWARD_KEYS:
            raise ValueError(f"{where}: reward key {key!r} is gone; the limit on an answer's references is "
                             f"{MOVED_REWARD_KEYS[key]} (the prompt, the answer parser and the reward all use it)")
        if key not in REWARD_KEYS:
            raise ValueError(f"{where}: unknown reward key {key!r}; known keys: {sorted(REWARD_KEYS)}")
        expected = REWARD_KEYS[key]
        if isinstance(value, bool) or not isinstance(value, expected):
            raise ValueError(f"{where}: reward key {key!r} has the wrong type ({type(value).__name__}: {value!r})")
        if key == "kind" and value not in REWARD_KINDS:
            raise ValueError(f"{where}: reward kind {value!r} is not one of {list(REWARD_KINDS)}")
        if key == "text_coef" and not 0.0 <= value <= 1.0:
            raise ValueError(f"{where}: reward key 'text_coef' must be in [0, 1]; got {value!r}")
        if key in _FRACTION_KEYS and not 0.0 < value <= 1.0:
            raise ValueError(f"{where}: reward key {key!r} must be in (0, 1]; got {value!r}")
        if key == "min_references" and value < 0:
            raise ValueError(f"{where}: reward key 'min_references' must be >= 0; got {value!r}")
        if key == "generator_kind" and value not in GENERATOR_KINDS:
            raise ValueError(f"{where}: generator_kind {value!r} is not one of {list(GENERATOR_KINDS)}")
        if key.endswith("_api_key_env") and not _ENV_VAR.match(value):
            raise ValueError(f"{where}: reward key {key!r} must name an environment variable (e.g. \"OPENAI_API_KEY\", "
                             f"no $); got {value!r}")
        if key == "generator_url" and isinstance(value, list) and (
                not value or not all(isinstance(u, str) and u for u in value)):
            raise ValueError(f"{where}: reward key 'generator_url' must be a URL or a non-empty list of URLs; "
                             f"got {value!r}")
    kind = rewards.get("generator_kind", "sglang")
    if kind == "sglang" and isinstance(rewards.get("generator_url"), list):
        raise ValueError(f"{where}: generator_kind 'sglang' takes one generator_url; a list of URLs is for "
                         "'gen_searcher'")
    if kind == "gen_searcher" and rewards.get("generator_api_key_env"):
        raise ValueError(f"{where}: generator_kind 'gen_searcher' takes no API key (its /generate service has no "
                         "authentication); remove generator_api_key_env")
    return dict(rewards)


@dataclasses.dataclass(frozen=True)
class EnvFile:
    """The parsed content of an environment file."""

    path: str
    backend: str
    backend_options: dict[str, Any]
    env: dict[str, Any]
    rewards: dict[str, Any]
    description: str = ""


def _table(path: Path, data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"{path}: {key!r} must be a table ([{key}]); got {type(value).__name__}")
    return dict(value)


def load_env_file(path: str | Path) -> EnvFile:
    """Reads an environment file; key names of `[env]` and `[rewards]` are checked here, backend keys by `make`.

    Raises:
        FileNotFoundError: naming the path.
        ValueError: bad TOML or an unknown key, naming the file and the key.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"environment file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text("utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{path}: not valid TOML ({err})") from err
    for key in data:
        if key not in FILE_KEYS:
            raise ValueError(f"{path}: unknown key {key!r}; known top-level keys: {list(FILE_KEYS)}")
    backend = data.get("backend")
    if not isinstance(backend, str):
        raise ValueError(f"{path}: 'backend' must name a backend (e.g. \"offline\" or \"live\"); got {backend!r}")
    env = _table(path, data, "env")
    for key in env:
        if key not in ENV_KEYS:
            raise ValueError(f"{path}: unknown key {key!r} in [env]; known keys: {list(ENV_KEYS)}")
    rewards = check_rewards(_table(path, data, "rewards"), str(path))
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ValueError(f"{path}: 'description' must be a string")
    return EnvFile(path=str(path), backend=backend, backend_options=_table(path, data, "backend_options"),
                   env=env, rewards=rewards, description=description)


def env_config(values: dict[str, Any], where: str) -> EnvConfig:
    """An EnvConfig from option values (lists become tuples).

    Raises:
        ValueError: naming `where` and the problem.
    """
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    try:
        return EnvConfig(**values)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from err
