"""One GRPO update of a round whose groups mostly have equal rewards: every batch run vs zero-advantage batches left out.

The round looks like a sim-tiny GRPO step (`accumulated_update.py`'s synthetic groups: `--groups` groups of
`--members`, a shared context of `--context` tokens with `--images` images, then a sampled turn each), with a share
`--zero-share` of the groups given advantage 0 — in sim-tiny's runs 62-78% of a round's groups have all rewards
equal. As the data pipeline packs them (`zero_advantage_apart`), groups with a signal come first and the zero ones
fill batches of their own, `--batch-groups` groups a batch. "all" runs every batch (`Learner.accumulated_step`),
"skip" leaves the zero batches' forward and backward out (`skip_zero_advantage=True`). Both sides alternate in one
process from the same weights; the parameters after the update must be equal.

    python benchmarks/zero_advantage_skip.py [--groups 120] [--zero-share 0.7] [--batch-groups 30] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shared_prefix_learner as groups_lib  # noqa: E402  (the same synthetic groups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=120)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--batch-groups", type=int, default=30, help="groups per batch of the accumulated update")
    parser.add_argument("--zero-share", type=float, default=0.7, help="share of groups whose advantages are all 0")
    parser.add_argument("--context", type=int, default=760, help="shared tokens per group (images included)")
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--sampled", type=int, default=32, help="mean sampled tokens per member")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if not 0.0 <= args.zero_share <= 1.0:
        parser.error(f"--zero-share must be in [0, 1]; got {args.zero_share}")

    import jax

    from ranger_jax.data import batching, shared_prefix
    from ranger_jax.models import qwen3_vl
    from ranger_jax.rl import learner as learner_lib
    from ranger_jax.rl import learner_config, tiny_policy

    units = groups_lib.groups(np.random.default_rng(0), args)
    zero = int(round(args.zero_share * len(units)))
    units = units[zero:] + [[{**row, "advantage": np.float32(0.0)} for row in unit] for unit in units[:zero]]
    per_batch = args.batch_groups
    spec = batching.BatchSpec(batch_size=per_batch * args.members, length_buckets=(256, 512, 640, 896, 1152, 2048),
                              pad_id=groups_lib.IDS.pad_id, image_pad_id=groups_lib.IDS.image_pad_id,
                              patch_step=1024, image_step=8, prefix_rows=per_batch, suffix_buckets=(64, 128, 256))
    signal = len(units) - zero  # the pipeline never mixes the two kinds in a batch
    chunks = [units[i:min(i + per_batch, signal)] for i in range(0, signal, per_batch)]
    chunks += [units[i:i + per_batch] for i in range(signal, len(units), per_batch)]
    batches = [shared_prefix.collate_shared(chunk, spec) for chunk in chunks]
    config = learner_config.LearnerConfig(objective="grpo", learning_rate=1e-4, schedule="constant",
                                          old_logp="learner", agg="seq-mean-token-mean", tis_cap=2.0)
    model_config = tiny_policy.model_config(groups_lib.IDS)
    times: dict[str, list[float]] = {"all": [], "skip": []}
    params: dict[str, np.ndarray] = {}
    skipped = 0.0
    for repeat in range(args.repeats + 1):  # the first pass compiles
        for mode in ("all", "skip"):
            learner = learner_lib.Learner(qwen3_vl.init(model_config, seed=0), config)
            start = time.perf_counter()
            metrics = learner.accumulated_step(batches, skip_zero_advantage=mode == "skip")
            jax.block_until_ready(learner.state.params)
            if repeat:
                times[mode].append(time.perf_counter() - start)
            else:
                params[mode] = np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(learner.state.params)])
            skipped = metrics.get("skipped_batches", skipped)
    difference = float(np.abs(params["all"] - params["skip"]).max())
    median = {mode: statistics.median(t) for mode, t in times.items()}
    speedup = median["all"] / median["skip"]
    print(f"{len(batches)} batches ({zero} of {len(units)} groups with advantage 0), {int(skipped)} left out; "
          f"parameters after the update: max |skip - all| = {difference:.2e}")
    print(f"median update: all {median['all']:.2f} s, skip {median['skip']:.2f} s: {speedup:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"speedup": speedup, "median_update_s": median, "skipped_batches": skipped,
                       "batches": len(batches), "max_parameter_difference": difference, "args": vars(args)}, f,
                      indent=2)


if __name__ == "__main__":
    main()
