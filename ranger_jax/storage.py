"""Where checkpoints, published weights and trajectory shards live: a local folder or a storage URL, handed to Orbax,
Grain/ArrayRecord and tensorstore in the form each reads natively.

A *location* is one of:

- a local path (`/data/run1`) or `file:///data/run1` — a local disk, or a shared one (NFS, Filestore, a gcsfuse
  mount of a bucket);
- `gs://bucket/run1` — Google Cloud Storage;
- `memory://run1` — tensorstore's in-memory store (one per process; for tests and scratch);
- any other tensorstore key-value URL (`s3://bucket/run1`, ...).

Each consumer gets its native form:

- **Orbax** checkpoints: `epath(location)` (etils' path: local, or `gs://` through etils and tensorstore's GCS
  driver). Orbax needs directories, so `memory://` is refused with a message that says so.
- **Grain / ArrayRecord** shards: `epath(location)` lists them; each shard path goes to ArrayRecord as its string
  (`gs://` shards are read by ArrayRecord's own GCS reader).
- **tensorstore**: `kvstore(location)` for small files and whole folders of files (`read_bytes`, `write_bytes`,
  `list_names`, `upload_dir`, `download_dir`, `delete_prefix`): how published weights reach a bucket.

Reading `gs://` through etils needs `gcsfs` (the `etils[epath-gcs]` extra) on the machine; tensorstore and
ArrayRecord need nothing more. Object stores have no rename, so writers that need atomic renames (shard writers,
stop files, the GRPO loop's round reader) keep to file-system paths; `tpu/README.md` shows the bucket mounted with
gcsfuse for them.
"""

from __future__ import annotations

import os
from pathlib import Path

import tensorstore as ts
from etils import epath as epath_lib

FILE_SCHEME = "file://"
ORBAX_SCHEMES = ("gs://",)  # URLs etils (and so Orbax and Grain) open as directories
_MEMORY_CONTEXT = ts.Context()  # every memory:// location of this process shares one store


def is_url(location: str | os.PathLike) -> bool:
    """Whether `location` is a URL (`scheme://...`) rather than a local path."""
    return isinstance(location, str) and "://" in location


def local_path(location: str | os.PathLike) -> Path | None:
    """The file-system path of a local path or `file://` URL; None for any other URL."""
    if not is_url(location):
        return Path(location)
    if location.startswith(FILE_SCHEME):
        return Path(location[len(FILE_SCHEME):])
    return None


def join(location: str | os.PathLike, *parts: str) -> str | Path:
    """`location` with `parts` appended (a Path for local locations, a URL string otherwise)."""
    path = local_path(location)
    if path is not None and not (isinstance(location, str) and location.startswith(FILE_SCHEME)):
        return path.joinpath(*parts)
    base = str(location).rstrip("/")
    return "/".join([base, *(p.strip("/") for p in parts)])


def epath(location: str | os.PathLike) -> epath_lib.Path:
    """`location` as an etils path, the form Orbax and Grain open.

    Raises:
        ValueError: a URL scheme etils cannot open as a directory (e.g. `memory://`), naming the location.
    """
    path = local_path(location)
    if path is not None:
        return epath_lib.Path(path)
    if any(str(location).startswith(s) for s in ORBAX_SCHEMES):
        return epath_lib.Path(str(location))
    raise ValueError(f"{location}: Orbax checkpoints and Grain shards need a file-system path or one of "
                     f"{ORBAX_SCHEMES}; other URLs (memory://, s3://, ...) hold files through tensorstore only "
                     "(published weights, storage.read_bytes/write_bytes)")


def kvstore(location: str | os.PathLike) -> ts.KvStore:
    """A tensorstore key-value store rooted at `location` (keys are relative names such as `v000003/config.json`)."""
    path = local_path(location)
    url = f"file://{path.resolve()}/" if path is not None else str(location).rstrip("/") + "/"
    context = _MEMORY_CONTEXT if url.startswith("memory://") else None
    return ts.KvStore.open(url, context=context).result()


def _key_range(prefix: str) -> ts.KvStore.KeyRange:
    start = prefix.encode("utf-8")
    return ts.KvStore.KeyRange(start, start + b"\xff")  # every key that starts with `prefix`


def read_bytes(location: str | os.PathLike, name: str) -> bytes | None:
    """The contents of `name` under `location`, or None when there is no such file."""
    result = kvstore(location).read(name).result()
    return None if result.state == "missing" else bytes(result.value)


def write_bytes(location: str | os.PathLike, name: str, data: bytes) -> None:
    """Writes `name` under `location` in one piece (a reader sees the old contents or the new, never a part)."""
    kvstore(location).write(name, data).result()


def list_names(location: str | os.PathLike, prefix: str = "") -> list[str]:
    """Every file name under `location` that starts with `prefix`, sorted (names are relative to `location`)."""
    store = kvstore(location)
    keys = store.list(_key_range(prefix) if prefix else None).result()
    return sorted(k.decode("utf-8") for k in keys)


def delete_prefix(location: str | os.PathLike, prefix: str) -> None:
    """Deletes every file under `location` whose name starts with `prefix` (e.g. `v000001/`)."""
    if not prefix:
        raise ValueError(f"delete_prefix needs a non-empty prefix (refusing to empty {location})")
    kvstore(location).delete_range(_key_range(prefix)).result()


def upload_dir(local_dir: str | os.PathLike, location: str | os.PathLike, prefix: str, *,
               last: tuple[str, ...] = ()) -> list[str]:
    """Copies every file of `local_dir` (recursively) to `location` under `prefix`; the names in `last` are
    written after all others (e.g. a file whose presence tells readers the rest is complete). Returns the names."""
    store = kvstore(location)
    local_dir = Path(local_dir)
    files = sorted(p for p in local_dir.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.relative_to(local_dir).as_posix() in last)
    names = []
    for path in files:
        name = prefix + path.relative_to(local_dir).as_posix()
        store.write(name, path.read_bytes()).result()
        names.append(name)
    return names


def download_dir(location: str | os.PathLike, prefix: str, local_dir: str | os.PathLike) -> Path:
    """Copies every file under `location` + `prefix` into `local_dir` (created), keeping relative names.

    Raises:
        FileNotFoundError: nothing is stored under the prefix (naming the location and prefix).
    """
    store = kvstore(location)
    names = list_names(location, prefix)
    if not names:
        raise FileNotFoundError(f"nothing stored under {location} / {prefix}")
    local_dir = Path(local_dir)
    for name in names:
        target = local_dir / name[len(prefix):]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(bytes(store.read(name).result().value))
    return local_dir
