"""On-disk JSON response cache, so runs against live services can be replayed exactly.

Entries are keyed by the SHA-256 of a canonical JSON rendering of the request and written atomically
(temporary name, then `os.replace`), so a killed process never leaves a half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

FILE_MODE = 0o644


def request_key(namespace: str, request: Any) -> str:
    """Stable hex key for `request` (any JSON-serialisable value) within `namespace`."""
    canonical = json.dumps([namespace, request], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Writes `data` to `path` via a flushed, fsynced temporary file in the same folder and `os.replace`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)  # mkstemp creates 0600; results are meant to be read by others
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class JsonCache:
    """A folder of `<key[:2]>/<key>.json` files. `None` directory disables caching."""

    def __init__(self, directory: str | os.PathLike | None, namespace: str):
        self.directory = Path(directory) if directory is not None else None
        self.namespace = namespace

    def _path(self, key: str) -> Path:
        assert self.directory is not None
        return self.directory / key[:2] / f"{key}.json"

    def get(self, request: Any) -> Any | None:
        if self.directory is None:
            return None
        path = self._path(request_key(self.namespace, request))
        try:
            return json.loads(path.read_text("utf-8"))["response"]
        except FileNotFoundError:
            return None
        except (ValueError, KeyError):
            return None  # a corrupt entry is a miss; the next put replaces it

    def put(self, request: Any, response: Any) -> None:
        if self.directory is None:
            return
        path = self._path(request_key(self.namespace, request))
        body = json.dumps({"request": request, "response": response}, ensure_ascii=False, sort_keys=True)
        write_atomic(path, body.encode("utf-8"))
