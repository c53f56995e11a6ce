"""Consistent word permutation (`data.augment`): per-row (SFT) or per-group (GRPO) bijections, wired into the Grain
pipeline."""

import dataclasses
import json

import numpy as np
import pytest
from support import recorded

from ranger_jax.data import augment, batching, pipeline, shards

IMAGE_PAD = 500


class WordTokenizer:
    """Whitespace tokenizer over a fixed vocabulary: " w" and "w" are different single ids; others split."""

    def __init__(self, words):
        self.ids = {}
        for w in words:
            self.ids[" " + w] = len(self.ids) + 10
            self.ids[w] = len(self.ids) + 10

    def encode(self, text):
        if text in self.ids:
            return [self.ids[text]]
        return [1, 2]


def test_each_row_gets_one_bijection_per_group_applied_to_every_spelling():
    perm = augment.TokenPermutation([[[10, 11, 12], [20, 21, 22]], [[30, 31]]])
    row = np.array([5, 10, 20, 11, 21, 12, 22, 30, 31, 99, 10], np.int32)
    seen = set()
    for seed in range(40):
        out, = perm([{"input_ids": row, "loss_mask": np.ones(row.size)}], np.random.default_rng(seed))
        got = out["input_ids"]
        assert got.dtype == row.dtype and got.shape == row.shape
        assert got[0] == 5 and got[9] == 99  # outside every group: untouched
        mapping = {}
        for old, new in zip(row.tolist(), got.tolist()):
            assert mapping.setdefault(old, new) == new  # consistent through the row
        assert sorted(mapping[i] for i in (10, 11, 12)) == [10, 11, 12]  # a bijection inside the group
        assert [mapping[i] - 20 for i in (20, 21, 22)] == [mapping[i] - 10 for i in (10, 11, 12)]  # same word
        assert sorted(mapping[i] for i in (30, 31)) == [30, 31]
        seen.add(tuple(mapping[i] for i in (10, 11, 12)))
    assert len(seen) == 6  # every permutation of three words is drawn


def test_word_permutation_uses_the_single_token_spellings_and_names_unusable_groups():
    tokenizer = WordTokenizer(["red", "navy", "lime"])
    perm = augment.word_permutation(tokenizer, [["red", "navy", "lime"]])
    assert [list(v) for v in perm.groups[0]] == [[10, 12, 14], [11, 13, 15]]
    with pytest.raises(ValueError, match="maroon"):
        augment.word_permutation(tokenizer, [["red", "maroon"]])


@pytest.mark.parametrize("groups, message", [
    ([[[1, 2], [3]]], "same >= 2 words"), ([[[1]]], "same >= 2 words"), ([[[1, 1]]], "repeats"),
    ([[[1, 2]], [[2, 3]]], "share"), ([[]], "no variants")])
def test_bad_groups_are_refused(groups, message):
    with pytest.raises(ValueError, match=message):
        augment.TokenPermutation(groups)


@pytest.fixture(scope="module")
def recording_source(tmp_path_factory):
    renderer = recorded.tiny_renderer(tmp_path_factory.mktemp("tok"), image_pad_id=IMAGE_PAD)
    recordings = [recorded.record(renderer, seed=i, group_id=f"g{i}", sample_index=0, policy_version=0,
                                  reward=0.5, termination="answer", turns=2) for i in range(6)]
    folder = tmp_path_factory.mktemp("shards")
    shards.write_shard(folder / "a-00000.array_record", [t for t, _ in recordings])
    spec = batching.BatchSpec.for_tokenizer(renderer.tokenizer, batch_size=2, length_buckets=(128, 192, 256),
                                            vision=recorded.VISION, patch_step=64, image_step=4)
    return [t for t, _ in recordings], shards.TrajectorySource(folder), spec


def _frequent_text_ids(trajectories, count):
    ids = np.concatenate([t.token_ids for t in trajectories])
    ids = ids[ids < IMAGE_PAD - 10]
    values, counts = np.unique(ids, return_counts=True)
    return values[np.argsort(-counts)][:count].tolist()


def test_pipeline_rows_differ_from_the_record_only_by_a_permutation_and_resume_repeats_it(recording_source):
    trajectories, source, spec = recording_source
    group = _frequent_text_ids(trajectories, 4)
    perm = augment.TokenPermutation([[group]])

    def dataset():
        return pipeline.trajectory_dataset(source, spec=spec, vision=recorded.VISION, grpo_groups=False, seed=5,
                                           augment=perm, shard_index=0, shard_count=1)

    changed = 0
    for batch in [next(it) for it in [iter(dataset())] for _ in range(6)]:
        for row in np.flatnonzero(batch["row_valid"]):
            got = batch["input_ids"][row, :int(batch["attention_mask"][row].sum())]
            while got[-1] == IMAGE_PAD:  # the batch's image padding placeholders (recorded rows end with text)
                got = got[:-1]
            keep = ~np.isin(got, group)
            matches = [t.token_ids[:got.size] for t in trajectories if t.token_ids.size >= got.size
                       and np.array_equal(t.token_ids[:got.size][keep], got[keep])
                       and np.array_equal(np.isin(t.token_ids[:got.size], group), ~keep)]
            assert len(matches) == 1
            mapping = {}
            for old, new in zip(matches[0].tolist(), got.tolist()):
                assert mapping.setdefault(old, new) == new
            changed += any(mapping[g] != g for g in group if g in mapping)
    assert changed > 0

    first = iter(dataset())
    for _ in range(3):
        next(first)
    state = json.loads(json.dumps(first.get_state()))
    expected = [next(first) for _ in range(3)]
    resumed = iter(dataset())
    resumed.set_state(state)
    for want in expected:
        np.testing.assert_array_equal(next(resumed)["input_ids"], want["input_ids"])


def test_grpo_groups_take_one_permutation_per_group(recording_source, tmp_path):
    _, source, spec = recording_source
    with pytest.raises(ValueError, match="one draw per group"):
        pipeline.trajectory_dataset(source, spec=spec, vision=recorded.VISION, grpo_groups=True,
                                    augment=augment.TokenPermutation([[[1, 2]]]))
    renderer = recorded.tiny_renderer(tmp_path / "tok", image_pad_id=IMAGE_PAD)
    members = [recorded.record(renderer, seed=1, sample_seed=i, group_id="g", sample_index=i, reward=i / 4,
                               turns=1)[0] for i in range(4)]
    shards.write_shard(tmp_path / "a-00000.array_record", members)
    group = _frequent_text_ids(members, 6)
    dataset = pipeline.trajectory_dataset(shards.TrajectorySource(tmp_path), spec=dataclasses.replace(spec,
                                          batch_size=4), vision=recorded.VISION, grpo_groups=True, seed=3,
                                          augment=augment.TokenPermutation([[group]], per_unit=True),
                                          num_epochs=1, shard_index=0, shard_count=1)
    batch, = list(dataset)
    mappings = []
    for row in range(4):
        got = batch["input_ids"][row, :int(batch["attention_mask"][row].sum())]
        while got[-1] == IMAGE_PAD:
            got = got[:-1]
        original, = [t.token_ids[:got.size] for t in members if t.token_ids.size >= got.size
                     and np.array_equal(t.token_ids[:got.size][~np.isin(got, group)], got[~np.isin(got, group)])]
        mappings.append({old: new for old, new in zip(original.tolist(), got.tolist()) if old in group})
    assert all(m == mappings[0] for m in mappings) and any(k != v for k, v in mappings[0].items())
    # the rows still share their context token for token, so they share a prefix
    common = min(len(m.token_ids) for m in members)
    assert np.array_equal(batch["input_ids"][0, :20], batch["input_ids"][3, :20]) and common > 20


def test_unusable_groups_can_be_skipped():
    tokenizer = WordTokenizer(["red", "navy"])
    perm = augment.word_permutation(tokenizer, [["red", "navy"], ["red-ish", "blue"]], skip_unusable=True)
    assert len(perm.groups) == 1
    assert augment.word_permutation(tokenizer, [["teal", "cyan"]], skip_unusable=True) is None


def _name_texts():
    import random
    from ranger_jax.env.sim import catalog
    rng, used = random.Random(3), set()
    names = [catalog.make_word(rng, used) + " " + suffix for suffix in ("Mail", "League", "Max") for _ in range(12)]
    lines = []
    for i, name in enumerate(names):
        lines.append(f"First look: the {name} {i % 9} Souvenir stamp pairs a maroon base with navy chevrons. "
                     f"Inside the post office counter as the {name} lands (2025-05-{10 + i % 9}).")
    return names, lines


def test_name_pieces_permute_only_tokens_that_occur_inside_names(tmp_path):
    from ranger_jax.processing import compact_tokenizer
    from ranger_jax.processing import tokenizer as tokenizer_lib
    names, lines = _name_texts()
    compact_tokenizer.train_compact_tokenizer(lines * 4, tmp_path, vocab_size=600)
    tokenizer = tokenizer_lib.load_tokenizer(tmp_path)
    groups = augment.name_pieces(tokenizer, names, lines)
    assert groups and all(len(g) == 1 and g[0].size >= 2 for g in groups)
    ids = np.concatenate([g[0] for g in groups])
    assert np.unique(ids).size == ids.size
    for group in groups:  # one shape per group: leading space and capital alike
        shapes = {(p.startswith(" "), p.strip()[0].isupper()) for p in (tokenizer.decode([int(i)]) for i in group[0])}
        assert len(shapes) == 1
    perm = augment.TokenPermutation(groups)
    rng = np.random.default_rng(0)
    changed = 0
    for line in lines:
        row = np.asarray(tokenizer.encode(line))
        out, = perm([{"input_ids": row}], rng)
        got = tokenizer.decode(out["input_ids"].tolist())
        for name in names:  # the text around the names is untouched
            line = line.replace(name, "")
        for word in line.split():
            assert word in got
        changed += got != tokenizer.decode(row.tolist())
    assert changed >= len(lines) - 2
    ordinary = set(tokenizer.encode(" Souvenir stamp pairs a maroon base with navy chevrons"))
    assert not ordinary & set(ids.tolist())


def test_name_pieces_need_a_name():
    with pytest.raises(ValueError, match="name"):
        augment.name_pieces(WordTokenizer(["a"]), [" ", ""], ["text"])


def _compact_tokenizer(tmp_path, lines):
    from ranger_jax.processing import compact_tokenizer
    from ranger_jax.processing import tokenizer as tokenizer_lib
    compact_tokenizer.train_compact_tokenizer(lines * 4, tmp_path, vocab_size=600)
    return tokenizer_lib.load_tokenizer(tmp_path)


def test_protected_ids_are_the_first_message_and_common_assistant_tokens():
    END = 9
    episodes = [(np.array([1, 2, END, 30, 40, 50, 60, END]), np.array([0, 0, 0, 0, 1, 1, 1, 1])),
                (np.array([1, 3, END, 31, 40, 51, 61, END]), np.array([0, 0, 0, 0, 1, 1, 1, 1])),
                (np.array([1, 2, END, 32, 40, 52, 60, END]), np.array([0, 0, 0, 0, 1, 1, 0, 1]))]
    # first messages: {1, 2, 3}; only read (never in an assistant turn): 30, 31, 32; assistant tokens in >= 2 of 3
    # episodes: 40 and END (the third's 60 is not an assistant token, so 60 counts once)
    read = {30, 31, 32}
    assert augment.protected_ids(episodes, end_of_turn_id=END, fraction=0.5) == {1, 2, 3, 40, END} | read
    assert augment.protected_ids(episodes, end_of_turn_id=END, fraction=0.3) == {
        1, 2, 3, 40, 50, 51, 52, 60, 61, END} | read
    with pytest.raises(ValueError, match="fraction"):
        augment.protected_ids(episodes, end_of_turn_id=END, fraction=0.0)
    with pytest.raises(ValueError, match="shape"):
        augment.protected_ids([(np.arange(3), np.ones(2))], end_of_turn_id=END)
    with pytest.raises(ValueError, match="at least one episode"):
        augment.protected_ids([], end_of_turn_id=END)


def test_content_words_permute_every_unprotected_word_token_by_shape(tmp_path):
    names, lines = _name_texts()
    tokenizer = _compact_tokenizer(tmp_path, lines)
    protected = set(tokenizer.encode(" Souvenir stamp"))
    groups = augment.content_words(tokenizer, protected=protected)
    ids = np.concatenate([g[0] for g in groups])
    assert np.unique(ids).size == ids.size and not protected & set(ids.tolist())
    for group in groups:  # one shape per group: leading space, capital and length class alike
        pieces = [tokenizer.decode([int(i)]) for i in group[0]]
        assert len({(p.startswith(" "), p.strip()[0].isupper(), min(len(p.strip()), 4)) for p in pieces}) == 1
        assert all(p.strip().isalpha() for p in pieces)
    import re
    shapes = {}
    for i in range(tokenizer.vocab_size):  # the same classes, found independently
        m = re.fullmatch(r"( ?)([A-Za-z][a-z]*)", tokenizer.decode([i]))
        if m and i not in protected:
            shapes.setdefault((m.group(1), m.group(2)[0].isupper(), min(len(m.group(2)), 4)), set()).add(i)
    assert {frozenset(g[0].tolist()) for g in groups} == {frozenset(v) for v in shapes.values() if len(v) >= 2}
    perm = augment.TokenPermutation(groups)
    rng = np.random.default_rng(1)
    row = np.asarray(tokenizer.encode(lines[0]))
    out, = perm([{"input_ids": row}], rng)
    got = tokenizer.decode(out["input_ids"].tolist())
    assert got != lines[0] and " Souvenir stamp" in got  # content changed, the protected words stayed
    assert [w.isdigit() for w in got.split()] == [w.isdigit() for w in lines[0].split()]  # digits never move
