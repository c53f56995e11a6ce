"""The finished samples as datasets: a held-out benchmark, an RL prompt set and an SFT set, in published formats.

Each kept sample (a prompt, its ground-truth image, its teacher trajectory) goes to exactly one split. The benchmark
takes `benchmark_size` samples, dealt round-robin over the categories (each category's samples in a seeded hash
order), as KnowGen is balanced over its categories; of the rest, `rl_fraction` go to RL and the others to SFT
(Gen-Searcher: 10k SFT, 6k RL). Under `<run>/splits/` (written to a temporary folder and renamed into place):

    benchmark/KnowGen-Bench.json   JSON array of {"id", "prompt", "meta": {"category", …}, "gt_image", "today"}
    benchmark/images/<id>.png      its ground-truth images (paths relative to the file, as KnowGen_Eval reads them)
    rl/rl_data.json                Gen-Searcher's RL rows {"id", "prompt", "gt_image"} plus "meta" and "today"
    rl/images/<id>.png
    sft/shards/sft-*.array_record  the SFT samples' trajectories, as the learner's SFT reads them
    sft/sharegpt/                  the same as a LLaMA-Factory dataset (`gen_sft`, see `sft_export`)
    benchmark/world/, rl/world/    offline runs only: the split as an offline world (exact ground truth)
    splits.json                    the ids of each split and the sizes

All of them load with `data.load_tasks` (the JSON files, `sft/sharegpt/dataset_info.json`, the world folders) and
`rl.sft.dataset_for` (the shards and the ShareGPT dataset).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ranger_jax.data import trajectory as trajectory_lib
from ranger_jax.datagen import ledger, records, sft_export, world_tasks
from ranger_jax.env.sim import world as world_lib

SPLITS = ("benchmark", "rl", "sft")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SplitConfig:
    """How samples are dealt to the splits."""

    benchmark_size: int = 100  # held-out samples (KnowGen: 630)
    rl_fraction: float = 0.375  # share of the rest that goes to RL (Gen-Searcher: 6k of 16k)
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.benchmark_size, bool) or not isinstance(self.benchmark_size, int) or self.benchmark_size < 0:
            raise ValueError(f"SplitConfig.benchmark_size must be an int >= 0, got {self.benchmark_size!r}")
        if not 0.0 <= self.rl_fraction <= 1.0:
            raise ValueError(f"SplitConfig.rl_fraction must be in [0, 1], got {self.rl_fraction!r}")


@dataclasses.dataclass(frozen=True)
class Sample:
    """One finished sample: its prompt, ground-truth image file and teacher trajectory."""

    prompt: records.Prompt
    image: Path
    trajectory: trajectory_lib.Trajectory


def _order(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}|{key}".encode("utf-8")).hexdigest()


def assign(prompts: Sequence[records.Prompt], config: SplitConfig) -> dict[str, list[str]]:
    """{split: prompt ids}: the benchmark round-robin over categories, the rest by `rl_fraction` (module docstring)."""
    by_category: dict[str, list[records.Prompt]] = collections.defaultdict(list)
    for prompt in prompts:
        by_category[prompt.category or prompt.subcategory].append(prompt)
    queues = {c: sorted(ps, key=lambda p: _order(config.seed, p.id)) for c, ps in sorted(by_category.items())}
    benchmark: list[str] = []
    while len(benchmark) < config.benchmark_size and any(queues.values()):
        for category in sorted(queues):
            if queues[category] and len(benchmark) < config.benchmark_size:
                benchmark.append(queues[category].pop(0).id)
    rest = sorted((p for q in queues.values() for p in q), key=lambda p: _order(config.seed + 1, p.id))
    num_rl = round(config.rl_fraction * len(rest))
    return {"benchmark": benchmark, "rl": [p.id for p in rest[:num_rl]], "sft": [p.id for p in rest[num_rl:]]}


def _task_rows(samples: Sequence[Sample], folder: Path, *, gen_searcher: bool) -> list[dict[str, Any]]:
    rows = []
    (folder / "images").mkdir(parents=True, exist_ok=True)
    for sample in samples:
        relative = f"images/{sample.prompt.id}.png"
        shutil.copyfile(sample.image, folder / relative)
        row = {"id": sample.prompt.id, "prompt": sample.prompt.prompt, "gt_image": relative,
               "today": sample.prompt.today, "meta": sample.prompt.meta()}
        rows.append(row if not gen_searcher else {"id": row["id"], "prompt": row["prompt"], "gt_image": relative,
                                                   "meta": row["meta"], "today": row["today"]})
    return rows


def write_splits(run_dir: str | Path, samples: Sequence[Sample], config: SplitConfig = SplitConfig(), *,
                 world: world_lib.World | None = None) -> dict[str, Any]:
    """Writes `<run>/splits/` (module docstring); returns the summary written to `splits.json`.

    Args:
        run_dir: the run's folder.
        samples: the finished samples (ids unique).
        config: sizes and seed.
        world: offline runs: the world the prompts come from (the splits are written as worlds too).
    """
    by_id = {s.prompt.id: s for s in samples}
    ids = assign([s.prompt for s in samples], config)

    def build(folder: Path) -> dict[str, Any]:
        chosen = {name: [by_id[i] for i in ids[name]] for name in SPLITS}
        ledger.write_json(folder / "benchmark" / "KnowGen-Bench.json",
                          _task_rows(chosen["benchmark"], folder / "benchmark", gen_searcher=False), indent=None)
        ledger.write_json(folder / "rl" / "rl_data.json", _task_rows(chosen["rl"], folder / "rl", gen_searcher=True),
                          indent=None)
        shard_paths = sft_export.export_shards([s.trajectory for s in chosen["sft"]], folder / "sft" / "shards") \
            if chosen["sft"] else []
        exported = sft_export.export_sharegpt([s.trajectory for s in chosen["sft"]], folder / "sft" / "sharegpt")
        if world is not None:
            for name in ("benchmark", "rl"):
                world_tasks.write_world_view(world.root, folder / name / "world",
                                             [world_tasks.task_row(world, s.prompt) for s in chosen[name]])
        summary = {"sizes": {name: len(chosen[name]) for name in SPLITS}, "ids": ids,
                   "sft_shards": [p.name for p in shard_paths], "sharegpt": exported,
                   "categories": {name: dict(collections.Counter(s.prompt.category for s in chosen[name]))
                                  for name in SPLITS}}
        ledger.write_json(folder / "splits.json", summary)
        return summary

    return sft_export.replace_folder(Path(run_dir) / "splits", build)

