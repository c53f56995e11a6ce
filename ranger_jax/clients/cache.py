"""On-disk JSON response cache, so runs against live services can be replayed exactly.

Entries are keyed by the SHA-256 of a canonical JSON rendering of the request and written atomically
(`ranger_jax.fileio.write_atomic`: temporary name, then `os.replace`), so a killed process never leaves a
half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ranger_jax import fileio


def request_key(namespace: str, request: Any) -> str:
    """Stable hex key for `request` (any JSON-serialisable value) within `namespace`."""
    canonical = json.dumps([namespace, request], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class JsonCache:
    """A folder of `<key[:2]>/<key>.json` files. `None` directory disables caching."""

    def __init__(self, directory: str | os.PathLike | None, namespace: str):
        self.directory = Path(directory) if directory is not None else None
        self.namespace = namespace

    def _path(self, key: str) -> Path:
        assert self.directory is not None
        return self.directory / key[:2] / f"{key}.json"

    def get(self, request: Any) -> Any | None:
        """The stored response for `request`, or None (no cache, no entry, or an unreadable entry)."""
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
        """Stores `response` under `request`, atomically (a no-op without a cache directory)."""
        if self.directory is None:
            return
        path = self._path(request_key(self.namespace, request))
        body = json.dumps({"request": request, "response": response}, ensure_ascii=False, sort_keys=True)
        fileio.write_atomic(path, body.encode("utf-8"))
