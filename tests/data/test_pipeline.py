"""Trajectory shards -> Grain -> learner batches: exact tokens and sampler pixels, host sharding, resume, filters.

Every trajectory here is recorded through the rollout's own path (`support.recorded`) with a tiny tokenizer whose
`<|image_pad|>` is id 40 (not Qwen's 151655, nor the tiny default 5), so the ids travel from the tokenizer
through shards into batches that the model's input check accepts.
"""

import dataclasses
import json

import numpy as np
import pytest
from support import recorded

from ranger_jax.data import batching, examples, filters, pipeline, shards
from ranger_jax.models.qwen3_vl import Qwen3VLConfig
from ranger_jax.models.qwen3_vl.model import check_inputs
from ranger_jax.rl import grpo

IMAGE_PAD = 40
GROUPS, G = 4, 3
TERMINATIONS = {7: "repeated_response", 10: "max_response_length_exceeded"}  # in groups 2 and 3


@pytest.fixture(scope="module")
def renderer(tmp_path_factory):
    return recorded.tiny_renderer(tmp_path_factory.mktemp("tok"), image_pad_id=IMAGE_PAD)


@pytest.fixture(scope="module")
def recordings(renderer):
    """12 trajectories: group g = records 3g..3g+2, sampled by policy version g, record i with reward i/16."""
    return [recorded.record(renderer, seed=i, group_id=f"g{i // G}", sample_index=i % G, policy_version=i // G,
                            reward=i / 16, termination=TERMINATIONS.get(i, "answer"), turns=1 + i % 3)
            for i in range(GROUPS * G)]


@pytest.fixture(scope="module")
def source(recordings, tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    trajectories = [t for t, _ in recordings]
    shards.write_shard(folder / "a-00000.array_record", trajectories[:5])  # group 1 straddles two shards
    shards.write_shard(folder / "a-00001.array_record", trajectories[5:])
    return shards.TrajectorySource(folder)


@pytest.fixture(scope="module")
def spec(renderer):
    return batching.BatchSpec.for_tokenizer(renderer.tokenizer, batch_size=4, length_buckets=(128, 192, 256),
                                            vision=recorded.VISION, patch_step=64, image_step=4)


def model_config():
    """The tiny model with the tiny tokenizer's ids: `check_inputs` is the model's own input contract."""
    tiny = Qwen3VLConfig.tiny()
    return dataclasses.replace(tiny, image_token_id=IMAGE_PAD,
                               text_config=dataclasses.replace(tiny.text_config, vocab_size=512))


def batches(dataset, limit=100):
    iterator = iter(dataset)
    return [batch for _, batch in zip(range(limit), iterator)]


def record_of(batch, row, recordings):
    """Index of the recording a valid batch row holds: the one whose tokens start the row (whole, or cut)."""
    ids = batch["input_ids"][row, :int(batch["attention_mask"][row].sum())]
    while ids[-1] == IMAGE_PAD:  # the image padding's placeholders (recorded rows end with text)
        ids = ids[:-1]
    found = [i for i, (t, _) in enumerate(recordings) if np.array_equal(ids, t.token_ids[:len(ids)])]
    assert len(found) == 1, found
    return found[0]


def rows_of(dataset, recordings):
    """{recording index: (batch, row)} over one pass."""
    out = {}
    for batch in batches(dataset):
        for row in np.flatnonzero(batch["row_valid"]):
            index = record_of(batch, row, recordings)
            assert index not in out
            out[index] = (batch, row)
    return out


def test_batches_hold_exactly_the_recorded_tokens_and_the_sampler_pixels(source, recordings, spec):
    dataset = pipeline.trajectory_dataset(source, spec=spec, vision=recorded.VISION, grpo_groups=False, num_epochs=1,
                                          window_batches=2, shard_index=0, shard_count=1)
    seen = []
    for batch in batches(dataset):
        assert "advantages" not in batch  # records one by one: no GRPO groups
        check_inputs(model_config(), batch["input_ids"], batch["attention_mask"], batch["pixel_values"],
                     batch["image_grid_thw"])
        lengths, pixels, grids = [], [], []
        for row in range(spec.batch_size):
            if not batch["row_valid"][row]:
                lengths.append(0)
                continue
            seen.append(record_of(batch, row, recordings))
            trajectory, prepared = recordings[seen[-1]]
            n = trajectory.num_tokens
            lengths.append(n)
            np.testing.assert_array_equal(batch["input_ids"][row, :n], trajectory.token_ids)
            np.testing.assert_array_equal(batch["loss_mask"][row, :n], trajectory.loss_mask.astype(np.float32))
            np.testing.assert_array_equal(batch["sampler_logp"][row, :n], trajectory.sampler_logprobs)
            assert batch["attention_mask"][row, :n].all() and batch["policy_version"][row] == trajectory.policy_version
            pixels.append([p.pixel_values for p in prepared])  # what the sampler encoded
            grids.append([p.grid_thw.tolist() for p in prepared])
        host = len(lengths) - 1 - int(np.argmin(lengths[::-1]))  # padding images follow the shortest row
        expected_pixels, expected_grids, real_rows = [], [], iter(zip(pixels, grids))
        for row, n in enumerate(lengths):
            if n:
                row_pixels, row_grids = next(real_rows)
                expected_pixels += row_pixels
                expected_grids += row_grids
            if row == host:  # k >= 1 padding images owning the spare patch rows, with zero pixels
                spare = len(batch["pixel_values"]) - sum(len(p) for ps in pixels for p in ps)
                k = len(batch["image_grid_thw"]) - sum(map(len, grids))
                padding = batch["image_grid_thw"][len(expected_grids):len(expected_grids) + k]
                assert k >= 1 and padding[:, 1].tolist() == [2] * k and int(padding.prod(axis=1).sum()) == spare
                expected_pixels.append(np.zeros((spare, spec.patch_features), np.float32))
                expected_grids += padding.tolist()
        np.testing.assert_array_equal(batch["pixel_values"], np.concatenate(expected_pixels))
        assert batch["image_grid_thw"].tolist() == expected_grids
        assert batch["pixel_values"].shape[0] % spec.patch_step == 0 and len(expected_grids) % spec.image_step == 0
    assert sorted(seen) == list(range(GROUPS * G))


def test_a_record_of_another_tokenizer_is_refused_naming_it(source, spec):
    wrong = dataclasses.replace(spec, image_pad_id=5)
    dataset = pipeline.trajectory_dataset(source, spec=wrong, vision=recorded.VISION, grpo_groups=False,
                                          num_epochs=1, shard_index=0, shard_count=1)
    with pytest.raises(ValueError, match=r"shard .*a-0000\d.array_record record \d+: recorded with image_pad_id=40 "
                                         r"but the learner's tokenizer uses 5"):
        batches(dataset)


def test_hosts_get_disjoint_whole_groups_that_together_cover_everything(source, recordings, spec):
    per_host = []
    for host in range(3):
        dataset = pipeline.trajectory_dataset(source, spec=spec, vision=recorded.VISION, num_epochs=1, seed=5,
                                              window_batches=1, shard_index=host, shard_count=3)
        per_host.append(sorted(rows_of(dataset, recordings)))
    assert per_host == [[0, 1, 2, 9, 10, 11], [3, 4, 5], [6, 7, 8]]  # group i goes to host i mod 3
    with pytest.raises(ValueError, match=r"shard_index 3 is not in \[0, shard_count=3\)"):
        pipeline.trajectory_dataset(source, spec=spec, shard_index=3, shard_count=3)
    with pytest.raises(ValueError, match=r"host 4 of 5 gets none of the 4 units"):
        pipeline.trajectory_dataset(source, spec=spec, shard_index=4, shard_count=5)


def test_seeded_shuffle_differs_per_epoch_and_repeats_per_seed(source, recordings, spec):
    one_row = dataclasses.replace(spec, batch_size=1)  # one row per window: batches come in unit order

    def order(seed):
        dataset = pipeline.trajectory_dataset(source, spec=one_row, vision=recorded.VISION, grpo_groups=False,
                                              seed=seed, num_epochs=2, window_batches=1, shard_index=0, shard_count=1)
        return [record_of(b, 0, recordings) for b in batches(dataset)]

    first = order(7)
    assert sorted(first[:12]) == sorted(first[12:]) == list(range(12))
    assert first[:12] != list(range(12)) and first[:12] != first[12:]
    assert order(7) == first and order(8) != first


def test_grpo_advantages_are_normalised_within_each_group(source, recordings, spec):
    dataset = pipeline.trajectory_dataset(source, spec=spec, vision=recorded.VISION, num_epochs=1, shard_index=0,
                                          shard_count=1)
    got = {i: float(b["advantages"][r]) for i, (b, r) in rows_of(dataset, recordings).items()}
    for g in range(GROUPS):
        rewards = np.arange(G * g, G * g + G) / 16
        expected = (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-6)
        np.testing.assert_allclose([got[i] for i in range(G * g, G * g + G)], expected, rtol=1e-6)


def test_prefix_tree_advantages_are_per_token_and_follow_each_groups_tree(source, recordings, spec):
    dataset = pipeline.trajectory_dataset(source, spec=spec, vision=recorded.VISION, num_epochs=1, shard_index=0,
                                          shard_count=1, advantages="prefix-tree")
    found = rows_of(dataset, recordings)
    for g in range(GROUPS):
        members = range(G * g, G * g + G)
        expected = grpo.prefix_tree_advantages([recordings[i][0].token_ids for i in members],
                                               np.arange(G * g, G * g + G) / 16)
        assert any(a.any() for a in expected)
        for i, want in zip(members, expected):
            batch, row = found[i]
            got = batch["token_advantages"][row]
            np.testing.assert_allclose(got[:len(want)], want, rtol=1e-6)  # rows hold whole recordings here
            assert not got[len(want):].any()  # padding (and the image padding's placeholders) carry nothing
    with pytest.raises(ValueError, match=r"unknown advantages 'tree'; known: \['group', 'prefix-tree'\]"):
        pipeline.trajectory_dataset(source, spec=spec, advantages="tree")
    with pytest.raises(ValueError, match=r"advantages='prefix-tree' needs GRPO groups"):
        pipeline.trajectory_dataset(source, spec=spec, grpo_groups=False, advantages="prefix-tree")


@pytest.mark.parametrize("emitted", [1, 2, 3, 6])
def test_resumed_iterator_yields_exactly_the_next_batches(source, spec, emitted):
    def dataset():
        return pipeline.trajectory_dataset(source, spec=spec, vision=recorded.VISION, seed=3, window_batches=2,
                                           shard_index=0, shard_count=1)  # repeats forever

    first = iter(dataset())
    for _ in range(emitted):
        next(first)
    state = json.loads(json.dumps(first.get_state()))  # as a checkpoint stores it
    expected = [next(first) for _ in range(4)]
    resumed = iter(dataset())
    resumed.set_state(state)
    for want in expected:
        got = next(resumed)
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_termination_and_staleness_rules_with_counts(source, recordings, spec):
    config = filters.FilterConfig(drop_terminations={"repeated_response"},
                                  zero_loss_terminations={"max_response_length_exceeded"},
                                  max_staleness=1, current_version=lambda: 3)
    dataset = pipeline.trajectory_dataset(source, spec=spec, vision=recorded.VISION, config=config, num_epochs=1,
                                          shard_index=0, shard_count=1)
    rows = rows_of(dataset, recordings)
    assert sorted(rows) == [6, 8, 9, 10, 11]  # versions 0 and 1 are stale (< 3 - 1); record 7 repeated itself
    assert dataset.stats.as_dict() == {"dropped": {"stale": 6, "termination:repeated_response": 1},
                                       "zeroed": {"termination:max_response_length_exceeded": 1}, "truncated": 0,
                                       "flagged_stale": 0, "kept": 5}
    batch, row = rows[10]
    assert not batch["loss_mask"][row].any() and not batch["sampler_logp"][row].any()
    assert batch["advantages"][row] == 0.0
    for members in ([6, 8], [9, 11]):  # the dropped and the zero-loss member are left out of the statistics
        rewards = np.array(members) / 16
        expected = (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-6)
        np.testing.assert_allclose([rows[i][0]["advantages"][rows[i][1]] for i in members], expected, rtol=1e-6)

    flag = dataclasses.replace(config, stale="flag", drop_terminations=frozenset(), zero_loss_terminations=frozenset())
    dataset = pipeline.trajectory_dataset(source, spec=spec, vision=recorded.VISION, config=flag, num_epochs=1,
                                          shard_index=0, shard_count=1)
    flagged = rows_of(dataset, recordings)  # kept; their policy_version says how far behind they are
    assert {i: int(b["policy_version"][r]) for i, (b, r) in flagged.items()} == {i: i // G for i in range(12)}
    assert dataset.stats.flagged_stale == 6 and not dataset.stats.dropped


def test_filter_stats_count_on_from_a_snapshot():
    stats = filters.FilterStats()
    stats.count("dropped", "newer", 3)
    stats.count("zeroed", "termination:error")
    stats.count("kept", n=5)
    again = filters.FilterStats.from_dict(json.loads(json.dumps(stats.as_dict())))  # as saved with a checkpoint
    again.count("dropped", "newer")
    again.count("truncated")
    assert again.as_dict() == {"dropped": {"newer": 4}, "zeroed": {"termination:error": 1}, "truncated": 1,
                               "flagged_stale": 0, "kept": 5}
    with pytest.raises(ValueError, match=r"needs the keys \['flagged_stale', 'kept'\]"):
        filters.FilterStats.from_dict({"dropped": {}, "zeroed": {}, "truncated": 0})


def test_staleness_uses_the_version_recorded_in_the_state(source, spec):
    version = {"now": 3}
    config = filters.FilterConfig(max_staleness=2, current_version=lambda: version["now"])

    def dataset():
        return pipeline.trajectory_dataset(source, spec=spec, vision=recorded.VISION, config=config, seed=1,
                                           window_batches=3, num_epochs=1, shard_index=0, shard_count=1)

    first = iter(dataset())
    next(first)
    state = first.get_state()
    version["now"] = 5  # the learner moved on; the window already read keeps the version it was read with
    expected = next(first)
    resumed = iter(dataset())
    resumed.set_state(state)
    np.testing.assert_array_equal(next(resumed)["input_ids"], expected["input_ids"])


@pytest.mark.parametrize("overlong", ["drop", "truncate"])
def test_overlong_rows_dropped_or_cut_at_an_image_boundary(source, recordings, spec, overlong):
    limit = 100
    config = filters.FilterConfig(max_length=limit, overlong=overlong)
    dataset = pipeline.trajectory_dataset(source, spec=spec, vision=recorded.VISION, config=config, grpo_groups=False,
                                          num_epochs=1, shard_index=0, shard_count=1)
    long = {i for i, (t, _) in enumerate(recordings) if t.num_tokens > limit}
    assert 0 < len(long) < len(recordings)
    out = rows_of(dataset, recordings)
    kept = sorted(out)
    if overlong == "drop":
        assert kept == sorted(set(range(12)) - long) and dataset.stats.dropped == {"overlong": len(long)}
        return
    assert kept == list(range(12)) and dataset.stats.truncated == len(long)
    for index, (batch, row) in out.items():
        check_inputs(model_config(), batch["input_ids"], batch["attention_mask"], batch["pixel_values"],
                     batch["image_grid_thw"])
        if index in long:
            trajectory = recordings[index][0]
            # the cut stops before the first image whose placeholders do not all fit
            ends = [im.token_index + im.num_tokens() for im in trajectory.images]
            starts = [im.token_index for im in trajectory.images]
            cut = min([limit] + [s for s, e in zip(starts, ends) if e > limit])
            np.testing.assert_array_equal(batch["input_ids"][row, :cut], trajectory.token_ids[:cut])
            assert batch["input_ids"][row, cut] in (spec.pad_id, IMAGE_PAD)
            assert not batch["loss_mask"][row, cut:].any()


def test_rows_trimmed_after_their_last_trained_token_keep_every_trained_token(source, recordings, spec):
    config = filters.FilterConfig(trim_untrained_tail=True)
    dataset = pipeline.trajectory_dataset(source, spec=spec, vision=recorded.VISION, config=config, grpo_groups=False,
                                          num_epochs=1, shard_index=0, shard_count=1)
    out = rows_of(dataset, recordings)
    assert sorted(out) == list(range(12))
    for index, (batch, row) in out.items():
        check_inputs(model_config(), batch["input_ids"], batch["attention_mask"], batch["pixel_values"],
                     batch["image_grid_thw"])
        trajectory = recordings[index][0]
        mask = trajectory.loss_mask.astype(np.float32)
        cut = int(np.flatnonzero(mask)[-1]) + 1
        assert cut < trajectory.num_tokens  # each recording ends with a tool response and its image
        assert batch["input_ids"][row, cut] in (spec.pad_id, IMAGE_PAD)  # padding (or the padding image) after it
        np.testing.assert_array_equal(batch["input_ids"][row, :cut], trajectory.token_ids[:cut])
        np.testing.assert_array_equal(batch["loss_mask"][row, :cut], mask[:cut])
        np.testing.assert_array_equal(batch["sampler_logp"][row, :cut], trajectory.sampler_logprobs[:cut])
        assert batch["loss_mask"][row].sum() == mask.sum()
        # the last tool response's image is gone (check_inputs: the batch's pixels match its placeholders)
        assert np.sum(batch["input_ids"][row, :cut] == IMAGE_PAD) < np.sum(trajectory.token_ids == IMAGE_PAD)
    example = {"input_ids": np.arange(4), "loss_mask": np.zeros(4, np.float32)}
    assert examples.trim_untrained_tail(example, image_pad_id=IMAGE_PAD, merge_size=2) is example


def test_shared_prefix_batches_hold_each_groups_context_once(renderer, spec, tmp_path):
    """Groups that branched after their first message: each context is one prefix row, each member's sampled turn
    a suffix row continuing it, and together they are the recorded tokens up to the last trained one."""
    recordings = [recorded.record(renderer, seed=g, sample_seed=i, group_id=f"g{g}", sample_index=i, reward=i / 4,
                                  turns=1) for g in range(3) for i in range(G)]
    shards.write_shard(tmp_path / "a-00000.array_record", [t for t, _ in recordings])
    shared = dataclasses.replace(spec, batch_size=6, prefix_rows=2, suffix_buckets=(16, 32))
    dataset = pipeline.trajectory_dataset(shards.TrajectorySource(tmp_path), spec=shared, vision=recorded.VISION,
                                          num_epochs=1, shard_index=0, shard_count=1)
    seen = []
    for batch in batches(dataset):
        assert batch["prefix_input_ids"].shape[0] == 2 and batch["input_ids"].shape == (6, 16)
        check_inputs(model_config(), batch["prefix_input_ids"], batch["prefix_attention_mask"],
                     batch["pixel_values"], batch["image_grid_thw"])
        for row in np.flatnonzero(batch["row_valid"]):
            index = batch["prefix_index"][row]
            prefix = batch["prefix_input_ids"][index, :batch["prefix_length"][index]]
            suffix = batch["input_ids"][row, :int(batch["attention_mask"][row].sum())]
            full = np.concatenate([prefix, suffix])
            found = [i for i, (t, _) in enumerate(recordings) if np.array_equal(full, t.token_ids[:len(full)])]
            assert len(found) == 1
            trajectory = recordings[found[0]][0]
            assert len(full) == np.flatnonzero(trajectory.loss_mask)[-1] + 1  # cut after the sampled turn
            assert batch["loss_mask"][row].sum() == trajectory.loss_mask.sum()
            assert np.sum(prefix == IMAGE_PAD) == np.sum(trajectory.token_ids[:len(full)] == IMAGE_PAD)
            seen.append(found[0])
    assert sorted(seen) == list(range(9))
    tree = pipeline.trajectory_dataset(shards.TrajectorySource(tmp_path), spec=shared, vision=recorded.VISION,
                                       num_epochs=1, shard_index=0, shard_count=1, advantages="prefix-tree")
    for batch in batches(tree):
        for row in np.flatnonzero(batch["row_valid"]):
            index = batch["prefix_index"][row]
            split = batch["prefix_length"][index]
            suffix = batch["input_ids"][row, :int(batch["attention_mask"][row].sum())]
            full = np.concatenate([batch["prefix_input_ids"][index, :split], suffix])
            number = next(i for i, (t, _) in enumerate(recordings) if np.array_equal(full, t.token_ids[:len(full)]))
            members = [t for t, _ in recordings if t.group_id == recordings[number][0].group_id]
            cut = [t.token_ids[:np.flatnonzero(t.loss_mask)[-1] + 1] for t in members]  # rows as trimmed
            want = grpo.prefix_tree_advantages(cut, [t.reward for t in members])[members.index(recordings[number][0])]
            np.testing.assert_allclose(batch["token_advantages"][row, :len(suffix)], want[split:], rtol=1e-6)
    mixed = dataclasses.replace(shared, batch_size=4)  # a group of 3 and its neighbour do not fit one batch of 4
    assert all(int(b["row_valid"].sum()) == G for b in batches(pipeline.trajectory_dataset(
        shards.TrajectorySource(tmp_path), spec=mixed, vision=recorded.VISION, num_epochs=1, shard_index=0,
        shard_count=1)))
    with pytest.raises(ValueError, match="a GRPO group of 3 rows does not fit a shared-prefix batch of 2 rows"):
        batches(pipeline.trajectory_dataset(shards.TrajectorySource(tmp_path), spec=dataclasses.replace(
            shared, batch_size=2), vision=recorded.VISION, num_epochs=1, shard_index=0, shard_count=1))


def test_filter_config_errors():
    with pytest.raises(ValueError, match=r"overlong='cut'; known: drop, truncate"):
        filters.FilterConfig(overlong="cut")
    with pytest.raises(ValueError, match=r"max_staleness needs current_version"):
        filters.FilterConfig(max_staleness=2)
    with pytest.raises(ValueError, match=r"labels \['error'\] are both dropped and zero-loss"):
        filters.FilterConfig(drop_terminations={"error"}, zero_loss_terminations={"error"})


def test_max_length_above_the_spec_is_refused(source, spec):
    with pytest.raises(ValueError, match=r"max_length=250 exceeds the batch spec's max_row_length 236"):
        pipeline.trajectory_dataset(source, spec=spec, config=filters.FilterConfig(max_length=250))


def test_corrupt_shards_raise_naming_the_shard(recordings, tmp_path, spec):
    good = shards.write_shard(tmp_path / "good.array_record", [t for t, _ in recordings[:6]])
    data = bytearray(good.read_bytes())
    data[len(data) // 3] ^= 0xFF  # one flipped byte inside a record chunk
    (tmp_path / "flipped").mkdir()
    flipped = tmp_path / "flipped" / "flipped.array_record"
    flipped.write_bytes(bytes(data))
    source = shards.TrajectorySource(flipped)
    with pytest.raises(shards.CorruptShardError, match=r"flipped.array_record record \d+ cannot be read"):
        pipeline.trajectory_dataset(source, spec=spec, shard_index=0, shard_count=1)  # the group index reads all
    dataset = pipeline.trajectory_dataset(source, spec=spec, grpo_groups=False, num_epochs=1, shard_index=0,
                                          shard_count=1)
    with pytest.raises(shards.CorruptShardError, match=r"flipped.array_record record \d+ cannot be read"):
        batches(dataset)


def test_grpo_batches_do_not_depend_on_the_order_the_shards_hold_the_records_in(recordings, spec, tmp_path):
    """An actor writes groups as they finish: the same round can arrive in another order, and the same batches
    (bit for bit, so the same update) must come out of it."""
    trajectories = [t for t, _ in recordings]
    shuffled = [trajectories[i] for i in np.random.default_rng(3).permutation(len(trajectories))]
    assert [t.sample_index for t in shuffled] != [t.sample_index for t in trajectories]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shards.write_shard(tmp_path / "a" / "r-00000.array_record", trajectories)
    shards.write_shard(tmp_path / "b" / "r-00000.array_record", shuffled[:7])
    shards.write_shard(tmp_path / "b" / "r-00001.array_record", shuffled[7:])

    def all_batches(folder):
        dataset = pipeline.trajectory_dataset(shards.TrajectorySource(folder), spec=spec, vision=recorded.VISION,
                                              num_epochs=1, seed=4, window_batches=2, shard_index=0, shard_count=1)
        return batches(dataset)

    first, second = all_batches(tmp_path / "a"), all_batches(tmp_path / "b")
    assert len(first) == len(second) > 1
    for one, other in zip(first, second):
        assert one.keys() == other.keys()
        for key in one:
            np.testing.assert_array_equal(one[key], other[key], err_msg=key)


def test_a_group_written_twice_is_refused_naming_both_records(recordings, spec, tmp_path):
    """Two records claiming one sample of a group (an actor that replayed a round into the folder) would count the
    sample twice in the group's statistics: refused, naming the group and where both copies are."""
    trajectories = [t for t, _ in recordings]
    twice, once = tmp_path / "twice", tmp_path / "once"
    twice.mkdir()
    once.mkdir()
    shards.write_shard(twice / "r-00000.array_record", trajectories)
    shards.write_shard(twice / "r-00001.array_record", [trajectories[4]])  # group g1, sample 1 again
    shards.write_shard(once / "r-00000.array_record", trajectories)
    source = shards.TrajectorySource(twice)
    message = (r"group 'g1' holds sample_index 1 twice: at shard \S*r-00000.array_record record 4 and shard "
               r"\S*r-00001.array_record record 0")
    with pytest.raises(ValueError, match=message):
        pipeline.trajectory_dataset(source, spec=spec, num_epochs=1, shard_index=0, shard_count=1)

    def rows_one_by_one(folder):  # no groups (SFT on trajectories): a repeated record is one more row
        dataset = pipeline.trajectory_dataset(shards.TrajectorySource(folder), spec=spec, grpo_groups=False,
                                              num_epochs=1, shard_index=0, shard_count=1)
        return sum(int(np.sum(batch["row_valid"])) for batch in batches(dataset))

    assert rows_one_by_one(twice) == rows_one_by_one(once) + 1


@pytest.mark.parametrize("prefix_rows", [0, 3], ids=["plain-rows", "shared-prefix"])
def test_zero_advantage_groups_go_into_batches_of_their_own(renderer, spec, tmp_path, prefix_rows):
    """Groups whose rewards are all equal (every advantage 0) are packed apart, so a learner can leave their batches
    out; every row is still there once, and without the option nothing changes."""
    equal = {1, 3, 4}  # of 6 groups
    recordings = [recorded.record(renderer, seed=g, sample_seed=i, group_id=f"g{g}", sample_index=i, turns=1,
                                  reward=0.5 if g in equal else i * i / 4) for g in range(6) for i in range(G)]
    shards.write_shard(tmp_path / "a-00000.array_record", [t for t, _ in recordings])
    batch_spec = dataclasses.replace(spec, batch_size=6, prefix_rows=prefix_rows,
                                     suffix_buckets=(16, 32) if prefix_rows else spec.suffix_buckets)

    def plan(apart):
        dataset = pipeline.trajectory_dataset(shards.TrajectorySource(tmp_path), spec=batch_spec,
                                              vision=recorded.VISION, num_epochs=1, shard_index=0, shard_count=1,
                                              zero_advantage_apart=apart)
        return batches(dataset)

    kinds, rows = [], 0
    for batch in plan(True):
        valid = batch["row_valid"] > 0
        zero = batch["advantages"][valid] == 0
        assert zero.all() or not zero.any()  # never mixed
        kinds.append(bool(zero.all()))
        rows += int(valid.sum())
    assert rows == 18 and kinds.count(True) == 2 and kinds.count(False) == 2  # 9 rows each, 6 a batch
    before = plan(False)  # the default keeps the length order alone: some batch mixes the two kinds
    assert len(before) == 3 and any(0 < np.sum(b["advantages"][b["row_valid"] > 0] == 0) < b["row_valid"].sum()
                                    for b in before)


def test_leftover_groups_take_a_smaller_shared_prefix_batch_on_one_host_only(renderer, spec, tmp_path):
    recordings = [recorded.record(renderer, seed=g, sample_seed=i, group_id=f"g{g}", sample_index=i, turns=1,
                                  reward=i * i / 4) for g in range(4) for i in range(G)]
    shards.write_shard(tmp_path / "a-00000.array_record", [t for t, _ in recordings])
    bucketed = dataclasses.replace(spec, batch_size=3 * G, prefix_rows=3, suffix_buckets=(16, 32),
                                   prefix_row_buckets=(1,))
    dataset = pipeline.trajectory_dataset(shards.TrajectorySource(tmp_path), spec=bucketed, vision=recorded.VISION,
                                          num_epochs=1, shard_index=0, shard_count=1)
    sizes = sorted((b["prefix_input_ids"].shape[0], b["input_ids"].shape[0]) for b in batches(dataset))
    assert sizes == [(1, G), (3, 3 * G)]  # 4 groups: a full batch of 3 and one of the 1-group size
    with pytest.raises(ValueError, match=r"prefix_row_buckets \[1\] with 2 hosts: each host would size its own"):
        pipeline.trajectory_dataset(shards.TrajectorySource(tmp_path), spec=bucketed, vision=recorded.VISION,
                                    num_epochs=1, shard_index=0, shard_count=2)
