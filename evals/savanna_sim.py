"""Savanna search eval in the offline world, scored exactly (no judge).

    python -m ranger_jax.env.sim.build --out /tmp/world --tasks 40 --seed 3
    python evals/savanna_sim.py --world /tmp/world --policy expert --json /tmp/expert.json

Writes the summary of `ranger_jax.env.sim.savanna.evaluate` (search_score overall, per domain and per
subcategory, crop IoU / text score / reward means, terminations, one row per episode) and prints a table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ranger_jax import fileio
from ranger_jax.env.sim import savanna


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--world", required=True, help="world directory (ranger_jax.env.sim.build)")
    parser.add_argument("--policy", required=True, choices=sorted(savanna.POLICIES))
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--env", default="offline",
                        help='"offline" or an environment file such as envs/savanna_sim.toml')
    parser.add_argument("--limit", type=int, default=None, help="run only the first N tasks")
    args = parser.parse_args()
    try:
        result = savanna.evaluate(args.world, args.policy, env_name=args.env, limit=args.limit, progress=True)
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
