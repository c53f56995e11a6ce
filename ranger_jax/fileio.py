"""Writing files so that a reader never sees half of one: checkpoints, caches, trajectory data and reports.

`write_atomic` writes a flushed, fsynced temporary file in the destination folder and renames it over the
destination (`os.replace`, atomic on POSIX within one file system), so a killed process leaves either the old
file or the new one, plus at worst a hidden `.<name>.*.tmp` that the failing call removes when it can.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

FILE_MODE = 0o644  # results are meant to be read by others; mkstemp alone would create 0600


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Writes `data` to `path` via a flushed, fsynced temporary file in the same folder and `os.replace`.

    Missing parent folders are created; the file ends with mode 0o644 (`FILE_MODE`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
