"""Presets of the GRPO main job (`recipes/grpo_savanna.py --preset NAME`) and their checks.

- `sim-tiny`: the whole method on 2 CPU cores in about 20 minutes on a fast day, 28-34 on a slow one
  (`rl.sim_tiny`; each SFT extension adds 5-8).
- `savanna-8b-tpu`, `savanna-8b-gpu`: GRPO of Qwen3-VL-8B (after SFT, e.g. Gen-Searcher-SFT-8B or
  `recipes/sft_ranger.py`) on the live web with Gen-Searcher's hyperparameters: G = 6 samples for 8 prompts a step,
  lr 1e-6 constant, weight decay 0.01, gradient clip 1.0, ε 0.2 / 0.28, dual clip 3.0, "seq-mean-token-sum",
  rollouts at temperature 0.7 / top-p 0.95 with 4096 new tokens a turn and 36000 tokens an episode, bf16
  compute with full remat, frozen vision tower. Rewards come from the env's judge settings (SGLang image
  generator + OpenAI-compatible judge); search from Serper.

`check(preset, options)` lists everything missing (checkpoint folder, task file, API keys, endpoints, devices for
the mesh) so a run fails in its first second with all problems named; `plan(...)` is the `--dry-run` text.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any

from ranger_jax.rl import learner_config

GEN_SEARCHER_GRPO = learner_config.LearnerConfig(
    objective="grpo", learning_rate=1e-6, schedule="constant", weight_decay=0.01, max_grad_norm=1.0,
    clip_low=0.2, clip_high=0.28, clip_dual=3.0, agg="seq-mean-token-sum", old_logp="learner", tis_cap=2.0,
    dtype="bfloat16", remat="full", freeze_vision=True, temperature=0.7)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScalePreset:
    """A real GRPO configuration for Qwen3-VL-8B on a pod or a GPU cluster."""

    name: str
    platform: str  # "tpu" | "gpu": what jax.devices() must report
    mesh: tuple[int, int, int]  # ("data", "fsdp", "tensor") sizes; -1 fills with the remaining devices
    env_file: str = "savanna_live"  # a shipped environment (ranger_jax/env/configs/) or a .toml path
    learner: learner_config.LearnerConfig = GEN_SEARCHER_GRPO
    group_size: int = 6  # G
    prompts_per_step: int = 8
    num_steps: int = 200
    temperature: float = 0.7
    top_p: float = 0.95
    max_new_tokens: int = 4096
    max_context_tokens: int = 36_000
    min_pixels: int = 32 * 32
    max_pixels: int = 160_000
    actors: int = 2  # rollout actor processes (JAX sampler on their own devices, or SGLang clients)
    max_staleness: int = 2
    checkpoint_every: int = 10  # rounds between learner checkpoints (a rerun of --out resumes from the latest)

    def __post_init__(self):
        if self.learner.temperature != self.temperature:
            raise ValueError(f"preset {self.name!r}: the learner's temperature ({self.learner.temperature}) must be "
                             f"the rollout temperature ({self.temperature}), or its ratios compare two distributions")


PRESETS: dict[str, ScalePreset] = {
    "savanna-8b-tpu": ScalePreset(name="savanna-8b-tpu", platform="tpu", mesh=(1, -1, 4)),
    "savanna-8b-gpu": ScalePreset(name="savanna-8b-gpu", platform="gpu", mesh=(1, -1, 1)),
}
NAMES = ("sim-tiny", *PRESETS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScaleOptions:
    """What a scale run needs from its user (flags of `recipes/grpo_savanna.py`)."""

    checkpoint: str | None = None  # HF Qwen3-VL-8B folder after SFT (config.json, safetensors, tokenizer.json)
    tasks: str | None = None  # RL task file: Gen-Searcher rl_data.json / parquet, KnowGen JSON(L), Savanna JSONL
    out: str = "runs/grpo"
    sglang_urls: tuple[str, ...] = ()  # policy servers for SGLang actors (each loads every published version);
    # empty = JAX actors on local devices


def _env_settings(env_file: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """([backend_options], [rewards]) of an environment (a shipped name or a .toml path)."""
    from ranger_jax.env import config as config_lib
    from ranger_jax.env import registry

    settings = config_lib.load_env_file(registry.find_env_file(env_file))
    return settings.backend_options, settings.rewards


def _key_variables(backend_options: dict[str, Any], rewards: dict[str, Any]) -> list[tuple[str, str]]:
    """(environment variable, what its key is for) of every service key the environment's settings name."""
    from ranger_jax.env.backends import serper

    keys = [(backend_options.get("serper_api_key_env", serper.API_KEY_ENV), "live text and image search")]
    for setting, what in (("judge_api_key_env", "the reward's judge"), ("generator_api_key_env", "the generator")):
        if rewards.get(setting):
            keys.append((rewards[setting], what))
    return keys


def check(preset: ScalePreset, options: ScaleOptions, *, environ: dict[str, str] | None = None,
          devices: list[Any] | None = None) -> list[str]:
    """Everything that stops `preset` from running with `options`, each named (empty: ready to run)."""
    environ = dict(os.environ if environ is None else environ)
    problems = []
    if not options.checkpoint:
        problems.append("--checkpoint: the Qwen3-VL-8B checkpoint folder to start from is required")
    elif not (Path(options.checkpoint) / "config.json").is_file():
        problems.append(f"--checkpoint {options.checkpoint}: no config.json there (an HF-layout Qwen3-VL folder)")
    elif not (Path(options.checkpoint) / "tokenizer.json").is_file():
        problems.append(f"--checkpoint {options.checkpoint}: no tokenizer.json there")
    if not options.tasks:
        problems.append("--tasks: the RL task file is required (rl_data.json, parquet, KnowGen JSON or JSONL)")
    elif not Path(options.tasks).is_file():
        problems.append(f"--tasks {options.tasks}: no such file")
    try:
        backend_options, rewards = _env_settings(preset.env_file)
    except (OSError, ValueError) as err:
        problems.append(f"env {preset.env_file}: {err}")
    else:
        for key in ("judge_url", "judge_model", "generator_url"):
            if not rewards.get(key):
                problems.append(f"{preset.env_file} [rewards] {key} is not set (the judged reward needs it)")
        for variable, what in _key_variables(backend_options, rewards):
            if not environ.get(variable):
                problems.append(f"${variable} is not set ({what}; named by env {preset.env_file})")
    if devices is None:
        import jax

        devices = jax.devices()
    platforms = {d.platform for d in devices}
    if preset.platform not in platforms:
        problems.append(f"preset {preset.name} runs on {preset.platform}; this process sees {sorted(platforms)}")
    fixed = 1
    for size in preset.mesh:
        fixed *= size if size > 0 else 1
    if len(devices) % fixed:
        problems.append(f"mesh {preset.mesh} needs a multiple of {fixed} devices; there are {len(devices)}")
    rows = preset.prompts_per_step * preset.group_size
    if rows % max(1, preset.mesh[0]):
        problems.append(f"{rows} rows a step do not split over data={preset.mesh[0]}")
    processes = len({getattr(d, "process_index", 0) for d in devices})
    if preset.prompts_per_step % processes:
        problems.append(f"{preset.prompts_per_step} GRPO groups a step do not split over {processes} learner "
                        "processes (each reads whole groups); change prompts_per_step or the slice")
    return problems


def plan(preset: ScalePreset, options: ScaleOptions) -> str:
    """What a run of `preset` would do, for `--dry-run`."""
    lr = preset.learner
    actor_kind = (f"SGLang policy servers {list(options.sglang_urls)}" if options.sglang_urls
                  else f"{preset.actors} JAX actor processes following the published weights")
    return "\n".join([
        f"preset {preset.name} on {preset.platform}, mesh (data, fsdp, tensor) = {preset.mesh}",
        f"policy: {options.checkpoint or '<--checkpoint missing>'} (bf16 compute, full remat, vision frozen)",
        f"tasks: {options.tasks or '<--tasks missing>'}; env {preset.env_file} (Serper search, judged reward)",
        f"GRPO: {preset.num_steps} steps x {preset.prompts_per_step} prompts x G={preset.group_size}; lr "
        f"{lr.learning_rate} {lr.schedule}, wd {lr.weight_decay}, clip {lr.max_grad_norm}, eps "
        f"{lr.clip_low}/{lr.clip_high}, dual {lr.clip_dual}, agg {lr.agg}, TIS cap {lr.tis_cap}",
        f"rollouts: {actor_kind}; temperature {preset.temperature}, top-p {preset.top_p}, "
        f"{preset.max_new_tokens} new tokens a turn, {preset.max_context_tokens} a trajectory, staleness <= "
        f"{preset.max_staleness} versions",
        f"output: {options.out}/ (weights/, grpo_shards/, metrics/, checkpoints/ every {preset.checkpoint_every} "
        "steps: running again with this --out resumes from the latest)",
    ])


def actor_commands(preset: ScalePreset, options: ScaleOptions, *, weights_dir: Path, shards_dir: Path,
                   metrics_dir: Path) -> tuple[list[list[str]], dict[str, Path]]:
    """The actor processes of a scale run and their metrics files (by shard prefix)."""
    import sys

    commands, metrics = [], {}
    servers = options.sglang_urls or (None,) * preset.actors
    for i, url in enumerate(servers):
        prefix = f"actor{i}"
        metrics[prefix] = metrics_dir / f"{prefix}.jsonl"
        command = [sys.executable, "-m", "ranger_jax.rollout.actor", "--env", preset.env_file, "--tasks",
                   str(options.tasks), "--out", str(shards_dir), "--prefix", prefix, "--group-size",
                   str(preset.group_size), "--tasks-per-round", str(max(1, preset.prompts_per_step // len(servers))),
                   "--temperature", str(preset.temperature), "--top-p", str(preset.top_p), "--max-new-tokens",
                   str(preset.max_new_tokens), "--max-context-tokens", str(preset.max_context_tokens),
                   "--min-pixels", str(preset.min_pixels), "--max-pixels", str(preset.max_pixels), "--seed", str(i),
                   "--run-id", f"grpo{i}", "--metrics", str(metrics[prefix]), "--quiet"]
        if url is None:
            command += ["--policy", "jax", "--weights-dir", str(weights_dir)]
        else:
            command += ["--policy", "sglang", "--sglang-url", url, "--tokenizer", str(options.checkpoint)]
        commands.append(command)
    return commands, metrics


def run_scale(preset: ScalePreset, options: ScaleOptions, *, progress: bool = True) -> dict[str, Any]:
    """GRPO of the checkpoint with the preset (call `check` first); returns the loop's result as a dict."""
    from ranger_jax.data import batching
    from ranger_jax.models import qwen3_vl
    from ranger_jax.parallel import mesh as mesh_lib
    from ranger_jax.processing import tokenizer as tokenizer_lib
    from ranger_jax.rl import grpo_loop, learner as learner_lib, metrics as metrics_lib
    from ranger_jax.rollout import sequence

    out = Path(options.out)
    import jax

    from ranger_jax.serving import weight_sync

    lead = jax.process_index() == 0  # with several learner processes, process 0 writes metrics
    data, fsdp, tensor = preset.mesh
    mesh = mesh_lib.make_mesh(data=data, fsdp=fsdp, tensor=tensor)
    model = qwen3_vl.load(options.checkpoint, mesh=mesh)
    tokenizer = tokenizer_lib.load_tokenizer(options.checkpoint)
    vision = sequence.VisionSettings(min_pixels=preset.min_pixels, max_pixels=preset.max_pixels)
    rows_per_process = preset.prompts_per_step * preset.group_size // jax.process_count()  # each reads its share
    spec = batching.BatchSpec.for_tokenizer(tokenizer, batch_size=rows_per_process,
                                            length_buckets=(8192, 16384, 36864), vision=vision)
    learner = learner_lib.Learner(model, preset.learner, mesh=mesh, checkpoint_dir=out / "checkpoints")
    commands, actor_metrics = actor_commands(preset, options, weights_dir=out / "weights",
                                             shards_dir=out / "grpo_shards", metrics_dir=out / "metrics")
    if lead and learner.checkpoints.latest_step() is None:  # an attempt stopped before its first checkpoint
        grpo_loop.clear_earlier_attempt([out / "weights", out / "grpo_shards", *actor_metrics.values()])
    # SGLang actors sample from servers that must load every published version
    sync = weight_sync.SGLangWeightSync(options.sglang_urls) if options.sglang_urls else None
    with metrics_lib.MetricsWriter(out / "metrics") if lead else contextlib.nullcontext() as metrics:
        result = grpo_loop.run(learner, shards_dir=out / "grpo_shards", weights_dir=out / "weights", spec=spec,
                               config=grpo_loop.GrpoLoopConfig(num_steps=preset.num_steps,
                                                               max_staleness=preset.max_staleness,
                                                               checkpoint_every=preset.checkpoint_every),
                               vision=vision, tokenizer_dir=options.checkpoint, actor_commands=commands,
                               actor_metrics=actor_metrics, metrics=metrics, progress=progress and lead,
                               after_publish=sync.update if sync is not None else None)
    learner.close()  # the loop saved the last step; this waits for the write
    return dataclasses.asdict(result)
