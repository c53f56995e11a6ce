"""Train / held-out worlds share no family, by construction, whatever their seeds and sizes."""

from __future__ import annotations

import pytest

from ranger_jax.env.sim import build, load_world, split, world


def test_sides_partition_the_word_space():
    words = [f"Word{i}" for i in range(2000)]
    sides = [split.side_of(w) for w in words]
    assert set(sides) == {"train", "heldout"}
    assert abs(sides.count("heldout") / len(sides) - split.HELDOUT_SHARE) < 0.05
    assert [split.side_of(w.upper()) for w in words] == sides  # a fixed function of the word alone


@pytest.mark.parametrize("version", [1, 2])
def test_same_seed_sides_share_no_family(tmp_path, version):
    dirs = split.build_split(tmp_path, num_train=6, num_heldout=3, seed=5, world_version=version)
    split.check_disjoint(dirs["train"], dirs["heldout"])
    for side, folder in dirs.items():
        the_world = load_world(folder)
        assert the_world.split == side and world.read_meta(folder)["split"] == side
        words = {e.family.split()[0] for e in the_world.entities.values()}
        words |= {e.maker for e in the_world.entities.values() if e.maker}
        assert {split.side_of(w) for w in words} == {side}


def test_unsplit_worlds_of_one_seed_do_leak_and_the_check_says_so(tmp_path):
    small = build.build_world(tmp_path / "small", 2, 3, world_version=1)
    large = build.build_world(tmp_path / "large", 4, 3, world_version=1)
    with pytest.raises(ValueError, match="share .* families"):
        split.check_disjoint(large, small)


def test_unknown_side_is_named():
    with pytest.raises(ValueError, match=r"split must be one of \['train', 'heldout'\] or None; got 'dev'"):
        split.accepts("dev")
