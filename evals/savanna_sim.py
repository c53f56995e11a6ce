"""Savanna search eval in the offline world, scored exactly (no judge): a scripted agent or any checkpoint.

    python -m ranger_jax.env.sim.build --out /tmp/world --tasks 40 --seed 3
    python evals/savanna_sim.py --world /tmp/world --policy expert --json /tmp/expert.json
    python evals/savanna_sim.py --world /tmp/world --policy /ckpt/policy --json /tmp/policy.json

`--policy` is `expert`, `naive`, `finder` or a checkpoint folder (HF-layout Qwen3-VL with tokenizer.json), run
greedily through the JAX sampler with the env settings it was trained with (its `ranger_env.json`) unless `--env`
names others. Writes the summary of `ranger_jax.rollout.evaluate.evaluate` (search_score overall, per domain and
per subcategory, crop IoU / text score / reward means, terminations, one row per episode) and prints a table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ranger_jax import fileio
from ranger_jax.env.sim import savanna
from ranger_jax.rollout import evaluate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--world", required=True, help="world directory (ranger_jax.env.sim.build)")
    parser.add_argument("--policy", required=True,
                        help=f"one of {sorted(savanna.POLICIES)} or a checkpoint folder")
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--env", default=None, help='"offline", a shipped environment such as savanna_sim, '
                                                    "or a .toml environment file (default: a checkpoint's ranger_env.json, else offline)")
    parser.add_argument("--limit", type=int, default=None, help="run only the first N tasks")
    parser.add_argument("--concurrency", type=int, default=None, help="checkpoints: episodes in flight")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="checkpoints: tokens per turn")
    parser.add_argument("--max-context-tokens", type=int, default=None, help="checkpoints: tokens per episode")
    args = parser.parse_args()
    options = {key: value for key, value in (("concurrency", args.concurrency),
                                             ("max_new_tokens", args.max_new_tokens),
                                             ("max_context_tokens", args.max_context_tokens)) if value is not None}
    try:
        result = evaluate.evaluate(args.world, args.policy, env_name=args.env, limit=args.limit, progress=True,
                                   **options)
    except (ValueError, FileNotFoundError) as err:
        parser.error(str(err))
    fileio.write_atomic(Path(args.json), json.dumps(result, indent=2, ensure_ascii=False).encode("utf-8"))
    print(f"policy {result['policy']}  world {result['world']} (seed {result['seed']})  tasks {result['num_tasks']}")
    print(f"{'search_score':<28}{result['search_score']:.3f}")
    for domain, value in result["search_score_by_domain"].items():
        print(f"  {domain:<26}{value:.3f}  (n={result['num_tasks_by_domain'][domain]})")
    for key in ("crop_iou_mean", "text_score_mean", "reward_mean", "tool_calls_mean"):
        print(f"{key:<28}{result[key]:.3f}")
    print(f"{'terminations':<28}{result['terminations']}")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
