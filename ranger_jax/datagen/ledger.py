"""What a data-generation stage has finished, on disk, so a rerun skips it: one JSON line per item.

A stage writes one `Ledger` (`<run>/stages/<stage>.jsonl`). Each finished item is one line

    {"key": "<item key>", "status": "kept" | "dropped", "reason": "<why>", "record": {...}}

appended, flushed and fsynced as soon as the item is done, so a run killed mid-stage keeps everything it finished
and a rerun only does the rest (`Ledger.done(key)`). A line cut off by a kill (the last one, without its newline) is
not an entry: it is dropped from the file when the ledger is opened again. A key written twice keeps its last
entry. Whole files that are read as a unit (reports, exported datasets) go through `write_json` / `write_jsonl`,
which write a temporary file and rename it into place.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ranger_jax import fileio

STATUSES = ("kept", "dropped")


def dumps(obj: Any) -> str:
    """One compact, key-sorted JSON line (no newline), the form every datagen file uses."""
    return json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 1) -> Path:
    """Writes `obj` as JSON to `path` atomically; returns the path."""
    text = json.dumps(obj, ensure_ascii=False, indent=indent, sort_keys=True, allow_nan=False) + "\n"
    fileio.write_atomic(path, text.encode("utf-8"))
    return Path(path)


def write_jsonl(path: str | os.PathLike, rows: Iterable[Any]) -> Path:
    """Writes `rows` as JSON lines to `path` atomically; returns the path."""
    fileio.write_atomic(path, "".join(dumps(row) + "\n" for row in rows).encode("utf-8"))
    return Path(path)


def read_jsonl(path: str | os.PathLike) -> list[Any]:
    """The rows of a JSON-lines file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file and line of a row that is not JSON.
    """
    rows = []
    for number, line in enumerate(Path(path).read_text("utf-8").splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError as err:
                raise ValueError(f"{path}:{number} is not valid JSON: {err}") from err
    return rows


@dataclasses.dataclass(frozen=True)
class Entry:
    """One finished item of a stage.

    Attributes:
        key: the item's key within the stage (a URL, a prompt id, a query).
        status: "kept" (it goes on to the next stage) or "dropped".
        reason: why it was kept or dropped (the report counts these).
        record: what the stage produced for it (JSON).
    """

    key: str
    status: str
    reason: str
    record: Mapping[str, Any]

    def to_row(self) -> dict[str, Any]:
        """The ledger line's object."""
        return {"key": self.key, "status": self.status, "reason": self.reason, "record": dict(self.record)}


def _parse(path: Path) -> tuple[list[Entry], int]:
    """(entries, bytes of the file that hold complete lines)."""
    data = path.read_bytes() if path.exists() else b""
    entries, good = [], 0
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        if end < 0:
            break  # a torn last line: not an entry
        line = data[start:end]
        if line.strip():
            try:
                row = json.loads(line)
                entries.append(Entry(key=str(row["key"]), status=row["status"], reason=row.get("reason") or "",
                                     record=row.get("record") or {}))
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{path}: line at byte {start} is not a ledger entry: {err}") from err
        start = good = end + 1
    return entries, good


class Ledger:
    """The finished items of one stage (see the module docstring); safe to append from several threads.

    Args:
        path: the ledger file (created on the first append; its folder too).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        entries, good = _parse(self.path)
        if self.path.exists() and good < self.path.stat().st_size:
            fileio.write_atomic(self.path, self.path.read_bytes()[:good])  # drop the torn line before appending
        self._entries: dict[str, Entry] = {}
        for entry in entries:
            self._entries[entry.key] = entry
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def done(self, key: str) -> bool:
        """Whether the item `key` is finished."""
        return key in self._entries

    def get(self, key: str) -> Entry | None:
        """The entry of `key`, or None."""
        return self._entries.get(key)

    def entries(self) -> Iterator[Entry]:
        """Every entry, in the order their keys were first finished."""
        return iter(list(self._entries.values()))

    def kept(self) -> list[Entry]:
        """The kept entries, in order."""
        return [e for e in self._entries.values() if e.status == "kept"]

    def add(self, key: str, status: str, reason: str, record: Mapping[str, Any] | None = None) -> Entry:
        """Appends one finished item (flushed and fsynced before returning) and returns its entry.

        Raises:
            ValueError: a status other than "kept" / "dropped", or a record that is not JSON.
        """
        if status not in STATUSES:
            raise ValueError(f"ledger {self.path}: status must be one of {STATUSES}, got {status!r} for key {key!r}")
        entry = Entry(key=str(key), status=status, reason=reason, record=dict(record or {}))
        line = (dumps(entry.to_row()) + "\n").encode("utf-8")
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "ab") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            self._entries[entry.key] = entry
        return entry

    def counts(self) -> dict[str, dict[str, int]]:
        """{status: {reason: count}} over the entries."""
        out: dict[str, collections.Counter] = {s: collections.Counter() for s in STATUSES}
        for entry in self._entries.values():
            out[entry.status][entry.reason] += 1
        return {status: dict(sorted(counter.items())) for status, counter in out.items()}
