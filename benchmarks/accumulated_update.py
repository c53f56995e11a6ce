"""One GRPO update from a large round: in one batch, or accumulated over batches of a few groups; side by side.

The round looks like a sim-tiny GRPO step with the decision turn sampled alone: `--groups` groups of `--members`,
each repeating a context of `--context` tokens with `--images` images and then a sampled turn of ~`--sampled`
tokens, as shared-prefix batches (`data.shared_prefix`). "one" trains the round as one batch (`Learner.step`);
"accumulated" trains it as batches of `--batch-groups` groups that make the same one update
(`Learner.accumulated_step`). Each runs in its own process, whose peak resident memory is read when it exits; the
parameters after the first update are compared (they must agree to float32 rounding).

    python benchmarks/accumulated_update.py [--groups 120] [--members 8] [--batch-groups 30] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shared_prefix_learner as groups_lib  # noqa: E402  (the same synthetic groups)


def _child(args: argparse.Namespace) -> None:
    import jax

    from ranger_jax.data import batching, shared_prefix
    from ranger_jax.models import qwen3_vl
    from ranger_jax.rl import learner as learner_lib
    from ranger_jax.rl import learner_config, tiny_policy

    units = groups_lib.groups(np.random.default_rng(0), args)
    per_batch = args.groups if args.child == "one" else args.batch_groups
    spec = batching.BatchSpec(batch_size=per_batch * args.members, length_buckets=(256, 512, 640, 896, 1152, 2048),
                              pad_id=groups_lib.IDS.pad_id, image_pad_id=groups_lib.IDS.image_pad_id,
                              patch_step=1024, image_step=8, prefix_rows=per_batch, suffix_buckets=(64, 128, 256))
    batches = [shared_prefix.collate_shared(units[i:i + per_batch], spec) for i in range(0, len(units), per_batch)]
    config = learner_config.LearnerConfig(objective="grpo", learning_rate=1e-4, schedule="constant",
                                          old_logp="learner", agg="seq-mean-token-mean", tis_cap=2.0)
    model_config = tiny_policy.model_config(groups_lib.IDS)
    times, params = [], None
    for repeat in range(args.repeats + 1):  # a fresh learner each time: the same update from the same weights
        learner = learner_lib.Learner(qwen3_vl.init(model_config, seed=0), config)
        start = time.perf_counter()
        metrics = learner.accumulated_step(batches)
        jax.block_until_ready(learner.state.params)
        if repeat == 0:  # compiling
            params = np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(learner.state.params)])
        else:
            times.append(time.perf_counter() - start)
    np.save(args.out + ".npy", params)
    Path(args.out).write_text(json.dumps({"batches": len(batches), "loss": metrics["loss"],
                                          "median_update_s": statistics.median(times)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=120)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--batch-groups", type=int, default=30, help="groups per batch of the accumulated update")
    parser.add_argument("--context", type=int, default=760, help="shared tokens per group (images included)")
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--sampled", type=int, default=32, help="mean sampled tokens per member")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--child", choices=["one", "accumulated"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("one", "accumulated"):
            out = os.path.join(tmp, mode)
            command = [sys.executable, __file__, "--child", mode, "--out", out] + [
                f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                if k not in ("child", "out", "json") and v is not None]
            proc = subprocess.Popen(command)
            _, status, usage = os.wait4(proc.pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit(f"the {mode!r} run failed (exit {os.waitstatus_to_exitcode(status)})")
            figures[mode] = {**json.loads(Path(out).read_text()), "peak_rss_gb": usage.ru_maxrss / 2 ** 20,
                             "params": np.load(out + ".npy")}
    one, acc = figures["one"], figures["accumulated"]
    difference = float(np.abs(one.pop("params") - acc.pop("params")).max())
    print(f"parameters after the update: max |accumulated - one batch| = {difference:.2e}; loss {one['loss']:.6f} "
          f"vs {acc['loss']:.6f}")
    for name, row in figures.items():
        print(f"{name:>11}: {row['batches']} batch(es), peak memory {row['peak_rss_gb']:.2f} GB, median update "
              f"{row['median_update_s']:.2f} s")
    memory_ratio = one["peak_rss_gb"] / acc["peak_rss_gb"]
    time_ratio = acc["median_update_s"] / one["median_update_s"]
    print(f"accumulated over {acc['batches']} batches: {memory_ratio:.2f}x less peak memory, {time_ratio:.2f}x the "
          f"update time ({args.groups} groups x {args.members} members, context {args.context} tokens)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"memory_ratio": memory_ratio, "time_ratio": time_ratio, "max_parameter_difference": difference,
                       "runs": figures, "args": {k: v for k, v in vars(args).items() if k not in ("child", "out")}},
                      f, indent=2)


if __name__ == "__main__":
    main()
