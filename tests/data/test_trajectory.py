"""Trajectory validation (every error message) and the pickle-free record format."""
import dataclasses
import io
import struct

import numpy as np
import pytest
from PIL import Image

from ranger_jax.data import trajectory
from ranger_jax.env import core

PAD = trajectory.IMAGE_PAD_ID


def test_roundtrip_is_exact(make_trajectory):
    original = make_trajectory(3, num_images=3)
    data = original.to_bytes()
    assert data[:8] == trajectory.MAGIC and b"pickle" not in data
    restored = trajectory.Trajectory.from_bytes(data)
    assert restored == original and restored.to_bytes() == data
    assert restored.token_ids.dtype == np.int32 and restored.loss_mask.dtype == np.int8
    assert restored.sampler_logprobs.dtype == np.float32
    assert restored.images[2].parent_id == "IMG_001" and restored.answer == original.answer
    assert restored.images[0].png == original.images[0].png and restored.generated_image == original.generated_image
    assert restored != make_trajectory(4)


def test_minimal_trajectory_roundtrip():
    minimal = trajectory.Trajectory(task_id="t", group_id="g", sample_index=0, policy_version=0,
                                    token_ids=[], loss_mask=[], sampler_logprobs=[], generation_error="timeout")
    restored = trajectory.Trajectory.from_bytes(minimal.to_bytes())
    assert restored == minimal and restored.num_tokens == 0 and restored.answer is None
    assert restored.generation_error == "timeout"


def test_arrays_are_read_only_and_to_arrays(make_trajectory):
    t = make_trajectory(1)
    with pytest.raises(ValueError):
        t.token_ids[0] = 5
    arrays = t.to_arrays()
    assert arrays["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]
    assert arrays["image_token_index"].tolist() == [im.token_index for im in t.images]
    assert arrays["reward"].dtype == np.float32 and arrays["policy_version"] == 3 and len(arrays["images"]) == 2
    assert t.num_tokens == len(arrays["token_ids"]) == len(arrays["loss_mask"])


def test_image_runs():
    assert trajectory.image_runs([1, PAD, PAD, 2, PAD, 3, PAD]) == [(1, 2), (4, 1), (6, 1)]
    assert trajectory.image_runs([1, 2]) == []


def shifted(t, name, value):
    return dataclasses.replace(t, **{name: value})


@pytest.mark.parametrize("mutate, message", [
    (lambda t: shifted(t, "loss_mask", t.loss_mask[:-1]), r"loss_mask has \d+ entries but token_ids has \d+"),
    (lambda t: shifted(t, "sampler_logprobs", t.sampler_logprobs[1:]), r"sampler_logprobs has \d+ entries"),
    (lambda t: shifted(t, "token_ids", t.token_ids.reshape(1, -1)), r"token_ids must be 1-D \[T\], got shape \(1, "),
    (lambda t: shifted(t, "token_ids", t.token_ids.astype(float)), "token_ids must hold integers, got dtype float64"),
    (lambda t: shifted(t, "loss_mask", np.where(t.loss_mask == 1, 2, 0)), r"loss_mask must be 0/1; loss_mask\[\d+\] = 2"),
    (lambda t: shifted(t, "sampler_logprobs", np.where(t.loss_mask == 1, np.nan, 0)), r"sampler_logprobs\[\d+\] is not finite"),
    (lambda t: shifted(t, "sampler_logprobs", np.full(t.num_tokens, -0.5)), r"sampler_logprobs\[0\] = -0.5 where loss_mask is 0"),
    (lambda t: shifted(t, "sample_index", -1), "sample_index must be >= 0, got -1"),
    (lambda t: shifted(t, "policy_version", "step_3"), "policy_version must be an int, got str 'step_3'"),
    (lambda t: shifted(t, "task_id", 7), "task_id must be a str, got int"),
    (lambda t: shifted(t, "reward", float("inf")), "reward must be finite, got inf"),
    (lambda t: shifted(t, "generated_image", b"GIF89a"), "generated_image must be PNG-encoded bytes"),
    (lambda t: shifted(t, "generation_error", "boom"), r"generated_image and generation_error are both set \('boom'\)"),
    (lambda t: shifted(t, "answer", {"gen_prompt": "x"}), "answer must be an env.core.Answer or None, got dict"),
    (lambda t: shifted(t, "messages", ({"content": "no role"},)), r"messages\[0\] must be a dict with a 'role'"),
    (lambda t: shifted(t, "metadata", {"when": object()}), "trajectory field 'metadata' must be JSON-serialisable"),
    (lambda t: shifted(t, "timings", {"x": float("nan")}), "trajectory field 'timings' must be JSON-serialisable"),
])
def test_validation_errors(make_trajectory, mutate, message):
    with pytest.raises(ValueError, match=message):
        mutate(make_trajectory(0))


def moved(t, index, **changes):
    images = list(t.images)
    images[index] = dataclasses.replace(images[index], **changes)
    return dataclasses.replace(t, images=tuple(images))


@pytest.mark.parametrize("mutate, message", [
    (lambda t: moved(t, 1, grid_thw=(1, 4, 8)), r"image 1 \(IMG_002\) expects 8 image_pad tokens \(grid_thw=\[1, 4, 8\], "
                                                r"merge_size=2\) at token \d+, found 4 there"),
    (lambda t: moved(t, 0, token_index=5), r"image 0 \(IMG_001\) expects 4 image_pad tokens .* at token 5, found 3 there"),
    (lambda t: moved(t, 0, grid_thw=(1, 3, 4)), r"grid_thw=\[1, 3, 4\] not divisible by merge_size=2"),
    (lambda t: dataclasses.replace(t, images=t.images[:1]), r"token_ids hold 8 image_pad tokens \(151655\) but the 1 "
                                                              r"images account for 4"),
    (lambda t: dataclasses.replace(t, images=t.images[::-1]), r"image 1 \(IMG_001\) starts at token 4, inside the "
                                                                r"previous image's run ending at"),
    (lambda t: dataclasses.replace(t, image_pad_id=151644), r"image 0 \(IMG_001\) expects 4 image_pad tokens"),
    (lambda t: dataclasses.replace(t, merge_size=0), "merge_size must be >= 1, got 0"),
])
def test_placeholder_errors_name_the_counts(make_trajectory, mutate, message):
    with pytest.raises(ValueError, match=message):
        mutate(make_trajectory(0))


def test_placeholder_run_start_and_training_mask(make_trajectory):
    t = make_trajectory(0, num_images=1)
    start = t.images[0].token_index
    ids = t.token_ids.copy()
    ids[start - 1] = PAD  # the recorded index is not the first pad of the run
    with pytest.raises(ValueError, match=rf"token {start - 1} before its run is also image_pad"):
        dataclasses.replace(t, token_ids=ids, images=(dataclasses.replace(t.images[0], token_index=start),))
    mask = t.loss_mask.copy()
    mask[start] = 1
    logprobs = t.sampler_logprobs.copy()
    logprobs[start] = -0.1
    with pytest.raises(ValueError, match=rf"loss_mask is 1 on image_pad token {start}"):
        dataclasses.replace(t, loss_mask=mask, sampler_logprobs=logprobs)


def test_image_errors():
    good = io.BytesIO()
    Image.new("RGB", (2, 2)).save(good, "PNG")
    rgba = io.BytesIO()
    Image.new("RGBA", (2, 2)).save(rgba, "PNG")
    with pytest.raises(ValueError, match="image IMG_009: png must be PNG-encoded bytes"):
        trajectory.TrajectoryImage(b"\xff\xd8jpeg", (1, 2, 2), 0, "IMG_009")
    with pytest.raises(ValueError, match="image at token 3: PNG mode is RGBA, expected RGB"):
        trajectory.TrajectoryImage(rgba.getvalue(), (1, 2, 2), 3)
    with pytest.raises(ValueError, match=r"grid_thw must be three positive ints, got \[1, 0, 2\]"):
        trajectory.TrajectoryImage(good.getvalue(), (1, 0, 2), 0, "IMG_001")
    with pytest.raises(ValueError, match="token_index must be >= 0, got -2"):
        trajectory.TrajectoryImage(good.getvalue(), (1, 2, 2), -2, "IMG_001")
    image = trajectory.TrajectoryImage(good.getvalue(), (2, 4, 6), 0, "IMG_001")
    assert image.num_tokens() == 12 and image.num_tokens(merge_size=1) == 48 and image.pil().size == (2, 2)


def test_corrupt_records_are_refused(make_trajectory):
    data = make_trajectory(0).to_bytes()
    with pytest.raises(ValueError, match=r"not a trajectory record: magic b'XXXXXXXX'"):
        trajectory.Trajectory.from_bytes(b"XXXXXXXX" + data[8:])
    with pytest.raises(ValueError, match="trajectory record truncated: blob ends at"):
        trajectory.Trajectory.from_bytes(data[:-10])
    with pytest.raises(ValueError, match="trajectory record truncated: header ends at"):
        trajectory.Trajectory.from_bytes(data[:40])
    with pytest.raises(ValueError, match="trajectory record truncated: 10 bytes"):
        trajectory.Trajectory.from_bytes(data[:10])
    head = b'{"task_id": "t"}'
    with pytest.raises(ValueError, match="malformed trajectory record header: KeyError"):
        trajectory.Trajectory.from_bytes(trajectory.MAGIC + struct.pack("<Q", len(head)) + head)


def test_answer_types_roundtrip(make_trajectory):
    answer = core.Answer("", ())
    t = make_trajectory(0, answer=answer, termination=core.ANSWER_PARSE_FAILED)
    assert trajectory.Trajectory.from_bytes(t.to_bytes()).answer == answer


def test_adjacent_image_runs_and_unreadable_png(make_trajectory):
    good = io.BytesIO()
    Image.new("RGB", (2, 2)).save(good, "PNG")
    a = trajectory.TrajectoryImage(good.getvalue(), (1, 2, 2), 1, "IMG_001")
    b = trajectory.TrajectoryImage(good.getvalue(), (1, 4, 2), 2, "IMG_002")  # starts right where IMG_001 ends
    t = trajectory.Trajectory(task_id="t", group_id="g", sample_index=0, policy_version=0,
                              token_ids=[7, PAD, PAD, PAD, 8], loss_mask=np.zeros(5, np.int8),
                              sampler_logprobs=np.zeros(5), images=(a, b))
    assert [im.token_index for im in trajectory.Trajectory.from_bytes(t.to_bytes()).images] == [1, 2]
    with pytest.raises(ValueError, match="image 1 .IMG_002. expects 2 image_pad tokens .* at token 3, found 1"):
        dataclasses.replace(t, images=(a, dataclasses.replace(b, token_index=3)))
    with pytest.raises(ValueError, match="image IMG_004: png is not a readable PNG"):
        trajectory.TrajectoryImage(good.getvalue()[:12] + b"\x00" * 20, (1, 2, 2), 0, "IMG_004")
    record = bytearray(make_trajectory(0).to_bytes())
    start = record.index(b"\x89PNG", 16)
    record[start + 12:start + 16] = b"XXXX"  # the first image's IHDR chunk type
    with pytest.raises(ValueError, match="image IMG_001: png is not a readable PNG"):
        trajectory.Trajectory.from_bytes(bytes(record))
