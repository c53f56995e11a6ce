"""The world and policy of the evaluation benchmarks beside it (`shared_trunk.py`, `continuous_batching.py`,
`active_rows.py`), which import it as the sibling module `eval_setup` (a script's own folder is first on
`sys.path`): `--world` and `--policy` name an existing world and checkpoint; without them a world of `--tasks`
tasks is built from `--seed` and a random `Qwen3VLConfig.tiny()` checkpoint written, both in a work folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ranger_jax.env.sim import build
from ranger_jax.rollout import actor

BUILT_TASKS = 24  # tasks of a built world


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds --world, --policy, --tasks and --seed."""
    parser.add_argument("--world", help="an existing world (default: build one of --tasks tasks)")
    parser.add_argument("--policy", help="a checkpoint folder (default: a random tiny one)")
    parser.add_argument("--tasks", type=int, default=None,
                        help=f"tasks to evaluate (default: every task of --world, or a built world of {BUILT_TASKS})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the built world")


def world_and_policy(args: argparse.Namespace, workdir: Path) -> tuple[Path, Path]:
    """The world and checkpoint folders the arguments name, or ones built in `workdir`."""
    world = Path(args.world) if args.world else build.build_world(workdir / "world", args.tasks or BUILT_TASKS,
                                                                  args.seed)
    checkpoint = Path(args.policy) if args.policy else actor.write_tiny_checkpoint(
        workdir / "tiny", actor.default_tokenizer_dir())
    return world, checkpoint
