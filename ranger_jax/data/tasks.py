"""Task files as they are published, read into `env.Task`s by one entry point: `load_tasks(path)`.

The format is recognised from the file itself:

- Gen-Searcher RL data, `rl_data.json`: a JSON array of `{"id", "prompt", "gt_image"}` rows.
- The same data after `register_gen_rl_dataset.py`: rllm's dataset registry writes `<name>/<split>.parquet` with
  columns `id` (renumbered "0", "1", …), `question` and `gt_image`, and `<split>_verl.parquet` holding that row
  in an `extra_info` struct column. Both are read (JSON or JSON lines with `question` rows too).
- KnowGen-Bench, `KnowGen-Bench.json`: a JSON array or JSON lines of `{"id", "prompt", "meta": {"category",
  "difficulty"}, "gt_image"}`; `gen_image` is the older name of the GT path and is read when `gt_image` is absent.
- Gen-Searcher's SFT file: a JSON array (or JSON lines) of ShareGPT rows `{"messages", "images"}`, or the
  LLaMA-Factory `dataset_info.json` naming it (`…/dataset_info.json#gen_sft` picks an entry; without `#name`
  the one sharegpt entry whose file exists is used). Rows are checked by `data.sft_file.SftFile`; a row's
  first user turn is the task (Gen-Searcher's agent sends the question verbatim as that turn).
- Our own task JSON lines: the KnowGen row shape plus an optional `today` (YYYY-MM-DD, for the system prompt).
- An offline world (its folder, or its `tasks.jsonl`): `env.sim.world.load_tasks`, with the exact ground truth.

A JSON file is an array when its first non-blank character is `[`, else JSON lines, whatever its extension (as
Gen-Searcher's own loaders decide). Each Task gets `id` as a string, the `prompt`, `ground_truth` = the GT image
path (a relative path resolves against the file's folder, as KnowGen_Eval resolves image paths against its
JSON's folder; URLs, data URLs and absolute paths are kept) or None, and `metadata` = the row's `meta` object
plus `today`. Errors name the file, the line (JSON lines and parse errors, 1-based) or row (JSON array and
parquet, 0-based) and the field.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ranger_jax.env import core

DATASET_INFO = "dataset_info.json"
GT_KEYS = ("gt_image", "gen_image")  # KnowGen's GT path, then its older name
_VERL_COLUMN = "extra_info"  # rllm's verl copy of a registered row


class TaskFormatError(ValueError):
    """A task file, or one of its rows, that cannot be read; the message names the file, the row and the field."""

    def __init__(self, path: str | os.PathLike, where: str | None, field: str | None, problem: str):
        self.path, self.where, self.field = Path(path), where, field
        place = str(self.path) + (f" {where}" if where else "") + (f" field {field!r}" if field else "")
        super().__init__(f"{place}: {problem}")


def _is_url(value: str) -> bool:
    return "://" in value or value.startswith("data:")


def _resolve(value: str, folder: Path) -> str:
    """A GT path as written, made absolute against `folder` when it is a relative file path."""
    return value if _is_url(value) or Path(value).is_absolute() else str(folder / value)


def _json_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, row) of a JSON array (`row i`, 0-based) or JSON lines (`line n`, 1-based) file."""
    text = path.read_text("utf-8")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except ValueError as err:
            where = f"line {err.lineno}" if isinstance(err, json.JSONDecodeError) else None
            raise TaskFormatError(path, where, None, f"not valid JSON: {err}") from err
        if not isinstance(rows, list):  # e.g. `[1] [2]` fails above; kept for a top-level value that is no array
            raise TaskFormatError(path, None, None, f"expected a JSON array of rows, got {type(rows).__name__}")
        yield from ((f"row {i}", row) for i, row in enumerate(rows))
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"line {number}", json.loads(line)
        except ValueError as err:
            raise TaskFormatError(path, f"line {number}", None, f"not valid JSON: {err}") from err


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(row i, row) of a parquet file; the verl copy's `extra_info` struct is unwrapped."""
    try:
        import pyarrow.parquet as pq  # only parquet readers need pyarrow
    except ImportError as err:
        raise ImportError(f"reading {path} needs pyarrow: pip install 'pyarrow>=26,<27'") from err
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise TaskFormatError(path, None, None, f"not a readable parquet file: {err}") from err
    columns = table.column_names
    unwrap = _VERL_COLUMN in columns and "id" not in columns  # its `prompt` column is a chat placeholder
    if not unwrap and "question" not in columns and "prompt" not in columns:
        raise TaskFormatError(path, None, None, f"columns {columns} hold no task: expected id, question, gt_image "
                                                f"(or the verl copy's {_VERL_COLUMN})")
    for i, row in enumerate(table.to_pylist()):
        yield f"row {i}", (row.get(_VERL_COLUMN) if unwrap else row)


def _text(path: Path, where: str, row: Mapping[str, Any], key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        shown = "missing" if key not in row else f"{type(value).__name__} {value!r:.60}"
        raise TaskFormatError(path, where, key, f"must be a non-empty string, got {shown}")
    return value


def _task_id(path: Path, where: str, row: Mapping[str, Any]) -> str:
    value = row.get("id")
    if isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, str) and not value.strip()):
        shown = "missing" if "id" not in row else f"{type(value).__name__} {value!r:.60}"
        raise TaskFormatError(path, where, "id", f"must be a string or an integer, got {shown}")
    return str(value)


def _ground_truth(path: Path, where: str, row: Mapping[str, Any]) -> str | None:
    for key in GT_KEYS:
        if row.get(key) is None:
            continue
        value = row[key]
        if not isinstance(value, str) or not value.strip():
            raise TaskFormatError(path, where, key, f"must be an image path or URL, got {value!r:.60}")
        return _resolve(value.strip(), path.parent)
    return None


def _metadata(path: Path, where: str, row: Mapping[str, Any]) -> dict[str, Any]:
    meta = row.get("meta")
    if meta is None:
        meta = {}
    if not isinstance(meta, Mapping):
        raise TaskFormatError(path, where, "meta", f"must be an object, got {type(meta).__name__}")
    for key in ("category", "difficulty"):
        if key in meta and not isinstance(meta[key], str):
            raise TaskFormatError(path, where, f"meta.{key}", f"must be a string, got {meta[key]!r:.60}")
    out = dict(meta)
    if row.get("today") is not None:
        today = row["today"]
        try:
            datetime.date.fromisoformat(today)
        except (TypeError, ValueError) as err:
            raise TaskFormatError(path, where, "today", f"must be a YYYY-MM-DD date, got {today!r:.40}") from err
        out["today"] = today
    return out


def _row_task(path: Path, where: str, row: Any, prompt_key: str) -> core.Task:
    if not isinstance(row, Mapping):
        raise TaskFormatError(path, where, None, f"a task row must be an object, got {type(row).__name__}")
    return core.Task(_task_id(path, where, row), _text(path, where, row, prompt_key),
                     ground_truth=_ground_truth(path, where, row), metadata=_metadata(path, where, row))


def _unique(path: Path, tasks: list[tuple[str, core.Task]]) -> list[core.Task]:
    seen: dict[str, str] = {}
    for where, task in tasks:
        if task.id in seen:
            raise TaskFormatError(path, where, "id", f"id {task.id!r} repeats the one of {seen[task.id]}")
        seen[task.id] = where
    return [task for _, task in tasks]


def _row_tasks(path: Path, rows: Iterator[tuple[str, Any]]) -> list[core.Task]:
    """Tasks from `prompt` rows (RL data, KnowGen, our JSONL) or registered `question` rows."""
    tasks, prompt_key = [], None
    for where, row in rows:
        if prompt_key is None and isinstance(row, Mapping):
            prompt_key = "question" if "question" in row and "prompt" not in row else "prompt"
        tasks.append((where, _row_task(path, where, row, prompt_key or "prompt")))
    if not tasks:
        raise TaskFormatError(path, None, None, "holds no task rows")
    return _unique(path, tasks)


def _sft_tasks(source: Any, path: Path) -> list[core.Task]:
    """One task per SFT row: its first user turn (text only), no ground truth."""
    from ranger_jax.data import sft_file  # the SFT reader pulls in image processing; only this format needs it

    rows = sft_file.SftFile(source, check_images=False)
    tasks = []
    for index, row in enumerate(rows.rows):
        first = next((m for m in row["messages"] if m["role"] == "user"), None)
        field = f"{rows.columns.messages}[user]"
        if first is None or not first["content"].strip():
            raise TaskFormatError(path, f"row {index}", field, "has no user turn with a prompt")
        if "<image>" in first["content"]:
            raise TaskFormatError(path, f"row {index}", field, "the first user turn holds <image>; a task prompt "
                                                               "is text only")
        tasks.append(core.Task(str(index), first["content"].strip(), metadata={"sft_row": index}))
    if not tasks:
        raise TaskFormatError(path, None, None, "holds no SFT rows")
    return tasks


def _dataset_info_tasks(info_path: Path, entry: str | None) -> list[core.Task]:
    from ranger_jax.data import sft_file

    if entry is None:
        try:
            info = json.loads(info_path.read_text("utf-8"))
        except ValueError as err:
            raise TaskFormatError(info_path, None, None, f"not valid JSON: {err}") from err
        if not isinstance(info, dict):
            raise TaskFormatError(info_path, None, None, f"expected an object of entries, got {type(info).__name__}")
        local = sorted(name for name, e in info.items() if isinstance(e, dict) and e.get("formatting") == "sharegpt"
                       and isinstance(e.get("file_name"), str) and (info_path.parent / e["file_name"]).is_file())
        if len(local) != 1:
            raise TaskFormatError(info_path, None, None, f"{len(local)} sharegpt entries with a local file "
                                                         f"({local}); name one as {info_path}#<entry>")
        entry = local[0]
    columns = sft_file.SftColumns.from_dataset_info(info_path, entry)
    return _sft_tasks(columns, Path(columns.path))


def _split_entry(path: str | os.PathLike) -> tuple[Path, str | None]:
    """(file, dataset_info entry) of `…/dataset_info.json#entry`; other paths have no entry."""
    text = os.fspath(path)
    head, sep, entry = text.rpartition("#")
    if sep and Path(head).name == DATASET_INFO and not Path(text).exists():
        return Path(head), entry or None
    return Path(text), None


def _world_root(path: Path) -> Path | None:
    """The offline world a folder or a `tasks.jsonl` belongs to, or None."""
    from ranger_jax.env.sim import world as world_lib

    root = path if path.is_dir() else path.parent
    if (root / world_lib.WORLD_FILE).is_file() and (path.is_dir() or path.name == world_lib.TASKS_FILE):
        return root
    return None


def _first_row(path: Path) -> Any:
    for _, row in _json_rows(path):
        return row
    return None


def load_tasks(path: str | os.PathLike) -> list[core.Task]:
    """The tasks of a published task file, whichever of the formats in the module docstring it is.

    Args:
        path: the file (JSON array, JSON lines, parquet, `dataset_info.json[#entry]`) or an offline world folder.

    Returns:
        The tasks in file order (ids unique within the file).

    Raises:
        FileNotFoundError: no such file (or a folder that is not an offline world).
        TaskFormatError / SftFormatError (both ValueError): a malformed file or row, naming the file, the line
            or row and the field.
    """
    file, entry = _split_entry(path)
    if not file.exists():
        raise FileNotFoundError(f"task file {file} does not exist")
    world_root = _world_root(file)
    if world_root is not None:
        from ranger_jax.env.sim import world as world_lib

        return world_lib.load_tasks(world_root)
    if file.is_dir():
        if (file / DATASET_INFO).is_file():
            return _dataset_info_tasks(file / DATASET_INFO, entry)
        raise FileNotFoundError(f"{file} is a folder that is neither an offline world nor holds {DATASET_INFO}")
    if file.name == DATASET_INFO:
        return _dataset_info_tasks(file, entry)
    if file.suffix.lower() == ".parquet":
        return _row_tasks(file, _parquet_rows(file))
    first = _first_row(file)
    if isinstance(first, Mapping) and isinstance(first.get("messages"), list):
        return _sft_tasks(file, file)
    return _row_tasks(file, _json_rows(file))
