"""Published policy weights: the learner writes numbered HF checkpoints into a folder, actors load the newest.

    weights.publish(model, "/data/run1/weights", 12, tokenizer_dir="/models/Qwen3-VL-8B-Instruct")
    version = weights.latest_version("/data/run1/weights")              # 12
    model = weights.load_version("/data/run1/weights", version, mesh=mesh)

Layout of the folder:

    v000011/   v000012/      HF checkpoint folders (config.json, model*.safetensors, tokenizer files)
    latest                   the newest published version as text ("12\\n")

A version is written into a hidden temporary sibling (`.v000012.<pid>.<nonce>.tmp`) and renamed into place only
when complete, then `latest` is replaced atomically: a reader that lists the folder or follows `latest` never sees
half a checkpoint, and a publisher killed mid-write leaves only a hidden temporary. Each folder is a plain HF
checkpoint that `qwen3_vl.load`, transformers and SGLang's `/update_weights_from_disk` read. Only the newest
`keep` versions stay; older ones are renamed to a hidden name before they are deleted, so they disappear from
listings at once.

The folder may also be a storage URL (`gs://bucket/run1/weights`, `memory://w`, see `ranger_jax.storage`),
written through tensorstore: a version is saved to a local temporary folder and uploaded file by file with its
`config.json` last, and a version counts as published once its `config.json` is there; `latest` is written after
that. Readers get a local copy (`local_version`, cached under `~/.cache/ranger_jax/weights` unless told otherwise)
to load, or to hand to an SGLang server on the same machine.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from ranger_jax import fileio, storage
from ranger_jax.models import qwen3_vl
from ranger_jax.processing import tokenizer as tokenizer_lib

log = logging.getLogger(__name__)

LATEST_FILE = "latest"
DEFAULT_KEEP = 3  # versions kept: the newest, plus slack for actors still loading an older one
# Files of an HF model folder besides the weights that tokenizers and processors read.
TOKENIZER_FILES = tokenizer_lib.TOKENIZER_FILES
# the settings a policy acts with (`rollout.trained_env.FILE_NAME`): evaluations run a version as it was trained
TRAINED_ENV_FILE = "ranger_env.json"
_VERSION_NAME = re.compile(r"v(\d{6,})")
CONFIG_FILE = "config.json"  # uploaded last: a version in a bucket is complete once it exists
DEFAULT_CACHE = Path("~/.cache/ranger_jax/weights")


def _check_version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"a weights version must be an int >= 0; got {version!r}")
    return version


def _remote(folder: str | os.PathLike) -> bool:
    return storage.local_path(folder) is None


def _local(folder: str | os.PathLike) -> Path:
    return storage.local_path(folder)


def version_name(version: int) -> str:
    """The folder name of `version` (`v000012`)."""
    return f"v{_check_version(version):06d}"


def version_dir(folder: str | os.PathLike, version: int) -> Path | str:
    """The checkpoint folder of `version` in `folder` (`folder/v000012`; a URL string for a storage URL), whether
    or not it exists."""
    if _remote(folder):
        return storage.join(folder, version_name(version))
    return _local(folder) / version_name(version)


def list_versions(folder: str | os.PathLike) -> list[int]:
    """Complete versions in `folder`, ascending (temporaries and deletions in progress are hidden; a missing folder
    has none)."""
    if _remote(folder):
        found = (_VERSION_NAME.fullmatch(name.split("/")[0]) for name in storage.list_names(folder)
                 if name.count("/") == 1 and name.endswith("/" + CONFIG_FILE))
        return sorted(int(m.group(1)) for m in found if m)
    folder = _local(folder)
    if not folder.is_dir():
        return []
    found = (_VERSION_NAME.fullmatch(p.name) for p in folder.iterdir() if p.is_dir())
    return sorted(int(m.group(1)) for m in found if m)


def _exists(folder: str | os.PathLike, version: int) -> bool:
    if _remote(folder):
        return storage.read_bytes(folder, f"{version_name(version)}/{CONFIG_FILE}") is not None
    return (_local(folder) / version_name(version)).is_dir()


def latest_version(folder: str | os.PathLike) -> int | None:
    """The version `folder/latest` names, or None when nothing has been published there yet.

    Raises:
        ValueError: `latest` does not hold one int (naming the file and what it holds).
        FileNotFoundError: `latest` names a version whose folder is gone.
    """
    pointer = storage.join(folder, LATEST_FILE) if _remote(folder) else _local(folder) / LATEST_FILE
    if _remote(folder):
        data = storage.read_bytes(folder, LATEST_FILE)
        if data is None:
            return None
        text = data.decode("utf-8", "replace").strip()
    else:
        try:
            text = pointer.read_text("utf-8").strip()
        except FileNotFoundError:
            return None
    if not text.isdigit():
        raise ValueError(f"weights pointer {pointer} should hold one version number, holds {text[:40]!r}")
    version = int(text)
    if not _exists(folder, version):
        raise FileNotFoundError(f"weights pointer {pointer} names version {version}, but {version_dir(folder, version)}"
                                f" does not exist; published versions: {list_versions(folder)}")
    return version


def _remove(path: Path) -> None:
    """Hides `path` under a temporary name first, so a listing never shows it half deleted."""
    hidden = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.deleting")
    try:
        os.rename(path, hidden)
    except FileNotFoundError:
        return
    shutil.rmtree(hidden, ignore_errors=True)


def _point_latest(folder: str | os.PathLike, version: int | None) -> None:
    """Points `latest` at `version` (written atomically), or removes it for None."""
    if _remote(folder):
        if version is None:
            storage.delete_prefix(folder, LATEST_FILE)
        else:
            storage.write_bytes(folder, LATEST_FILE, f"{version}\n".encode("utf-8"))
    elif version is None:
        (_local(folder) / LATEST_FILE).unlink(missing_ok=True)
    else:
        fileio.write_atomic(_local(folder) / LATEST_FILE, f"{version}\n".encode("utf-8"))


def _delete_version(folder: str | os.PathLike, version: int) -> None:
    if _remote(folder):
        storage.delete_prefix(folder, version_name(version) + "/")
    else:
        _remove(_local(folder) / version_name(version))


def withdraw(folder: str | os.PathLike, *, from_version: int) -> list[int]:
    """Removes the versions >= `from_version` from `folder`, first pointing `latest` at the newest one left (or
    removing it when none is left), so a reader never meets a pointer to a missing version. A learner resuming
    from its checkpoint of step `from_version` calls it before publishing that version again: the later ones came
    from updates that were lost. Process 0 acts; returns the versions removed.

    Raises:
        ValueError: a bad version.
    """
    from_version = _check_version(from_version)
    versions = list_versions(folder)
    gone = [v for v in versions if v >= from_version]
    if not gone or jax.process_index() != 0:
        return gone
    left = [v for v in versions if v < from_version]
    _point_latest(folder, left[-1] if left else None)
    for version in gone:
        _delete_version(folder, version)
    log.info("withdrew weights versions %s from %s", gone, folder)
    return gone


def publish(model: qwen3_vl.Qwen3VL, folder: str | os.PathLike, version: int, *,
            tokenizer_dir: str | os.PathLike | None = None, keep: int = DEFAULT_KEEP) -> Path | str:
    """Writes `model` as HF checkpoint `folder/v{version:06d}` atomically, points `latest` at it, prunes old ones.

    Every process calls it (parameters sharded over hosts are gathered); process 0 writes.

    Args:
        model: the policy to publish.
        folder: the weights folder (created), or a storage URL (see the module docstring).
        version: the new version, newer than the published latest (actors move forward only).
        tokenizer_dir: a folder whose tokenizer and processor files (`TOKENIZER_FILES`), and `ranger_env.json` (the
            env the policy acts in) if it has one, are copied alongside, so the version is a complete checkpoint for
            actors and evals; None = weights only.
        keep: how many newest versions stay (older ones are deleted).

    Returns:
        The version's folder (its URL for a storage URL).

    Raises:
        ValueError: a bad version or keep, or a version not newer than the published latest (naming both).
        FileExistsError: the version's folder already exists.
        FileNotFoundError: a tokenizer_dir without tokenizer.json.
    """
    target = version_dir(folder, version)
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an int >= 1; got {keep!r}")
    if tokenizer_dir is not None and not (Path(tokenizer_dir) / "tokenizer.json").is_file():
        raise FileNotFoundError(f"tokenizer_dir {tokenizer_dir} has no tokenizer.json")
    latest = latest_version(folder)
    if latest is not None and version <= latest:
        raise ValueError(f"cannot publish version {version} to {folder}: not newer than the published latest "
                         f"{latest}")
    if _exists(folder, version):
        raise FileExistsError(f"weights version {version} already exists at {target}")
    if _remote(folder):
        _publish_remote(model, folder, version, tokenizer_dir)
    else:
        _publish_local(model, _local(folder), version, tokenizer_dir)
    if jax.process_index() != 0:
        return target
    _point_latest(folder, version)
    for old in list_versions(folder)[:-keep]:
        _delete_version(folder, old)
    log.info("published weights version %d to %s", version, target)
    return target


def _copy_policy_files(source_dir: str | os.PathLike, out_dir: str | os.PathLike) -> None:
    """The tokenizer and processor files of `source_dir`, and its `ranger_env.json` if there, into `out_dir`."""
    tokenizer_lib.copy_tokenizer_files(source_dir, out_dir)
    if (Path(source_dir) / TRAINED_ENV_FILE).is_file():
        shutil.copyfile(Path(source_dir) / TRAINED_ENV_FILE, Path(out_dir) / TRAINED_ENV_FILE)


def _publish_local(model: qwen3_vl.Qwen3VL, folder: Path, version: int,
                   tokenizer_dir: str | os.PathLike | None) -> None:
    """Saves into a hidden temporary sibling and renames it to the version's folder (process 0 writes)."""
    writer = jax.process_index() == 0
    target = folder / version_name(version)
    temp = folder / f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    if writer:
        folder.mkdir(parents=True, exist_ok=True)
    try:
        qwen3_vl.save(model, temp)  # every process takes part in gathering; only process 0 writes
        if not writer:
            return
        if tokenizer_dir is not None:
            _copy_policy_files(tokenizer_dir, temp)
        os.rename(temp, target)  # the version appears complete or not at all
    except BaseException:
        if writer:
            shutil.rmtree(temp, ignore_errors=True)
        raise


def _publish_remote(model: qwen3_vl.Qwen3VL, folder: str, version: int,
                    tokenizer_dir: str | os.PathLike | None) -> None:
    """Saves into a local temporary folder and uploads it with `config.json` last (process 0 uploads)."""
    with tempfile.TemporaryDirectory(prefix=f"{version_name(version)}.") as temp:
        qwen3_vl.save(model, temp)  # every process takes part in gathering; only process 0 writes
        if jax.process_index() != 0:
            return
        if tokenizer_dir is not None:
            _copy_policy_files(tokenizer_dir, temp)
        storage.upload_dir(temp, folder, version_name(version) + "/", last=(CONFIG_FILE,))


def local_version(folder: str | os.PathLike, version: int, *, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local folder holding published `version`: the version's own folder, or for a storage URL a copy
    downloaded into `cache_dir` (default `~/.cache/ranger_jax/weights`), reused when already complete.

    Raises:
        FileNotFoundError: no such version (naming the folder and the versions it holds).
    """
    if not _exists(folder, version):
        raise FileNotFoundError(f"weights folder {folder} has no version {version} ({version_name(version)}); "
                                f"published versions: {list_versions(folder)}")
    if not _remote(folder):
        return _local(folder) / version_name(version)
    cache = Path(cache_dir or DEFAULT_CACHE).expanduser() / re.sub(r"[^A-Za-z0-9._-]+", "_", str(folder))
    target = cache / version_name(version)
    if (target / CONFIG_FILE).is_file():
        return target
    temp = cache / f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        storage.download_dir(folder, version_name(version) + "/", temp)
        os.replace(temp, target)  # another reader may have finished first: its copy is the same version
    except OSError:
        if not (target / CONFIG_FILE).is_file():
            raise
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return target


def load_version(folder: str | os.PathLike, version: int, *, mesh: jax.sharding.Mesh | None = None,
                 dtype: Any = jnp.float32, param_dtype: Any = None, remat: str = "none", attention: str = "blocked",
                 sharding_rules: str = "sample", cache_dir: str | os.PathLike | None = None) -> qwen3_vl.Qwen3VL:
    """Loads published `version` from `folder` (`qwen3_vl.load` of its checkpoint folder; see `local_version`).

    Args:
        folder: the weights folder or storage URL.
        version: a published version (`latest_version(folder)`).
        mesh, dtype, param_dtype, remat, attention, sharding_rules: as in `qwen3_vl.load`; sharding_rules defaults
            to "sample", the layout actors sample with (a sampler takes new weights only with its own config).
        cache_dir: where a storage URL's version is copied to before loading.

    Raises:
        FileNotFoundError: no such version (naming the folder and the versions it holds).
        CheckpointError: a damaged checkpoint (naming the key).
    """
    path = local_version(folder, version, cache_dir=cache_dir)
    return qwen3_vl.load(path, mesh=mesh, dtype=dtype, param_dtype=param_dtype, remat=remat, attention=attention,
                         sharding_rules=sharding_rules)
