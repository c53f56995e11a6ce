"""sim-tiny's pure-Python stages (building the worlds, the teacher's episodes for the tokenizer and for the SFT data)
in this process against worker processes: side by side, with the outputs compared.

    python benchmarks/worker_stages.py [--seed 0] [--workers 0] [--sft-worlds 12] [--json OUT]

Runs `sim_tiny.build_worlds`, `train_tokenizer` and `record_teacher` of the default config twice into temporary
folders: with `workers=1` (every job in this process, as before `SimTinyConfig.workers` existed) and with
`--workers` (0: one per usable core) sharing one `process_pool.JobPool`. Prints each stage's seconds, the
speed-up, and whether the two produced the same worlds and tokenizer (byte for byte) and the same teacher
episodes (token ids, masks, images and rewards; only their wall-clock timings differ).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

from ranger_jax import fileio, process_pool
from ranger_jax.data import shards
from ranger_jax.rl import sim_tiny

STAGES = ("worlds", "tokenizer", "teacher")


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _episodes(folder: Path) -> list:
    """The recorded episodes without their wall-clock timings, in shard order."""
    return [t.without_timings() for path in shards.list_shards(folder) for t in shards.read_shard(path)]


def stages(config: sim_tiny.SimTinyConfig, root: Path) -> dict:
    """The three stages into `root` on one pool of `config.workers` processes: seconds per stage and the outputs."""
    seconds = {}

    def timed(stage: str, fn, *args, **kwargs):
        started = time.perf_counter()
        result = fn(*args, **kwargs)
        seconds[stage] = round(time.perf_counter() - started, 2)
        return result

    with process_pool.JobPool(config.workers) as pool:
        worlds = timed("worlds", sim_tiny.build_worlds, config, root / "worlds", pool=pool)
        tokenizer = timed("tokenizer", sim_tiny.train_tokenizer, config, worlds["sft"], root / "tokenizer", pool=pool)
        stats = timed("teacher", sim_tiny.record_teacher, config, worlds["sft"], tokenizer, root / "sft_data",
                      pool=pool)
    return {"seconds": {**seconds, "total": round(sum(seconds.values()), 2)}, "stats": stats,
            "outputs": (_files(root / "worlds"), _files(root / "tokenizer"), _episodes(root / "sft_data"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="run seed (the worlds' seeds derive from it)")
    parser.add_argument("--workers", type=int, default=0, help="worker processes (0: one per usable core)")
    parser.add_argument("--sft-worlds", type=int, default=sim_tiny.SimTinyConfig.sft_worlds, help="SFT worlds")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.workers < 0 or args.sft_worlds < 1:
        parser.error(f"--workers must be >= 0 and --sft-worlds >= 1; got {args.workers} and {args.sft_worlds}")
    config = sim_tiny.configure(seed=args.seed, overrides={"sft_worlds": args.sft_worlds, "progress": False})
    workers = process_pool.auto_workers(args.workers)
    with tempfile.TemporaryDirectory(prefix="worker_stages_") as tmp:
        one = stages(dataclasses.replace(config, workers=1), Path(tmp) / "one")
        many = stages(dataclasses.replace(config, workers=workers), Path(tmp) / "many")
    same = {name: a == b for name, a, b in zip(("worlds", "tokenizer", "teacher_episodes"), one["outputs"],
                                                many["outputs"])}
    out = {"seed": args.seed, "workers": workers, "cpu_count": os.cpu_count(), "sft_worlds": args.sft_worlds,
           "one_process_s": one["seconds"], "workers_s": many["seconds"],
           "speedup": round(one["seconds"]["total"] / many["seconds"]["total"], 3), "same": same,
           "teacher": many["stats"]}
    print(f"seed {args.seed}, {args.sft_worlds} SFT worlds, {workers} workers")
    for stage in (*STAGES, "total"):
        a, b = one["seconds"][stage], many["seconds"][stage]
        print(f"  {stage:10s} one process {a:7.1f} s   workers {b:7.1f} s   x{a / b:.2f}")
    print(f"  same outputs: {', '.join(f'{k} {v}' for k, v in same.items())}")
    if args.json:
        fileio.write_atomic(args.json, json.dumps(out, indent=2).encode("utf-8"))


if __name__ == "__main__":
    main()
