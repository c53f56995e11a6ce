"""ArrayRecord shards of trajectories: atomic writers, readers, and a Grain data source.

A writer fills a hidden temporary file next to the shard (`.<name>.<pid>.<nonce>.tmp`) and only on
`close()` flushes, fsyncs and `os.replace`s it to `<name>.array_record`; a writer killed mid-shard leaves
at most a temporary file that `list_shards` (and so every reader given a folder) never picks up, and that
`remove_stale_temporaries` can delete. Records use `group_size:1` for cheap random access.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grain
from array_record.python import array_record_module

from ranger_jax import storage
from ranger_jax.data.trajectory import Trajectory

log = logging.getLogger(__name__)

SHARD_SUFFIX = ".array_record"
TEMP_SUFFIX = ".tmp"
WRITER_OPTIONS = "group_size:1"


class CorruptShardError(ValueError):
    """A shard, or one record in it, cannot be read (the message names the shard and the record index)."""


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ShardWriter:
    """Writes one shard atomically (see the module docstring). Use as a context manager: an exception inside
    the `with` block discards the shard instead of publishing it.

    Args:
        path: the final shard path (should end in `.array_record`).
        overwrite: replace an existing shard at `path` on close.
    """

    def __init__(self, path: str | os.PathLike, *, overwrite: bool = False):
        self.path = Path(path)
        if self.path.name.startswith("."):
            raise ValueError(f"shard name {self.path.name!r} starts with '.', which readers treat as temporary")
        if self.path.exists() and not overwrite:
            raise FileExistsError(f"shard {self.path} already exists; pass overwrite=True to replace it")
        self.overwrite = overwrite
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.temp_path = self.path.with_name(f".{self.path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
        self._writer = array_record_module.ArrayRecordWriter(str(self.temp_path), WRITER_OPTIONS)
        self.num_records = 0
        self._state = "open"

    def write(self, trajectory: Trajectory) -> None:
        """Appends one trajectory."""
        if self._state != "open":
            raise ValueError(f"shard writer for {self.path} is {self._state}")
        if not isinstance(trajectory, Trajectory):
            raise TypeError(f"ShardWriter.write takes a Trajectory, got {type(trajectory).__name__}")
        self._writer.write(trajectory.to_bytes())
        self.num_records += 1

    def close(self) -> Path:
        """Finishes the shard and publishes it under `path`; returns `path`."""
        if self._state != "open":
            raise ValueError(f"shard writer for {self.path} is {self._state}")
        self._writer.close()
        self._state = "closed"
        if self.path.exists() and not self.overwrite:
            self.temp_path.unlink(missing_ok=True)
            raise FileExistsError(f"shard {self.path} appeared while writing; not replaced")
        _fsync(self.temp_path)
        os.replace(self.temp_path, self.path)
        _fsync(self.path.parent)
        log.info("wrote shard %s (%d trajectories)", self.path, self.num_records)
        return self.path

    def abort(self) -> None:
        """Discards the shard: nothing is published, the temporary file is removed."""
        if self._state == "open":
            self._writer.close()
        self._state = "aborted"
        self.temp_path.unlink(missing_ok=True)

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif self._state == "open":
            self.close()


def write_shard(path: str | os.PathLike, trajectories: Iterable[Trajectory], *, overwrite: bool = False) -> Path:
    """Writes `trajectories` to one shard atomically; returns its path."""
    with ShardWriter(path, overwrite=overwrite) as writer:
        for trajectory in trajectories:
            writer.write(trajectory)
    return writer.path


class RollingShardWriter:
    """Writes trajectories to `<folder>/<prefix>-<00000>.array_record`, starting a new shard every
    `records_per_shard` records; each shard is published atomically when it fills or on `close()`.

    Args:
        folder: where shards go.
        prefix: shard name prefix (give each writer process its own, e.g. `actor3-step12`).
        records_per_shard: shard size in trajectories.
    """

    def __init__(self, folder: str | os.PathLike, *, prefix: str = "trajectories", records_per_shard: int = 256):
        if records_per_shard < 1:
            raise ValueError(f"records_per_shard must be >= 1, got {records_per_shard}")
        self.folder, self.prefix, self.records_per_shard = Path(folder), prefix, records_per_shard
        self.shards: list[Path] = []
        self._current: ShardWriter | None = None

    def write(self, trajectory: Trajectory) -> None:
        """Appends one trajectory, starting a new shard when the current one is full."""
        if self._current is None:
            path = self.folder / f"{self.prefix}-{len(self.shards):05d}{SHARD_SUFFIX}"
            self._current = ShardWriter(path)
        self._current.write(trajectory)
        if self._current.num_records >= self.records_per_shard:
            self.shards.append(self._current.close())
            self._current = None

    def close(self) -> list[Path]:
        """Publishes the partly filled shard, if any; returns every shard written."""
        if self._current is not None:
            self.shards.append(self._current.close())
            self._current = None
        return list(self.shards)

    def abort(self) -> None:
        """Discards the unfinished shard (published ones stay)."""
        if self._current is not None:
            self._current.abort()
            self._current = None

    def __enter__(self) -> "RollingShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()


def _path(location: str | os.PathLike) -> Path:
    """A local path or `file://` URL as a Path; a bucket URL (`gs://`) as an etils path, which lists the bucket and
    whose string ArrayRecord opens natively (`ranger_jax.storage`)."""
    local = storage.local_path(location)
    return local if local is not None else storage.epath(location)


def list_shards(location: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Completed shards: a folder's `*.array_record` files (hidden temporaries skipped, sorted), or the given
    file paths checked to exist. Folders and paths may be `file://` or `gs://` URLs.

    Raises:
        FileNotFoundError: a named shard file or folder does not exist.
    """
    if isinstance(location, (str, os.PathLike)):
        path = _path(location)
        if path.is_dir():
            return sorted(p for p in path.glob(f"*{SHARD_SUFFIX}") if not p.name.startswith(".") and p.is_file())
        location = [path]
    paths = [_path(p) for p in location]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"shard {path} does not exist")
    return paths


def remove_stale_temporaries(folder: str | os.PathLike, *, older_than_s: float = 3600.0) -> list[Path]:
    """Deletes writer temporaries in `folder` untouched for `older_than_s` seconds (left by killed writers)."""
    now, removed = time.time(), []
    for path in Path(folder).glob(f".*{SHARD_SUFFIX}.*{TEMP_SUFFIX}"):
        if now - path.stat().st_mtime >= older_than_s:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _open_reader(path: Path) -> array_record_module.ArrayRecordReader:
    try:
        reader = array_record_module.ArrayRecordReader(str(path))
        if not reader.ok():
            reader.close()  # a reader that failed to open raises its reason here
    except RuntimeError as err:  # riegeli: "ArrayRecord file should be at least 64KB big", bad postscript, …
        raise CorruptShardError(f"shard {path} is not a readable ArrayRecord file: {err}") from err
    if not reader.ok():
        raise CorruptShardError(f"shard {path} is not a readable ArrayRecord file")
    return reader


def _close_reader(reader: array_record_module.ArrayRecordReader, path: Path) -> None:
    try:
        reader.close()
    except RuntimeError as err:
        raise CorruptShardError(f"shard {path} failed on close: {err}") from err


def num_records(path: str | os.PathLike) -> int:
    """Records in one shard.

    Raises:
        FileNotFoundError: no such shard. CorruptShardError: not a readable ArrayRecord file.
    """
    path = _path(path)
    if not path.is_file():
        raise FileNotFoundError(f"shard {path} does not exist")
    reader = _open_reader(path)
    count = reader.num_records()
    _close_reader(reader, path)
    return count


def _decode(data: bytes, path: Path, index: int) -> Trajectory:
    try:
        return Trajectory.from_bytes(data)
    except ValueError as err:
        raise CorruptShardError(f"shard {path} record {index}: {err}") from err


def read_shard(path: str | os.PathLike) -> Iterator[Trajectory]:
    """Yields the trajectories of one shard in order.

    Raises:
        FileNotFoundError: no such shard.
        CorruptShardError: the file, or a record in it, cannot be read (naming the shard and record).
    """
    path = _path(path)
    if not path.is_file():
        raise FileNotFoundError(f"shard {path} does not exist")
    reader = _open_reader(path)
    try:
        for index in range(reader.num_records()):
            try:
                data = reader.read([index])[0]
            except RuntimeError as err:  # riegeli chunk hash mismatch: the bytes on disk were damaged
                raise CorruptShardError(f"shard {path} record {index} cannot be read: {err}") from err
            yield _decode(data, path, index)
    except BaseException:
        try:
            reader.close()
        except RuntimeError:  # already failing: the first error is the one to report
            pass
        raise
    _close_reader(reader, path)


class TrajectorySource:
    """A Grain random-access data source over completed shards (picklable, for Grain workers).

    `source[i]` is a `Trajectory`, or with `as_arrays=True` its `Trajectory.to_arrays()` dict.

        loader = grain.MapDataset.source(TrajectorySource(folder, as_arrays=True)).shuffle(seed=0)

    Args:
        location: a folder of shards, one shard path, or a list of shard paths (paths or `file://` / `gs://` URLs).
        as_arrays: yield dicts of arrays instead of Trajectory objects.

    Raises:
        FileNotFoundError: no completed shard found (the message names the location).
        CorruptShardError: a shard that is not a readable ArrayRecord file (reading a damaged record raises it
            too, naming the shard and the record).
    """

    def __init__(self, location: str | os.PathLike | Sequence[str | os.PathLike], *, as_arrays: bool = False):
        self.paths = list_shards(location)
        if not self.paths:
            raise FileNotFoundError(f"no completed {SHARD_SUFFIX} shards in {location}")
        self.as_arrays = as_arrays
        self._ends = list(itertools.accumulate(num_records(p) for p in self.paths))  # record index ends per shard
        self._source = grain.sources.ArrayRecordDataSource([str(p) for p in self.paths])

    def __len__(self) -> int:
        return len(self._source)

    def locate(self, index: int) -> tuple[Path, int]:
        """(shard, index within it) of global record `index`.

        Raises:
            IndexError: `index` outside [-len, len).
        """
        total = len(self)
        if not -total <= index < total:
            raise IndexError(f"record {index} out of range for {total} records in {len(self.paths)} shards")
        index %= total
        shard = bisect.bisect_right(self._ends, index)
        return self.paths[shard], index - (self._ends[shard - 1] if shard else 0)

    def __getitem__(self, index: int) -> Any:
        index = int(index)
        path, local = self.locate(index)
        try:
            data = self._source[index % len(self)]
        except RuntimeError as err:  # riegeli chunk hash mismatch
            raise CorruptShardError(f"shard {path} record {local} cannot be read: {err}") from err
        trajectory = _decode(data, path, local)
        return trajectory.to_arrays() if self.as_arrays else trajectory

    def __repr__(self) -> str:
        return f"TrajectorySource(paths={[str(p) for p in self.paths]}, as_arrays={self.as_arrays})"
