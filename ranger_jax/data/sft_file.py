"""Gen-Searcher's SFT data as LLaMA-Factory reads it: a sharegpt JSON file, rows rendered for the learner.

The file is a JSON array (or JSON lines) of rows

    {"messages": [{"role": "system" | "user" | "assistant", "content": str}, …], "images": [path, …]}

with one `<image>` placeholder per image, in order. Column and role names follow a LLaMA-Factory
`dataset_info.json` entry (Gen-Searcher's is `gen_sft`: formatting `sharegpt`, columns `messages` / `images`,
tags role / content / user / assistant / system); without an entry, the columns above and those tags apply.
Relative image paths resolve as LLaMA-Factory resolves them: against `media_dir` (by default the folder of
`dataset_info.json`, or of the file) when the file exists there, else as given.

`SftFile` validates every row when opened — errors name the file, the row and the field — and is a Grain
random-access source of normalised rows; `SftFile.example(i, …)` renders row i with the project's
`ChatRenderer` (loss on assistant tokens only) and preprocesses its images with the given pixel bounds.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ranger_jax.data import examples
from ranger_jax.processing import chat, sharegpt
from ranger_jax.processing import image as image_lib
from ranger_jax.rollout import sequence

# LLaMA-Factory's sharegpt tag names (DatasetAttr defaults) and the roles `processing.sharegpt` understands.
DEFAULT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}
_ROLE_OF_TAG = {"user_tag": "user", "assistant_tag": "assistant", "observation_tag": "observation",
                "system_tag": "system"}


class SftFormatError(ValueError):
    """A row of an SFT file that cannot be used; the message names the file, the row and the field."""

    def __init__(self, path: str | os.PathLike, row: int | None, field: str, problem: str):
        self.path, self.row, self.field = Path(path), row, field
        where = f"{self.path}" + (f" row {row}" if row is not None else "") + f" field {field!r}"
        super().__init__(f"{where}: {problem}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SftColumns:
    """Where a sharegpt dataset lives and how its rows name things (one LLaMA-Factory dataset_info entry)."""

    path: Path  # the JSON array / JSON lines file
    messages: str = "messages"  # column of the turn list
    images: str | None = "images"  # column of image paths (None: no images)
    system: str | None = None  # column of a system prompt used when the turns have none
    tags: Mapping[str, str] = dataclasses.field(default_factory=lambda: {
        **DEFAULT_TAGS, "role_tag": "role", "content_tag": "content", "user_tag": "user",
        "assistant_tag": "assistant"})
    media_dir: Path | None = None  # folder relative image paths resolve against (None: the file's folder)

    @classmethod
    def from_dataset_info(cls, dataset_info: str | os.PathLike, name: str, *,
                          media_dir: str | os.PathLike | None = None) -> SftColumns:
        """The entry `name` of a LLaMA-Factory `dataset_info.json` (file_name relative to its folder).

        Raises:
            FileNotFoundError: no dataset_info file.
            SftFormatError: no such entry, or one this reader does not support (not sharegpt, no local
                file_name, ranking data, tools/videos/audios columns), naming the entry and field.
        """
        info_path = Path(dataset_info)
        if info_path.is_dir():
            info_path = info_path / "dataset_info.json"
        if not info_path.is_file():
            raise FileNotFoundError(f"dataset_info file {info_path} does not exist")
        try:
            info = json.loads(info_path.read_text("utf-8"))
        except ValueError as err:
            raise SftFormatError(info_path, None, name, f"not valid JSON: {err}") from err
        if not isinstance(info, dict) or name not in info:
            known = sorted(info) if isinstance(info, dict) else []
            raise SftFormatError(info_path, None, name, f"no such dataset entry (entries: {known})")
        entry = info[name]

        def bad(field: str, problem: str) -> SftFormatError:
            return SftFormatError(info_path, None, f"{name}.{field}", problem)

        if not isinstance(entry, dict):
            raise bad("", f"entry must be an object, got {type(entry).__name__}")
        if entry.get("formatting", "alpaca") != "sharegpt":
            raise bad("formatting", f"{entry.get('formatting', 'alpaca')!r} is not supported; only 'sharegpt'")
        if entry.get("ranking"):
            raise bad("ranking", "ranking (preference) data is not SFT data")
        if not isinstance(entry.get("file_name"), str):
            raise bad("file_name", "needs a local file name (hub and script datasets are not read here)")
        columns = entry.get("columns") or {}
        unsupported = sorted(set(columns) - {"messages", "images", "system"})
        if unsupported:
            raise bad("columns", f"columns {unsupported} are not supported (messages, images, system are)")
        tags = {**DEFAULT_TAGS, **(entry.get("tags") or {})}
        file_path = info_path.parent / entry["file_name"]
        return cls(path=file_path, messages=columns.get("messages", "conversations"), images=columns.get("images"),
                   system=columns.get("system"), tags=tags,
                   media_dir=Path(media_dir) if media_dir is not None else info_path.parent)


def _load_rows(path: Path) -> list[Any]:
    if not path.is_file():
        raise FileNotFoundError(f"SFT file {path} does not exist")
    text = path.read_text("utf-8")
    if path.suffix == ".jsonl":
        rows = []
        for line_number, line in enumerate(text.splitlines()):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as err:
                    problem = f"line {line_number + 1} is not valid JSON: {err}"
                    raise SftFormatError(path, len(rows), "", problem) from err
        return rows
    try:
        rows = json.loads(text)
    except ValueError as err:
        raise SftFormatError(path, None, "", f"not valid JSON: {err}") from err
    if not isinstance(rows, list):
        raise SftFormatError(path, None, "", f"must hold a JSON array of rows, got {type(rows).__name__}")
    return rows


class SftFile:
    """The validated rows of one SFT file, as a Grain random-access source.

    `sft[i]` is the normalised row `{"messages": [{"role", "content"}], "images": [absolute or as-given paths],
    "system": str | None}` (roles: system, user, assistant, observation).

    Args:
        source: the file (Gen-Searcher's columns and tags), or `SftColumns` (e.g. `from_dataset_info`).
        check_images: check at open that every image file exists.

    Raises:
        FileNotFoundError: no such file.
        SftFormatError: a row with a missing or mistyped field, an unknown role tag, `<image>` placeholders that
            disagree with its images, a missing image, or no assistant turn (naming file, row and field).
    """

    def __init__(self, source: str | os.PathLike | SftColumns, *, check_images: bool = True):
        self.columns = source if isinstance(source, SftColumns) else SftColumns(path=Path(source))
        self.path = Path(self.columns.path)
        self.media_dir = Path(self.columns.media_dir) if self.columns.media_dir is not None else self.path.parent
        roles = {}
        for tag_name, role in _ROLE_OF_TAG.items():
            roles[self.columns.tags[tag_name]] = role
        self._roles = roles
        self.rows = [self._normalise(i, row, check_images) for i, row in enumerate(_load_rows(self.path))]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]

    def __repr__(self) -> str:
        return f"SftFile(path={str(self.path)!r}, rows={len(self.rows)})"

    def _resolve(self, path: str) -> str:
        joined = self.media_dir / path
        return str(joined) if not os.path.isabs(path) and joined.is_file() else path

    def _normalise(self, index: int, row: Any, check_images: bool) -> dict[str, Any]:
        cols, tags = self.columns, self.columns.tags

        def bad(field: str, problem: str) -> SftFormatError:
            return SftFormatError(self.path, index, field, problem)

        if not isinstance(row, dict):
            raise bad("", f"row must be an object, got {type(row).__name__}")
        turns = row.get(cols.messages)
        if not isinstance(turns, list) or not turns:
            raise bad(cols.messages, f"must be a non-empty list of turns, got {type(turns).__name__}")
        messages = []
        for k, turn in enumerate(turns):
            field = f"{cols.messages}[{k}]"
            if not isinstance(turn, dict):
                raise bad(field, f"turn must be an object, got {type(turn).__name__}")
            tag, content = turn.get(tags["role_tag"]), turn.get(tags["content_tag"])
            if tag not in self._roles:
                raise bad(f"{field}.{tags['role_tag']}", f"role tag {tag!r} is not one of {sorted(self._roles)}")
            if not isinstance(content, str):
                raise bad(f"{field}.{tags['content_tag']}", f"content must be a string, got {type(content).__name__}")
            if self._roles[tag] == "system" and k:
                raise bad(field, "a system turn may only come first")
            if sharegpt.IMAGE_TAG in content and self._roles[tag] not in ("user", "observation"):
                raise bad(f"{field}.{tags['content_tag']}", f"{sharegpt.IMAGE_TAG} in a {self._roles[tag]} turn; "
                          "images are only rendered in user and observation turns")
            messages.append({"role": self._roles[tag], "content": content})
        if not any(m["role"] == "assistant" for m in messages):
            raise bad(cols.messages, "has no assistant turn, so nothing to train on")
        images = row.get(cols.images) if cols.images else None
        images = [] if images is None else images
        if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
            raise bad(cols.images or "images", "must be a list of image paths")
        num_tags = sum(m["content"].count(sharegpt.IMAGE_TAG) for m in messages)
        if num_tags != len(images):
            raise bad(cols.images or cols.messages, f"{num_tags} {sharegpt.IMAGE_TAG} placeholders in the turns but "
                      f"{len(images)} images")
        paths = [self._resolve(p) for p in images]
        if check_images:
            for k, path in enumerate(paths):
                if not os.path.isfile(path):
                    raise bad(f"{cols.images}[{k}]", f"image file {path} does not exist (media_dir {self.media_dir})")
        system = row.get(cols.system) if cols.system else None
        if system is not None and not isinstance(system, str):
            raise bad(cols.system, f"must be a string, got {type(system).__name__}")
        return {"messages": messages, "images": paths, "system": system}

    def example(self, index: int, *, renderer: chat.ChatRenderer, vision: sequence.VisionSettings) -> dict[str, Any]:
        """Row `index` rendered for the learner (see `data.examples`; `policy_version` -1, no reward).

        Raises:
            SftFormatError: an image that cannot be read or preprocessed, or turns the renderer rejects.
        """
        row = self.rows[index]
        field = self.columns.images or "images"
        pixels, grids = [], []
        for k, path in enumerate(row["images"]):
            try:
                with Image.open(path) as image:
                    image.load()
                    values, grid = image_lib.preprocess_image(
                        image, min_pixels=vision.min_pixels, max_pixels=vision.max_pixels,
                        patch_size=vision.patch_size, merge_size=vision.merge_size,
                        temporal_patch_size=vision.temporal_patch_size)
            except (OSError, SyntaxError, ValueError, TypeError) as err:
                raise SftFormatError(self.path, index, f"{field}[{k}]", f"image {path}: {err}") from err
            pixels.append(values)
            grids.append(grid)
        try:
            messages = sharegpt.messages_from_sharegpt(
                {"messages": row["messages"], "images": row["images"], "system": row["system"]})
            rendered = renderer.render(messages, images_grid_thw=np.array(grids, np.int64).reshape(-1, 3))
        except ValueError as err:
            raise SftFormatError(self.path, index, self.columns.messages, str(err)) from err
        loss_mask = rendered.loss_mask.astype(np.float32)
        loss_mask[0] = 0.0  # token 0 has no context to be predicted from
        features = 3 * vision.temporal_patch_size * vision.patch_size ** 2
        return {
            "input_ids": rendered.ids.astype(np.int32),
            "attention_mask": np.ones(len(rendered), np.int32),
            "loss_mask": loss_mask,
            "sampler_logp": np.zeros(len(rendered), np.float32),
            "pixel_values": np.concatenate(pixels) if pixels else np.zeros((0, features), np.float32),
            "image_grid_thw": np.array(grids, np.int32).reshape(-1, 3),
            "policy_version": np.int32(examples.SFT_POLICY_VERSION),
        }
