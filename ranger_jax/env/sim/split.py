"""Train / held-out worlds that cannot share a target, whatever their seeds and sizes.

A world's families are drawn before its tasks, so two worlds of one seed share their first targets, and worlds
of different seeds could, by chance, draw the same family name. A split closes both doors by construction: every
made-up word a world draws (family names and makers) belongs to exactly one side, decided by a hash of the word
alone, and a world built for one side draws only that side's words. A target is its family's newest release, so
a held-out target's family never appears in any training world:

    from ranger_jax.env.sim import split
    dirs = split.build_split(ROOT, num_train=200, num_heldout=100, seed=0)   # ROOT/train, ROOT/heldout
    split.check_disjoint(dirs["train"], dirs["heldout"])                   # raises if a family is shared

`build.build_world(..., split="train")` builds one side alone (any seed); its `world.json` records the side.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SPLITS = ("train", "heldout")
HELDOUT_SHARE = 0.25  # share of the word space that belongs to held-out worlds


def side_of(word: str) -> str:
    """The side ("train" or "heldout") a made-up word belongs to: a fixed hash of the word, case-insensitive."""
    digest = hashlib.sha256(f"split:{word.lower()}".encode()).digest()
    return "heldout" if int.from_bytes(digest[:4], "big") < HELDOUT_SHARE * 2**32 else "train"


def accepts(split: str | None):
    """The word filter of a split side for `catalog.make_word` (None: every word).

    Raises:
        ValueError: naming the side when it is not one of SPLITS.
    """
    if split is None:
        return None
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)} or None; got {split!r}")
    return lambda word: side_of(word) == split


def families(world_dir: str | Path) -> set[str]:
    """The family names of a world's tasks' targets and their siblings (first word of each family name)."""
    from ranger_jax.env.sim import world

    the_world = world.load_world(world_dir)
    return {e.family.split()[0] for e in the_world.entities.values()}


def check_disjoint(train_dir: str | Path, heldout_dir: str | Path) -> None:
    """Checks that two worlds share no family (so no target and no sibling).

    Raises:
        ValueError: naming the shared families.
    """
    shared = families(train_dir) & families(heldout_dir)
    if shared:
        raise ValueError(f"worlds {train_dir} and {heldout_dir} share {len(shared)} families: {sorted(shared)[:10]}")


def build_split(root: str | Path, *, num_train: int, num_heldout: int, seed: int, world_version: int = 2,
                progress: bool = False) -> dict[str, Path]:
    """Builds ROOT/train and ROOT/heldout, worlds of `num_train` and `num_heldout` tasks on the two sides.

    Both sides may use the same seed: their word spaces are disjoint, so no family is shared (see the module
    docstring). Returns {"train": path, "heldout": path}.

    Raises:
        ValueError: as `build.build_world` does (task counts, output folders).
    """
    from ranger_jax.env.sim import build

    root = Path(root)
    return {side: build.build_world(root / side, num, seed, world_version=world_version, split=side,
                                    progress=progress)
            for side, num in (("train", num_train), ("heldout", num_heldout))}
