"""Is the GRPO gradient of a batch signal or noise? Agreement of batch gradients of a checkpoint on recorded groups.

    python -m ranger_jax.rollout.actor --env run/env.toml --world run/worlds/grpo-500 --policy jax \
        --checkpoint run/sft_policy --group-size 8 --limit 40 --temperature 1.0 --out /tmp/groups
    python evals/gradient_agreement.py --policy run/sft_policy --shards /tmp/groups --batch-size 32 --json out.json

Prints the mean cosine between batch gradients, the cosine between the two halves' summed gradients and the
gradient noise scale (rows per batch at which signal equals noise; `ranger_jax.rl.diagnostics`). Nothing is updated.
"""

from __future__ import annotations

import argparse
import json

from ranger_jax import fileio
from ranger_jax.rl import diagnostics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--policy", required=True, help="checkpoint folder (HF layout with tokenizer.json)")
    parser.add_argument("--shards", required=True, help="folder of trajectory shards holding whole GRPO groups")
    parser.add_argument("--batch-size", type=int, default=32, help="rows (episodes) per batch")
    parser.add_argument("--max-batches", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0, help="order of the groups")
    parser.add_argument("--temperature", type=float, default=1.0, help="the rollouts' sampling temperature")
    parser.add_argument("--advantages", choices=("group", "prefix-tree"), default="group",
                        help="one GRPO advantage per episode, or per token from the group's shared prefixes")
    parser.add_argument("--json", help="write the statistics here")
    args = parser.parse_args()
    try:
        result = diagnostics.measure_policy(args.policy, args.shards, batch_size=args.batch_size, seed=args.seed,
                                            max_batches=args.max_batches,
                                            temperature=args.temperature, advantages=args.advantages)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"gradient_agreement: {err}") from err
    out = result.as_dict()
    if args.json:
        fileio.write_atomic(args.json, (json.dumps(out, indent=2) + "\n").encode())
    for key, value in out.items():
        print(f"{key:>22}: {value}")


if __name__ == "__main__":
    main()
