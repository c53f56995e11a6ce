"""collate: bucket shapes, padding rows, and the image padding scheme (accepted by the model, invisible to it)."""

import dataclasses

import numpy as np
import pytest

from ranger_jax.data import batching
from ranger_jax.models.qwen3_vl import Qwen3VLConfig, init
from ranger_jax.models.qwen3_vl.model import check_inputs

PAD, IMG = 0, 5  # Qwen3VLConfig.tiny(): image_token_id 5, vocabulary 256
SPEC = batching.BatchSpec(batch_size=3, length_buckets=(32, 64, 96), pad_id=PAD, image_pad_id=IMG, merge_size=2,
                          patch_features=1536, patch_step=32, image_step=4)


def example(rng, text_before: int, grids=(), text_after: int = 3, features: int = 1536, version: int = 2, **extra):
    """A row: text, then per image vision_start + its pads + vision_end, then text; loss on the last tokens."""
    ids = list(rng.integers(10, 256, text_before))
    for t, h, w in grids:
        ids += [3] + [IMG] * (t * h * w // 4) + [4]
    ids += list(rng.integers(10, 256, text_after))
    loss = np.zeros(len(ids), np.float32)
    loss[-text_after:] = 1
    patches = sum(t * h * w for t, h, w in grids)
    return {"input_ids": np.array(ids, np.int32), "attention_mask": np.ones(len(ids), np.int32), "loss_mask": loss,
            "sampler_logp": -loss * rng.random(len(ids)).astype(np.float32),
            "pixel_values": rng.standard_normal((patches, features)).astype(np.float32),
            "image_grid_thw": np.array(grids, np.int32).reshape(-1, 3), "policy_version": np.int32(version), **extra}


def test_rows_padded_to_a_bucket_with_padding_rows_and_images_at_static_sizes():
    rng = np.random.default_rng(0)
    rows = [example(rng, 5, [(1, 4, 4)], advantage=np.float32(0.5), reward=np.float32(1.0)),
            example(rng, 20, [(1, 2, 4), (1, 4, 6)], advantage=np.float32(-0.5), reward=np.float32(0.0))]
    keys = ["advantages", "attention_mask", "image_grid_thw", "input_ids", "loss_mask", "pixel_values",
            "policy_version", "row_valid", "sampler_logp"]  # the learner's contract; reward only fed advantages
    batch = batching.collate(rows, SPEC)
    lengths = [len(r["input_ids"]) for r in rows]  # 14 and 35
    assert batch["input_ids"].shape == (3, 64) and batch["input_ids"].dtype == np.int32
    assert batch["row_valid"].tolist() == [1, 1, 0] and batch["policy_version"].tolist() == [2, 2, -1]
    assert sorted(batch) == keys and batch["advantages"].tolist() == [0.5, -0.5, 0.0]
    for r, n in enumerate(lengths):
        np.testing.assert_array_equal(batch["input_ids"][r, :n], rows[r]["input_ids"])
        np.testing.assert_array_equal(batch["loss_mask"][r, :n], rows[r]["loss_mask"])
        np.testing.assert_array_equal(batch["sampler_logp"][r, :n], rows[r]["sampler_logp"])
        assert (batch["input_ids"][r, n:] == PAD).all()
        assert batch["attention_mask"][r].tolist() == [1] * n + [0] * (64 - n)
    # images: 3 real (16 + 8 + 24 = 48 patches); N = 4 (a multiple of 4 holding one padding image more);
    # P = 64 (a multiple of 32 >= 48 + 4); the padding image owns the 16 spare patches = 4 placeholder tokens
    # in padding row 2, the shortest
    assert batch["image_grid_thw"].tolist() == [[1, 4, 4], [1, 2, 4], [1, 4, 6], [1, 2, 8]]
    expected = np.concatenate([rows[0]["pixel_values"], rows[1]["pixel_values"], np.zeros((16, 1536), np.float32)])
    np.testing.assert_array_equal(batch["pixel_values"], expected)
    assert batch["input_ids"][2, :4].tolist() == [IMG] * 4 and (batch["input_ids"][2, 4:] == PAD).all()
    assert batch["attention_mask"][2].tolist() == [1] * 4 + [0] * 60 and not batch["loss_mask"][2].any()
    check_inputs(Qwen3VLConfig.tiny(), batch["input_ids"], batch["attention_mask"], batch["pixel_values"],
                 batch["image_grid_thw"])


def test_image_padding_goes_after_the_shortest_full_row_and_grows_the_bucket_when_needed():
    rng = np.random.default_rng(1)
    spec = dataclasses.replace(SPEC, batch_size=2, patch_step=64, image_step=2)
    rows = [example(rng, 40, [(1, 2, 2)], text_after=6), example(rng, 20, [(1, 4, 4)], text_after=5)]  # 49, 31
    batch = batching.collate(rows, spec)
    # real: 2 images, 20 patches -> N = 4 (k = 2), P = 64: Q = 11 tokens, grids (1, 2, 20) + filler (1, 2, 2);
    # row 1 (31 tokens) hosts them: 42 <= 64
    assert batch["image_grid_thw"].tolist() == [[1, 2, 2], [1, 4, 4], [1, 2, 20], [1, 2, 2]]
    assert batch["input_ids"].shape == (2, 64)
    assert batch["input_ids"][1, 31:42].tolist() == [IMG] * 11 and batch["attention_mask"][1, :42].all()
    check_inputs(Qwen3VLConfig.tiny(), batch["input_ids"], batch["attention_mask"], batch["pixel_values"],
                 batch["image_grid_thw"])
    tight = [example(rng, 55, [], text_after=5), example(rng, 50, [], text_after=5)]  # 60 and 55 tokens
    batch = batching.collate(tight, spec)  # 55 + 16 padding placeholders > 64: the next bucket
    assert batch["input_ids"].shape == (2, 96) and batch["image_grid_thw"].tolist() == [[1, 2, 30], [1, 2, 2]]
    assert batch["input_ids"][1, 55:71].tolist() == [IMG] * 16 and batch["pixel_values"].shape == (64, 1536)


def test_text_only_spec_and_headroom():
    rng = np.random.default_rng(2)
    text = dataclasses.replace(SPEC, image_pad_id=None)
    batch = batching.collate([example(rng, 40, [])], text)
    assert sorted(batch) == ["attention_mask", "input_ids", "loss_mask", "policy_version", "row_valid", "sampler_logp"]
    assert batch["input_ids"].shape == (3, 64)
    assert text.max_row_length == 96 and SPEC.image_headroom == 32 // 4 + 4 and SPEC.max_row_length == 84


@pytest.mark.parametrize("rows, spec, match", [
    (lambda r: [example(r, 90, [])], SPEC, r"row 0 has 93 tokens, above max_row_length 84 \(largest bucket 96 less "
                                           r"image headroom 12\)"),
    (lambda r: [example(r, 5, [(1, 2, 2)])], dataclasses.replace(SPEC, image_pad_id=None),
     r"row 0 has 1 images but the batch spec is text-only"),
    (lambda r: [{**example(r, 5, [(1, 2, 2)]), "image_grid_thw": np.array([[1, 2, 4]], np.int32)}], SPEC,
     r"row 0: pixel_values shape \(4, 1536\) != \(patches of image_grid_thw 8, 1536\)"),
    (lambda r: [{**example(r, 5, [(1, 2, 2)]), "pixel_values": np.zeros((16, 1536), np.float32),
                 "image_grid_thw": np.array([[1, 4, 4]], np.int32)}], SPEC,
     r"row 0: 1 image_pad tokens \(5\) != merged patches 4"),
    (lambda r: [example(r, 5, [], advantage=np.float32(1)), example(r, 5, [])], SPEC,
     r"row 1 lacks an advantage but row 0 carries one"),
    (lambda r: [example(r, 5, [], advantage=np.float32(1), token_advantage=np.zeros(8, np.float32)),
                example(r, 5, [], advantage=np.float32(1))], SPEC,
     r"row 1 lacks a token_advantage but row 0 carries one"),
    (lambda r: [example(r, 5, [], token_advantage=np.zeros(8, np.float32))], SPEC,
     r"row 0 carries a token_advantage without an advantage"),
    (lambda r: [example(r, 5, [], advantage=np.float32(1), token_advantage=np.zeros(5, np.float32))], SPEC,
     r"row 0: token_advantage has 5 values for 8 tokens"),
    (lambda r: [{**example(r, 5, []), "loss_mask": np.zeros(3, np.float32)}], SPEC,
     r"row 0: loss_mask shape \(3,\) != input_ids shape \(8,\)"),
    (lambda r: [example(r, 5, [])] * 4, SPEC, r"collate takes 1..3 examples, got 4"),
])
def test_collate_errors_name_the_row(rows, spec, match):
    with pytest.raises(ValueError, match=match):
        batching.collate(rows(np.random.default_rng(3)), spec)


def test_spec_errors():
    with pytest.raises(ValueError, match=r"length_buckets must be positive and strictly ascending, got \[64, 32\]"):
        dataclasses.replace(SPEC, length_buckets=(64, 32))
    with pytest.raises(ValueError, match=r"patch_step=30 must be a multiple of merge_size² \(4\)"):
        dataclasses.replace(SPEC, patch_step=30)
    with pytest.raises(ValueError, match=r"largest length bucket \(8\) leaves no room .* headroom \(12 tokens\)"):
        dataclasses.replace(SPEC, length_buckets=(8,))
    with pytest.raises(ValueError, match="100 tokens exceed the largest length bucket 96"):
        SPEC.length_bucket(100)


def test_padded_batch_gives_the_logits_of_the_unpadded_one():
    """The padding images change no real token's logits: compare with the same rows and only their real images
    (the placeholders they would add are plain padding there). The einsum kernel compiles fastest."""
    config = Qwen3VLConfig.tiny(attention="einsum")
    model = init(config, seed=0)
    rng = np.random.default_rng(4)
    rows = [example(rng, 3, [(1, 4, 4)], text_after=4), example(rng, 6, [(1, 2, 4), (1, 4, 4)], text_after=5)]
    batch = batching.collate(rows, dataclasses.replace(SPEC, batch_size=2))
    host = 0  # rows of 11 and 25 tokens: the shorter hosts the padding placeholders
    assert batch["attention_mask"][host].sum() > len(rows[host]["input_ids"])
    padded = np.asarray(model(batch["input_ids"], attention_mask=batch["attention_mask"],
                              pixel_values=batch["pixel_values"], image_grid_thw=batch["image_grid_thw"]))
    plain_ids, plain_mask = batch["input_ids"].copy(), np.zeros_like(batch["attention_mask"])
    for r, row in enumerate(rows):
        n = len(row["input_ids"])
        plain_ids[r, n:], plain_mask[r, :n] = PAD, 1
    reference = np.asarray(model(plain_ids, attention_mask=plain_mask,
                                 pixel_values=np.concatenate([r["pixel_values"] for r in rows]),
                                 image_grid_thw=np.concatenate([r["image_grid_thw"] for r in rows])))
    real = plain_mask.astype(bool)
    np.testing.assert_allclose(padded[real], reference[real], rtol=0, atol=1e-5)
