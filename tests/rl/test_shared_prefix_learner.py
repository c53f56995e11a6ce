"""Shared-prefix batches give the learner exactly what the full rows give: log-probs, loss, metrics, gradients."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ranger_jax.data import batching, shared_prefix
from ranger_jax.models.qwen3_vl import load
from ranger_jax.parallel import mesh as mesh_lib
from ranger_jax.rl import grpo
from ranger_jax.rl.learner import Learner, LearnerConfig, check_batch
from support.learner_batches import CONFIG

PAD, IMG, START, END = 0, 5, 3, 4  # Qwen3VLConfig.tiny(): vocabulary 256
FEATURES = CONFIG.vision_config.patch_features
PLAIN = batching.BatchSpec(batch_size=8, length_buckets=(64, 96, 128), pad_id=PAD, image_pad_id=IMG, merge_size=2,
                           patch_features=FEATURES, patch_step=32, image_step=4)
SHARED = dataclasses.replace(PLAIN, prefix_rows=3, suffix_buckets=(8, 16, 32))
GRPO = LearnerConfig(objective="grpo", learning_rate=1e-3, old_logp="sampler", clip_dual=3.0,
                     agg="seq-mean-token-mean")


def group(rng, members: int, text: int, grids, *, advantages=True):
    """A group's rows: one shared context (text, images, text), then per member 1-6 sampled tokens (trained) and
    0-3 untrained ones; the first sampled tokens of two members agree (the split must stay before them)."""
    context = list(rng.integers(10, 256, text))
    for t, h, w in grids:
        context += [START] + [IMG] * (t * h * w // 4) + [END] + list(rng.integers(10, 256, 2))
    patches = sum(t * h * w for t, h, w in grids)
    pixels = rng.standard_normal((patches, FEATURES)).astype(np.float32)
    shared_head = list(rng.integers(10, 256, 2))
    rows = []
    for m in range(members):
        sampled = shared_head[:1 + (m % 2)] + list(rng.integers(10, 256, int(rng.integers(1, 6))))
        tail = list(rng.integers(10, 256, int(rng.integers(0, 4))))
        ids = np.array(context + sampled + tail, np.int32)
        loss = np.zeros(len(ids), np.float32)
        loss[len(context):len(context) + len(sampled)] = 1
        row = {"input_ids": ids, "attention_mask": np.ones(len(ids), np.int32), "loss_mask": loss,
               "sampler_logp": np.where(loss > 0, -rng.random(len(ids)) * 2, 0).astype(np.float32),
               "pixel_values": pixels, "image_grid_thw": np.array(grids, np.int32).reshape(-1, 3),
               "policy_version": np.int32(0)}
        if advantages:
            row["advantage"] = np.float32(rng.normal())
        rows.append(row)
    return rows


@pytest.fixture(scope="module")
def units():
    rng = np.random.default_rng(3)
    return [group(rng, 3, 9, [(1, 4, 4), (1, 2, 4)]), group(rng, 2, 30, [(1, 4, 6)]), group(rng, 2, 12, [])]


def test_the_batch_holds_each_context_once_and_suffixes_continue_it(units):
    batch = shared_prefix.collate_shared(units, SHARED)
    plain = batching.collate([r for u in units for r in u], PLAIN)
    assert batch["prefix_input_ids"].shape[0] == 3 and batch["input_ids"].shape[0] == 8
    assert batch["prefix_index"].tolist() == [0, 0, 0, 1, 1, 2, 2, 0]
    assert batch["row_valid"].tolist() == [1] * 7 + [0]
    # each context's images once (the plain batch repeats them in every row), then the image padding
    np.testing.assert_array_equal(batch["image_grid_thw"][:3], [[1, 4, 4], [1, 2, 4], [1, 4, 6]])
    assert len(plain["image_grid_thw"]) > len(batch["image_grid_thw"])
    for row, (unit, index) in enumerate(zip([u for u in units for _ in u], batch["prefix_index"])):
        full = plain["input_ids"][row][plain["attention_mask"][row] > 0]
        split = batch["prefix_length"][index]
        np.testing.assert_array_equal(batch["prefix_input_ids"][index, :split], full[:split])
        suffix = batch["input_ids"][row][batch["attention_mask"][row] > 0]
        last_trained = np.flatnonzero(plain["loss_mask"][row])[-1]
        np.testing.assert_array_equal(suffix, full[split:last_trained + 1])  # the untrained tail is cut
        assert batch["loss_mask"][row].sum() == plain["loss_mask"][row].sum()  # nothing trained is in a prefix
    assert not np.any(batch["input_ids"] == IMG)


KL_TIS = dataclasses.replace(GRPO, agg="token-mean", old_logp="learner", tis_cap=2.0, kl_coef=0.1)


@pytest.mark.parametrize("learner_config", [GRPO, KL_TIS], ids=["sampler", "kl"])
def test_shared_prefix_step_equals_the_full_rows(tiny_checkpoint, units, learner_config):
    plain = batching.collate([r for u in units for r in u], PLAIN)
    shared = shared_prefix.collate_shared(units, SHARED)
    a, b = Learner(load(tiny_checkpoint), learner_config), Learner(load(tiny_checkpoint), learner_config)
    np.testing.assert_allclose(b.gradient(shared), a.gradient(plain), rtol=1e-4, atol=1e-6)
    full, short = a.step(plain), b.step(shared)
    assert set(full) == set(short)
    for key, value in full.items():
        assert short[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    # after the update the two learners still agree, on the full rows (Adam turns the gradients' 1e-4 relative
    # agreement into last-bit parameter differences: 1.4e-5 on a log-prob of -3.27 seen on an AVX-512 CPU)
    np.testing.assert_allclose(b.logprobs(plain), a.logprobs(plain), rtol=1e-5, atol=1e-5)


def with_tree_advantages(units, seed=0):
    """The units' rows with random rewards and their prefix-tree advantages (`token_advantage`, per token)."""
    rng, out = np.random.default_rng(seed), []
    for unit in units:
        rewards = rng.random(len(unit)).round(1)
        per_token = grpo.prefix_tree_advantages([r["input_ids"] for r in unit], rewards)
        row = grpo.group_advantages(rewards, np.zeros(len(unit)))
        out.append([{**r, "advantage": np.float32(a), "token_advantage": t} for r, a, t in zip(unit, row, per_token)])
    return out


def test_per_token_advantages_on_shared_prefixes_equal_the_full_rows(tiny_checkpoint, units):
    tree = with_tree_advantages(units)
    plain = batching.collate([r for u in tree for r in u], PLAIN)
    shared = shared_prefix.collate_shared(tree, SHARED)
    assert shared["token_advantages"].shape == shared["input_ids"].shape
    a, b = Learner(load(tiny_checkpoint), KL_TIS), Learner(load(tiny_checkpoint), KL_TIS)
    per_token = a.gradient(plain)
    np.testing.assert_allclose(b.gradient(shared), per_token, rtol=1e-4, atol=1e-6)
    # the learner reads them: the row advantages alone give another gradient, and tiling them gives theirs
    rows_only = {k: v for k, v in plain.items() if k != "token_advantages"}
    assert not np.allclose(a.gradient(rows_only), per_token, rtol=1e-3, atol=1e-6)
    tiled = {**rows_only, "token_advantages": np.broadcast_to(plain["advantages"][:, None], plain["input_ids"].shape)}
    np.testing.assert_allclose(a.gradient(tiled), a.gradient(rows_only), rtol=1e-5, atol=1e-7)
    full, short = a.step(plain), b.step(shared)
    for key, value in full.items():
        assert short[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_sft_on_shared_prefixes_equals_the_full_rows(tiny_checkpoint, units):
    plain_units = [[{k: v for k, v in r.items() if k != "advantage"} for r in u] for u in units]
    config = LearnerConfig(objective="sft", learning_rate=1e-3)
    plain = batching.collate([r for u in plain_units for r in u], PLAIN)
    shared = shared_prefix.collate_shared(plain_units, SHARED)
    a, b = Learner(load(tiny_checkpoint), config), Learner(load(tiny_checkpoint), config)
    assert b.step(shared)["loss"] == pytest.approx(a.step(plain)["loss"], rel=1e-5)


def test_untrained_tails_are_cut_so_later_images_stay_out_of_the_suffixes():
    rng = np.random.default_rng(1)
    unit = group(rng, 3, 6, [(1, 2, 2)])
    image = [START] + [IMG] * 2 + [END]
    for row in unit[1:]:  # an image after the sampled turn; row 2 trains on nothing (a zero-loss termination)
        row["input_ids"] = np.concatenate([row["input_ids"], np.array(image, np.int32)])
        for key in ("attention_mask", "loss_mask", "sampler_logp"):
            row[key] = np.concatenate([row[key], np.zeros(4, row[key].dtype)])
        row["attention_mask"][-4:] = 1
        row["pixel_values"] = np.concatenate([row["pixel_values"], rng.standard_normal((8, FEATURES), np.float32)])
        row["image_grid_thw"] = np.array([[1, 2, 2], [1, 2, 4]], np.int32)
    unit[2]["loss_mask"][:] = 0
    batch = shared_prefix.collate_shared([unit], SHARED)
    split = int(batch["prefix_length"][0])
    lengths = batch["attention_mask"].sum(axis=1)
    assert lengths[2] == 1 and batch["input_ids"][2, 0] == unit[2]["input_ids"][split]
    for row in (0, 1):
        assert lengths[row] == np.flatnonzero(unit[row]["loss_mask"])[-1] + 1 - split
    assert batch["image_grid_thw"][0].tolist() == [1, 2, 2] and not np.any(batch["input_ids"] == IMG)


def test_shared_prefix_errors_name_the_problem(tiny_checkpoint, units):
    rng = np.random.default_rng(0)
    late_image = group(rng, 2, 5, [(1, 2, 2)])
    late_image[1]["loss_mask"][:3] = 1  # trained before the image: the suffix would hold it
    with pytest.raises(ValueError, match="unit 0: row 0 .* image placeholders between the shared prefix"):
        shared_prefix.collate_shared([late_image], SHARED)
    with pytest.raises(ValueError, match="1..3 units"):
        shared_prefix.collate_shared(units + units, SHARED)
    long_sample = group(rng, 2, 5, [])
    long_sample[0]["input_ids"] = np.concatenate([long_sample[0]["input_ids"], np.full(40, 9, np.int32)])
    for key in ("attention_mask", "loss_mask", "sampler_logp"):
        long_sample[0][key] = np.concatenate([long_sample[0][key], np.ones(40, long_sample[0][key].dtype)])
    with pytest.raises(ValueError, match="unit 0 row 0: its suffix of .* exceeds the largest suffix bucket 32"):
        shared_prefix.collate_shared([long_sample], SHARED)
    batch = shared_prefix.collate_shared(units, SHARED)
    with pytest.raises(ValueError, match="grad_accum_steps is 2"):
        check_batch(batch, dataclasses.replace(GRPO, grad_accum_steps=2), CONFIG)
    bad = dict(batch, prefix_index=np.full(8, 3, np.int32))
    with pytest.raises(ValueError, match=r"prefix_index must be \[8\] ints in \[0, 3\)"):
        check_batch(bad, GRPO, CONFIG)
    with pytest.raises(ValueError, match="Learner.logprobs takes plain rows"):
        Learner(load(tiny_checkpoint), GRPO).logprobs(batch)


@pytest.mark.parametrize("per_token", [False, True], ids=["row-advantages", "token-advantages"])
def test_a_sharded_shared_prefix_step_equals_the_single_device_full_rows(tiny_checkpoint, units, per_token):
    units = with_tree_advantages(units) if per_token else units
    mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
    plain = batching.collate([r for u in units for r in u], PLAIN)
    spec = dataclasses.replace(SHARED, prefix_rows=4)  # prefix rows split over data x fsdp = 4 (one padding row)
    shared = shared_prefix.collate_shared(units, spec)
    single = Learner(load(tiny_checkpoint), GRPO)
    sharded = Learner(load(tiny_checkpoint, mesh=mesh), GRPO, mesh=mesh)
    expected, got = single.step(plain), sharded.step(shared)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    np.testing.assert_allclose(sharded.logprobs(plain), single.logprobs(plain), atol=1e-5)
    with pytest.raises(ValueError, match=r"\(3 rows / grad_accum_steps 1 = 3\) are not divisible"):
        sharded.step(shared_prefix.collate_shared(units, SHARED))


@pytest.mark.parametrize("learner_config", [GRPO, KL_TIS], ids=["sampler", "kl"])
def test_an_update_over_several_batches_is_the_update_of_their_rows_in_one(tiny_checkpoint, units, learner_config):
    # a GRPO round in batches of a few groups: the normalisers are the round's, so the update is the whole one
    whole = shared_prefix.collate_shared(units, SHARED)
    parts = [shared_prefix.collate_shared(units[:2], SHARED), shared_prefix.collate_shared(units[2:], SHARED)]
    a, b = Learner(load(tiny_checkpoint), learner_config), Learner(load(tiny_checkpoint), learner_config)
    one, many = a.step(whole), b.accumulated_step(parts)
    assert set(one) == set(many) and b.step_count == 1
    for key, value in one.items():
        assert many[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    plain = batching.collate([r for u in units for r in u], PLAIN)
    np.testing.assert_allclose(b.logprobs(plain), a.logprobs(plain), rtol=1e-5, atol=1e-5)
    # each part alone is another update: the shares are parts of the whole, not means of their own
    c = Learner(load(tiny_checkpoint), learner_config)
    assert c.step(parts[0])["loss"] != pytest.approx(one["loss"], rel=1e-3)


def test_an_update_over_several_plain_batches_on_a_mesh_is_the_single_device_update(tiny_checkpoint, units):
    mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
    rows = [r for u in units for r in u]
    spec = dataclasses.replace(PLAIN, batch_size=4)
    sft = LearnerConfig(objective="sft", learning_rate=1e-3)
    plain_rows = [{k: v for k, v in r.items() if k != "advantage"} for r in rows]
    single = Learner(load(tiny_checkpoint), sft)
    sharded = Learner(load(tiny_checkpoint, mesh=mesh), sft, mesh=mesh)
    expected = single.step(batching.collate(plain_rows, PLAIN))
    got = sharded.accumulated_step([batching.collate(plain_rows[:4], spec), batching.collate(plain_rows[4:], spec)])
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    full = batching.collate(plain_rows, PLAIN)  # Adam turns summation-order differences into last bits
    np.testing.assert_allclose(sharded.logprobs(full), single.logprobs(full), rtol=1e-5, atol=1e-5)


def test_accumulated_step_errors_name_the_batch(tiny_checkpoint, units):
    learner = Learner(load(tiny_checkpoint), GRPO)
    with pytest.raises(ValueError, match="needs at least one batch; got none"):
        learner.accumulated_step([])
    good = shared_prefix.collate_shared(units[:2], SHARED)
    bad = {k: v for k, v in shared_prefix.collate_shared(units[2:], SHARED).items() if k != "advantages"}
    with pytest.raises(ValueError, match=r"batch 1 of 2: the batch lacks \['advantages'\]"):
        learner.accumulated_step([good, bad])
    assert learner.step_count == 0


def zeroed(unit):
    """The unit's rows with advantage 0 (a group whose rewards were all equal)."""
    return [{**r, "advantage": np.float32(0.0)} for r in unit]


@pytest.mark.parametrize("learner_config", [GRPO, dataclasses.replace(KL_TIS, kl_coef=0.0)],
                         ids=["sampler", "learner-tis"])
def test_zero_advantage_batches_are_skipped_with_the_same_update(tiny_checkpoint, units, learner_config):
    signal = shared_prefix.collate_shared([units[0], units[2]], SHARED)
    parts = [signal, shared_prefix.collate_shared([zeroed(units[1])], SHARED)]
    a, b = Learner(load(tiny_checkpoint), learner_config), Learner(load(tiny_checkpoint), learner_config)
    run_all, skipped = a.accumulated_step(parts), b.accumulated_step(parts, skip_zero_advantage=True)
    assert skipped["skipped_batches"] == 1 and skipped["skipped_tokens"] == parts[1]["loss_mask"].sum()
    for key in ("loss", "grad_norm", "tokens"):  # the zero batch adds only its counts to the normalisers
        assert skipped[key] == run_all[key], key
    plain = batching.collate([r for u in units for r in u], PLAIN)
    np.testing.assert_array_equal(b.logprobs(plain), a.logprobs(plain))  # the same parameters, to the bit
    # the objective's token means are over the batches run: those of the signal batch as an update of its own
    alone = Learner(load(tiny_checkpoint), learner_config).step(signal)
    for key in ("approx_kl", "ratio_mean", "clip_frac_low", "sampler_logp_gap", "ratio_max"):
        assert skipped[key] == pytest.approx(alone[key], rel=1e-5, abs=1e-7), key
    gap = max(("approx_kl", "sampler_logp_gap"), key=lambda k: abs(alone[k]))  # the one this config makes nonzero
    assert run_all[gap] != pytest.approx(alone[gap], rel=1e-3)  # run, the zero batch's tokens dilute it


def test_zero_advantage_batches_run_when_a_kl_term_or_nothing_else_is_there(tiny_checkpoint, units):
    zero = [shared_prefix.collate_shared([zeroed(u)], SHARED) for u in units]
    with_kl = Learner(load(tiny_checkpoint), KL_TIS)
    assert with_kl.accumulated_step(zero, skip_zero_advantage=True)["skipped_batches"] == 0  # the KL term trains
    learner = Learner(load(tiny_checkpoint), GRPO)
    metrics = learner.accumulated_step(zero, skip_zero_advantage=True)  # one is run: the optimizer still steps
    assert metrics["skipped_batches"] == 2 and metrics["grad_norm"] == 0.0 and learner.step_count == 1
    one = learner.accumulated_step(zero[:1], skip_zero_advantage=True)
    assert one["skipped_batches"] == 0 and learner.step_count == 2


def test_fewer_units_take_a_smaller_batch_with_the_same_update(tiny_checkpoint, units):
    # prefix_row_buckets (1, 2) of 3 prefix rows and 9 suffix rows: a bucket of b prefix rows has 9·b/3 suffix rows
    spec = dataclasses.replace(SHARED, batch_size=9, prefix_rows=3, prefix_row_buckets=(1, 2))
    small = shared_prefix.collate_shared(units[2:], spec)  # one unit of 2 rows: bucket 1 holds 3 suffix rows
    assert small["prefix_input_ids"].shape[0] == 1 and small["input_ids"].shape[0] == 3
    pair = shared_prefix.collate_shared(units[1:], spec)  # two units, 4 rows: bucket 2 (6 rows)
    assert pair["prefix_input_ids"].shape[0] == 2 and pair["input_ids"].shape[0] == 6
    crowded = shared_prefix.collate_shared([units[0], units[0]], spec)  # two units but 6 rows: bucket 2 holds them
    assert crowded["input_ids"].shape[0] == 6
    whole = shared_prefix.collate_shared(units, spec)  # three units: the full batch
    assert whole["prefix_input_ids"].shape[0] == 3 and whole["input_ids"].shape[0] == 9
    full_size = [shared_prefix.collate_shared(units[:2], SHARED), shared_prefix.collate_shared(units[2:], SHARED)]
    bucketed = [shared_prefix.collate_shared(units[:2], spec), small]
    assert full_size[1]["input_ids"].shape[0] == 8
    a, b = Learner(load(tiny_checkpoint), GRPO), Learner(load(tiny_checkpoint), GRPO)
    one, many = a.accumulated_step(full_size), b.accumulated_step(bucketed)
    for key, value in one.items():  # padding rows add nothing: the same update from the smaller batch
        assert many[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    plain = batching.collate([r for u in units for r in u], PLAIN)
    np.testing.assert_allclose(b.logprobs(plain), a.logprobs(plain), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("buckets, match", [
    ((2, 1), "strictly ascending"), ((0,), ">= 1"), ((3,), "below prefix_rows 3"),
    ((2,), r"batch_size 8 x bucket must be a multiple of prefix_rows 3")])
def test_prefix_row_buckets_are_checked(buckets, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(SHARED, prefix_row_buckets=buckets)
    with pytest.raises(ValueError, match="needs prefix_rows >= 1"):
        dataclasses.replace(PLAIN, prefix_row_buckets=(1,))
