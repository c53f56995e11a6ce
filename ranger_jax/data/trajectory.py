"""The trajectory record: exactly what the policy saw and did in one episode, plus its reward.

A `Trajectory` is validated on construction (array lengths agree, loss mask is 0/1, sampler log-probs are 0
where the mask is 0, every image's `<|image_pad|>` run sits at its recorded token index with the length its
grid implies, and no stray pad token exists), so a record that reaches the learner is self-consistent.

Serialisation is pickle-free: `MAGIC`, an 8-byte little-endian header length, a UTF-8 JSON header, then the
raw blobs (arrays in little-endian order, PNG bytes) the header points into by offset.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image

from ranger_jax.env import core

IMAGE_PAD_ID = 151655  # Qwen3-VL `<|image_pad|>`: only the default of `Trajectory.image_pad_id`; writers pass
# the tokenizer's id and readers take it from the record, so a tokenizer with other ids works end to end
MERGE_SIZE = 2  # vision_config.spatial_merge_size: placeholders per image = t·h·w / merge²
MAGIC = b"RJTRAJ01"
_PNG = b"\x89PNG\r\n\x1a\n"
_ARRAYS = {"token_ids": np.int32, "loss_mask": np.int8, "sampler_logprobs": np.float32}


def _frozen_array(values: Any, dtype: type, name: str) -> np.ndarray:
    array = np.array(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D [T], got shape {array.shape}")
    if dtype is not np.float32 and array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
    array = array.astype(dtype)
    array.flags.writeable = False
    return array


def _json_field(value: Any, name: str) -> Any:
    """`value` round-tripped through JSON (plain dicts/lists), or ValueError naming the field."""
    try:
        return json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise ValueError(f"trajectory field {name!r} must be JSON-serialisable: {err}") from err


@dataclasses.dataclass(frozen=True)
class TrajectoryImage:
    """One image as the policy's processor received it.

    Attributes:
        png: PNG-encoded RGB pixels, exactly what was preprocessed.
        grid_thw: (t, h, w) patch grid from preprocessing.
        token_index: position in `token_ids` of its first `<|image_pad|>` token.
        img_id: the `IMG_###` id the policy knew it by (None for images without one).
        parent_id: for a crop, the id of the image it was cut from.
    """

    png: bytes
    grid_thw: tuple[int, int, int]
    token_index: int
    img_id: str | None = None
    parent_id: str | None = None

    def __post_init__(self):
        label = self.img_id or f"at token {self.token_index}"
        if not isinstance(self.png, (bytes, bytearray)) or bytes(self.png[:8]) != _PNG:
            raise ValueError(f"image {label}: png must be PNG-encoded bytes")
        object.__setattr__(self, "png", bytes(self.png))
        grid = tuple(int(g) for g in self.grid_thw)
        if len(grid) != 3 or min(grid) < 1:
            raise ValueError(f"image {label}: grid_thw must be three positive ints, got {list(self.grid_thw)}")
        object.__setattr__(self, "grid_thw", grid)
        if int(self.token_index) < 0:
            raise ValueError(f"image {label}: token_index must be >= 0, got {self.token_index}")
        object.__setattr__(self, "token_index", int(self.token_index))
        try:
            with Image.open(io.BytesIO(self.png)) as header:  # reads the header only
                mode = header.mode
        except (OSError, SyntaxError) as err:  # PIL's "cannot identify image file", truncated headers
            raise ValueError(f"image {label}: png is not a readable PNG: {err}") from err
        if mode != "RGB":
            raise ValueError(f"image {label}: PNG mode is {mode}, expected RGB")

    def num_tokens(self, merge_size: int = MERGE_SIZE) -> int:
        """Placeholder tokens of this image: t·h·w / merge_size²."""
        t, h, w = self.grid_thw
        return t * h * w // (merge_size * merge_size)

    def pil(self) -> Image.Image:
        """The image as a PIL RGB image, decoded from its PNG."""
        with Image.open(io.BytesIO(self.png)) as image:
            image.load()
            return image.copy()


@dataclasses.dataclass(frozen=True, eq=False)
class Trajectory:
    """One episode for the learner (token-exact) and for people (messages, images, rewards).

    Attributes:
        task_id / group_id / sample_index: the task, its GRPO group, and this sample's index in the group.
        policy_version: weight version that sampled it (staleness control).
        token_ids: [T] int32, the prompt and every turn, as the policy saw and produced them.
        loss_mask: [T] int8, 1 on tokens the policy generated, 0 elsewhere.
        sampler_logprobs: [T] float32, the sampler's log-prob of each generated token, 0 where the mask is 0.
        images: every image in the sequence, in token order.
        termination: the episode's termination label.
        reward / reward_breakdown: the scalar reward and how it was reached (JSON, e.g.
            `rewards.combine.RewardBreakdown.to_dict()`).
        answer: the parsed final answer, if any.
        messages: the conversation for viewing (ChatML dicts; content a string or parts
            `{"type": "text", "text"}` / `{"type": "image", "img_id"}`).
        generated_image / generation_error: the generator's PNG, or why there is none.
        timings: seconds per phase (JSON numbers). metadata: anything else (JSON).
        image_pad_id / merge_size: how placeholders are checked.
    """

    task_id: str
    group_id: str
    sample_index: int
    policy_version: int
    token_ids: np.ndarray
    loss_mask: np.ndarray
    sampler_logprobs: np.ndarray
    images: tuple[TrajectoryImage, ...] = ()
    termination: str | None = None
    reward: float = 0.0
    reward_breakdown: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    answer: core.Answer | None = None
    messages: tuple[Mapping[str, Any], ...] = ()
    generated_image: bytes | None = None
    generation_error: str | None = None
    timings: Mapping[str, float] = dataclasses.field(default_factory=dict)
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    image_pad_id: int = IMAGE_PAD_ID
    merge_size: int = MERGE_SIZE

    def __post_init__(self):
        for name, dtype in _ARRAYS.items():
            object.__setattr__(self, name, _frozen_array(getattr(self, name), dtype, name))
        n = len(self.token_ids)
        for name in ("loss_mask", "sampler_logprobs"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries but token_ids has {n}")
        bad = np.flatnonzero((self.loss_mask != 0) & (self.loss_mask != 1))
        if bad.size:
            raise ValueError(f"loss_mask must be 0/1; loss_mask[{bad[0]}] = {self.loss_mask[bad[0]]}")
        if not np.all(np.isfinite(self.sampler_logprobs)):
            raise ValueError(f"sampler_logprobs[{np.flatnonzero(~np.isfinite(self.sampler_logprobs))[0]}] is not finite")
        stray = np.flatnonzero((self.loss_mask == 0) & (self.sampler_logprobs != 0))
        if stray.size:
            raise ValueError(f"sampler_logprobs[{stray[0]}] = {self.sampler_logprobs[stray[0]]} where loss_mask is 0 "
                             "(must be 0)")
        for name in ("task_id", "group_id"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a str, got {type(getattr(self, name)).__name__}")
        for name in ("sample_index", "policy_version"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            object.__setattr__(self, name, int(value))
        if self.sample_index < 0:
            raise ValueError(f"sample_index must be >= 0, got {self.sample_index}")
        if not math.isfinite(self.reward):
            raise ValueError(f"reward must be finite, got {self.reward}")
        if self.generated_image is not None and bytes(self.generated_image[:8]) != _PNG:
            raise ValueError("generated_image must be PNG-encoded bytes")
        if self.generated_image is not None and self.generation_error is not None:
            raise ValueError(f"generated_image and generation_error are both set ({self.generation_error!r})")
        object.__setattr__(self, "images", tuple(self.images))
        if self.answer is not None and not isinstance(self.answer, core.Answer):
            raise ValueError(f"answer must be an env.core.Answer or None, got {type(self.answer).__name__}")
        messages = _json_field(list(self.messages), "messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise ValueError(f"messages[{i}] must be a dict with a 'role'")
        object.__setattr__(self, "messages", tuple(messages))
        for name in ("reward_breakdown", "timings", "metadata"):
            object.__setattr__(self, name, _json_field(dict(getattr(self, name)), name))
        self._check_placeholders()

    def _check_placeholders(self) -> None:
        if self.merge_size < 1:
            raise ValueError(f"merge_size must be >= 1, got {self.merge_size}")
        is_pad = self.token_ids == self.image_pad_id
        end = 0
        for i, image in enumerate(self.images):
            label = f"image {i} ({image.img_id})" if image.img_id else f"image {i}"
            t, h, w = image.grid_thw
            if h % self.merge_size or w % self.merge_size:
                raise ValueError(f"{label}: grid_thw={list(image.grid_thw)} not divisible by merge_size={self.merge_size}")
            start, count = image.token_index, image.num_tokens(self.merge_size)
            if start < end:
                raise ValueError(f"{label} starts at token {start}, inside the previous image's run ending at {end}")
            run = is_pad[start:start + count]
            found = int(run.sum())
            if start + count > len(self.token_ids) or found != count:
                raise ValueError(f"{label} expects {count} image_pad tokens (grid_thw={list(image.grid_thw)}, "
                                 f"merge_size={self.merge_size}) at token {start}, found {found} there")
            if start > end and is_pad[start - 1]:  # (a pad at start - 1 == end is the previous image's last)
                raise ValueError(f"{label}: token {start - 1} before its run is also image_pad "
                                 f"(token_index {start} is not the run's first placeholder)")
            end = start + count
        total, expected = int(is_pad.sum()), sum(im.num_tokens(self.merge_size) for im in self.images)
        if total != expected:
            raise ValueError(f"token_ids hold {total} image_pad tokens ({self.image_pad_id}) but the "
                             f"{len(self.images)} images account for {expected}")
        masked = np.flatnonzero(is_pad & (self.loss_mask == 1))
        if masked.size:
            raise ValueError(f"loss_mask is 1 on image_pad token {masked[0]}; image tokens are never trained on")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trajectory):
            return NotImplemented
        for field in dataclasses.fields(self):
            a, b = getattr(self, field.name), getattr(other, field.name)
            if isinstance(a, np.ndarray):
                if not (a.dtype == b.dtype and np.array_equal(a, b)):
                    return False
            elif a != b:
                return False
        return True

    def without_timings(self) -> "Trajectory":
        """This trajectory without its wall-clock measurements (`timings`, and the `*_s` entries of the per-turn
        records in `metadata["turns"]`): two plays of one episode compare equal this way."""
        metadata = dict(self.metadata)
        if isinstance(metadata.get("turns"), (list, tuple)):
            metadata["turns"] = [{k: v for k, v in turn.items() if not k.endswith("_s")} if isinstance(turn, Mapping)
                                 else turn for turn in metadata["turns"]]
        return dataclasses.replace(self, timings={}, metadata=metadata)

    @property
    def num_tokens(self) -> int:
        """Length of the token sequence (T)."""
        return len(self.token_ids)

    def to_arrays(self) -> dict[str, Any]:
        """Learner-facing view: numpy arrays (and the PNG list under `images`)."""
        grids = np.array([im.grid_thw for im in self.images], np.int32).reshape(-1, 3)
        return {"token_ids": self.token_ids, "loss_mask": self.loss_mask, "sampler_logprobs": self.sampler_logprobs,
                "reward": np.float32(self.reward), "policy_version": np.int64(self.policy_version),
                "sample_index": np.int32(self.sample_index), "image_grid_thw": grids,
                "image_token_index": np.array([im.token_index for im in self.images], np.int32),
                "image_pad_id": np.int32(self.image_pad_id), "merge_size": np.int32(self.merge_size),
                "task_id": self.task_id, "group_id": self.group_id, "images": [im.png for im in self.images]}

    def to_bytes(self) -> bytes:
        """The pickle-free record (see the module docstring)."""
        blobs: list[bytes] = []

        def blob(data: bytes) -> dict[str, int]:
            offset = sum(len(b) for b in blobs)
            blobs.append(data)
            return {"offset": offset, "nbytes": len(data)}

        arrays = {name: {"dtype": np.dtype(dtype).str.lstrip("<|"), "length": len(getattr(self, name)),
                         **blob(getattr(self, name).astype(np.dtype(dtype).newbyteorder("<")).tobytes())}
                  for name, dtype in _ARRAYS.items()}
        images = [{"grid_thw": list(im.grid_thw), "token_index": im.token_index, "img_id": im.img_id,
                   "parent_id": im.parent_id, **blob(im.png)} for im in self.images]
        answer = None
        if self.answer is not None:
            answer = {"gen_prompt": self.answer.gen_prompt,
                      "reference_images": [{"img_id": r.img_id, "note": r.note} for r in self.answer.reference_images]}
        header = {
            "task_id": self.task_id, "group_id": self.group_id, "sample_index": self.sample_index,
            "policy_version": self.policy_version, "termination": self.termination, "reward": self.reward,
            "reward_breakdown": self.reward_breakdown, "answer": answer, "messages": list(self.messages),
            "generation_error": self.generation_error, "timings": self.timings, "metadata": self.metadata,
            "image_pad_id": self.image_pad_id, "merge_size": self.merge_size, "arrays": arrays, "images": images,
            "generated_image": blob(self.generated_image) if self.generated_image is not None else None,
        }
        head = json.dumps(header, ensure_ascii=False, allow_nan=False).encode("utf-8")
        return b"".join([MAGIC, struct.pack("<Q", len(head)), head, *blobs])

    @classmethod
    def from_bytes(cls, data: bytes) -> "Trajectory":
        """Parses and re-validates a record written by `to_bytes`.

        Raises:
            ValueError: wrong magic, a truncated record, or a record that fails validation.
        """
        if data[:8] != MAGIC:
            raise ValueError(f"not a trajectory record: magic {bytes(data[:8])!r}, expected {MAGIC!r}")
        if len(data) < 16:
            raise ValueError(f"trajectory record truncated: {len(data)} bytes")
        (head_len,) = struct.unpack("<Q", data[8:16])
        body = 16 + head_len
        if body > len(data):
            raise ValueError(f"trajectory record truncated: header ends at {body}, record has {len(data)} bytes")
        try:
            return cls._from_header(json.loads(bytes(data[16:body]).decode("utf-8")), data, body)
        except (KeyError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"malformed trajectory record header: {type(err).__name__}: {err}") from err

    @classmethod
    def _from_header(cls, header: dict[str, Any], data: bytes, body: int) -> "Trajectory":
        def blob(ref: Mapping[str, int]) -> bytes:
            start, stop = body + ref["offset"], body + ref["offset"] + ref["nbytes"]
            if stop > len(data):
                raise ValueError(f"trajectory record truncated: blob ends at {stop}, record has {len(data)} bytes")
            return bytes(data[start:stop])

        arrays = {}
        for name, dtype in _ARRAYS.items():
            ref = header["arrays"][name]
            arrays[name] = np.frombuffer(blob(ref), np.dtype(dtype).newbyteorder("<"), count=ref["length"]).astype(dtype)
        images = tuple(TrajectoryImage(png=blob(im), grid_thw=tuple(im["grid_thw"]), token_index=im["token_index"],
                                       img_id=im["img_id"], parent_id=im["parent_id"]) for im in header["images"])
        answer = header["answer"]
        if answer is not None:
            answer = core.Answer(gen_prompt=answer["gen_prompt"], reference_images=tuple(
                core.AnswerRef(img_id=r["img_id"], note=r["note"]) for r in answer["reference_images"]))
        generated = header["generated_image"]
        return cls(task_id=header["task_id"], group_id=header["group_id"], sample_index=header["sample_index"],
                   policy_version=header["policy_version"], images=images, termination=header["termination"],
                   reward=header["reward"], reward_breakdown=header["reward_breakdown"], answer=answer,
                   messages=tuple(header["messages"]),
                   generated_image=blob(generated) if generated is not None else None,
                   generation_error=header["generation_error"], timings=header["timings"],
                   metadata=header["metadata"], image_pad_id=header["image_pad_id"],
                   merge_size=header["merge_size"], **arrays)


def image_runs(token_ids: Sequence[int] | np.ndarray, image_pad_id: int = IMAGE_PAD_ID) -> list[tuple[int, int]]:
    """(start, length) of every maximal run of `image_pad_id` in `token_ids` — the slots images fill."""
    is_pad = np.asarray(token_ids) == image_pad_id
    edges = np.flatnonzero(np.diff(np.concatenate([[0], is_pad.astype(np.int8), [0]])))
    return [(int(s), int(e - s)) for s, e in zip(edges[::2], edges[1::2])]
