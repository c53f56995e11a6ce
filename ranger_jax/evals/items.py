"""One benchmark item, whatever the benchmark: the prompt, its labels, ground truth and judging inputs.

Each benchmark's reader (`evals.knowgen`, `evals.savanna`, `evals.mind_bench`, `evals.wise`) turns its published
file into `Item`s; the runner, the reports and the gallery read only these fields. Errors name the file, the line
(JSON lines, 1-based) or row (JSON array, 0-based) and the field (`ItemFormatError`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ranger_jax.env import core

_UNSAFE = re.compile(r"[^\w\-.]")


class ItemFormatError(ValueError):
    """A benchmark file, or one of its rows, that cannot be read; the message names the file, the row and the field."""

    def __init__(self, path: str | os.PathLike, where: str | None, field: str | None, problem: str):
        self.path, self.where, self.field = Path(path), where, field
        place = str(self.path) + (f" {where}" if where else "") + (f" field {field!r}" if field else "")
        super().__init__(f"{place}: {problem}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Item:
    """One benchmark item.

    Attributes:
        id: unique within the benchmark (also the name of its folder in a run, see `file_stem`).
        prompt: the request shown to the policy (or to the generator alone) and judged against.
        category: the group the item is reported in (KnowGen `meta.category`, Savanna domain, Mind-Bench `Type`,
            WISE category).
        subcategory: a finer label (Savanna subcategory, WISE `Subcategory`, KnowGen difficulty).
        ground_truth: ground-truth image files or URLs, in the benchmark's order.
        inputs: images the request itself supplies (an edit's input image); they reach the generator first.
        criteria: what the judge checks one by one (Savanna context criteria, Mind-Bench checklist).
        target: what the request is about, for judges that take it (Savanna).
        explanation: what a correct image shows (WISE `Explanation`).
        meta: the benchmark's own fields, kept for its exports (KnowGen `meta`, Mind-Bench `Type`/`ID`, WISE
            `prompt_id`).
        today: the date the request is set on (YYYY-MM-DD) for the policy's system prompt, when the file gives one.
    """

    id: str
    prompt: str
    category: str = ""
    subcategory: str = ""
    ground_truth: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    criteria: tuple[str, ...] = ()
    target: str = ""
    explanation: str = ""
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    today: str | None = None

    def task(self) -> core.Task:
        """The item as an environment task (the policy sees `prompt`; the first GT image is its ground truth)."""
        metadata = {"category": self.category, "subcategory": self.subcategory}
        if self.today:
            metadata["today"] = self.today
        return core.Task(self.id, self.prompt, ground_truth=self.ground_truth[0] if self.ground_truth else None,
                         metadata=metadata)


def file_stem(item_id: str) -> str:
    """A file-system-safe name for an item id (characters other than letters, digits, `-`, `_`, `.` become `_`)."""
    return _UNSAFE.sub("_", item_id) or "_"


def is_url(value: str) -> bool:
    """Whether `value` is a URL (or a data URL) rather than a file path."""
    return "://" in value or value.startswith("data:")


def resolve(value: str, folder: Path) -> str:
    """An image reference as written, made absolute against `folder` when it is a file path."""
    return value if is_url(value) else str((folder / value).absolute())


def read_rows(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """(where, row) of a JSON array (`row i`, 0-based) or JSON lines (`line n`, 1-based) file.

    A file whose first non-blank character is `[` is an array, whatever its extension.

    Raises:
        FileNotFoundError: no such file.
        ItemFormatError: invalid JSON (naming the line), or a top-level value that is not an array.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark file {path} does not exist")
    text = path.read_text("utf-8")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise ItemFormatError(path, f"line {err.lineno}", None, f"not valid JSON: {err.msg}") from err
        yield from ((f"row {i}", row) for i, row in enumerate(rows))
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"line {number}", json.loads(line)
        except json.JSONDecodeError as err:
            raise ItemFormatError(path, f"line {number}", None, f"not valid JSON: {err.msg}") from err


def text_field(path: Path, where: str, row: Mapping[str, Any], key: str, *, required: bool = True) -> str:
    """A string field of a row ("" when optional and absent).

    Raises:
        ItemFormatError: a required field that is missing or empty, or a value that is not a string.
    """
    value = row.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        shown = "missing" if key not in row else f"{type(value).__name__} {value!r:.60}"
        raise ItemFormatError(path, where, key, f"must be a non-empty string, got {shown}")
    return value


def string_list(path: Path, where: str, row: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """A list-of-strings field (a single string counts as a list of one; absent is empty).

    Raises:
        ItemFormatError: anything else, naming the entry.
    """
    value = row.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ItemFormatError(path, where, key, f"must be a list of strings, got {type(value).__name__}")
    for i, entry in enumerate(value):
        if not isinstance(entry, str) or not entry.strip():
            raise ItemFormatError(path, where, f"{key}[{i}]", f"must be a non-empty string, got {entry!r:.60}")
    return tuple(value)


def object_row(path: Path, where: str, row: Any) -> Mapping[str, Any]:
    """`row` if it is a JSON object. Raises ItemFormatError otherwise."""
    if not isinstance(row, Mapping):
        raise ItemFormatError(path, where, None, f"an item row must be an object, got {type(row).__name__}")
    return row


def unique(path: Path, items: Sequence[tuple[str, Item]]) -> list[Item]:
    """The items, after checking that ids (and their file names) do not repeat.

    Raises:
        ItemFormatError: naming both rows.
    """
    seen: dict[str, str] = {}
    for where, item in items:
        stem = file_stem(item.id)
        if stem in seen:
            raise ItemFormatError(path, where, "id", f"id {item.id!r} repeats the one of {seen[stem]}")
        seen[stem] = where
    if not items:
        raise ItemFormatError(path, None, None, "holds no items")
    return [item for _, item in items]
