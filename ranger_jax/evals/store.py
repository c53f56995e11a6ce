"""The folder of one eval run: per-item results written as they finish, so an interrupted run resumes.

    <run>/run.json                    what was evaluated, and how (checked again when the run resumes)
    <run>/items/<stem>/record.json    one finished item: its answer, generation, judge output and scores
    <run>/items/<stem>/image.png      the generated image (when there is one)
    <run>/items/<stem>/refs/…         the references the policy chose (crops with the images they were cut from)
    <run>/items/<stem>/trajectory.rjt the policy's episode (`data.trajectory.Trajectory.to_bytes`)
    <run>/items/.<stem>.partial/      an item in progress; removed when a run starts

An item is built in its `.partial` folder and renamed into place with its `record.json` inside, so a killed run
leaves each item either finished or absent: the next run skips finished items and redoes the rest.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ranger_jax import fileio
from ranger_jax.evals import items as items_lib

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
RECORD_FILE = "record.json"
IMAGE_FILE = "image.png"
TRAJECTORY_FILE = "trajectory.rjt"
REFS_DIR = "refs"
ITEMS_DIR = "items"
PARTIAL_SUFFIX = ".partial"
# settings that must not change when a run resumes (results made with other ones would be mixed)
FIXED_SETTINGS = ("benchmark", "bench", "policy", "generator", "judge")


def write_json(path: str | os.PathLike, value: Any) -> None:
    """`value` as indented UTF-8 JSON, written atomically."""
    fileio.write_atomic(path, json.dumps(value, indent=2, ensure_ascii=False).encode("utf-8"))


def write_jsonl(path: str | os.PathLike, rows: Iterable[Any]) -> None:
    """One JSON value per line (UTF-8), written atomically."""
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    fileio.write_atomic(path, text.encode("utf-8"))


def item_image(run_dir: str | os.PathLike, item_id: str, record: Mapping[str, Any]) -> Path | None:
    """The generated image of a finished item in run folder `run_dir` (None when the record has none)."""
    if not record.get("image"):
        return None
    return Path(run_dir) / ITEMS_DIR / items_lib.file_stem(item_id) / record["image"]


def copy_images(items: Iterable[Any], records: Mapping[str, Mapping[str, Any]], run_dir: str | os.PathLike,
                folder: str | os.PathLike, file_name) -> None:
    """Copies each item's generated image into `folder` as `file_name(item)` (items without one are skipped)."""
    for item in items:
        record = records.get(item.id)
        source = None if record is None else item_image(run_dir, item.id, record)
        if source is not None:
            target = Path(folder) / file_name(item)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())


class RunStore:
    """One run folder (layout in the module docstring).

    Args:
        root: the run folder (created by `start`).
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.items_dir = self.root / ITEMS_DIR

    def start(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Opens the run: writes `run.json` (or checks it against `settings` when resuming) and removes the
        folders of items that were in progress.

        Returns:
            The settings recorded for the run.

        Raises:
            ValueError: a resumed run whose recorded settings differ in one of FIXED_SETTINGS (naming them).
        """
        path = self.root / RUN_FILE
        settings = dict(settings)
        if path.is_file():
            recorded = json.loads(path.read_text("utf-8"))
            changed = [key for key in FIXED_SETTINGS if recorded.get(key) != settings.get(key)]
            if changed:
                raise ValueError(f"{self.root} holds a run with other settings for {changed} "
                                 f"(recorded {[recorded.get(k) for k in changed]}, now "
                                 f"{[settings.get(k) for k in changed]}); use another output folder")
            settings = {**recorded, **{k: v for k, v in settings.items() if k not in FIXED_SETTINGS}}
        write_json(path, settings)
        self.items_dir.mkdir(parents=True, exist_ok=True)
        for partial in self.items_dir.glob(f".*{PARTIAL_SUFFIX}"):
            log.info("removing unfinished item folder %s", partial)
            shutil.rmtree(partial)
        return settings

    def settings(self) -> dict[str, Any]:
        """The recorded `run.json`.

        Raises:
            FileNotFoundError: the folder holds no run.
        """
        path = self.root / RUN_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{self.root} is not an eval run folder (no {RUN_FILE})")
        return json.loads(path.read_text("utf-8"))

    def item_dir(self, item_id: str) -> Path:
        """The folder of a finished item."""
        return self.items_dir / items_lib.file_stem(item_id)

    def partial(self, item_id: str) -> Path:
        """A fresh, empty folder to build the item in."""
        path = self.items_dir / f".{items_lib.file_stem(item_id)}{PARTIAL_SUFFIX}"
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    def commit(self, item_id: str, record: Mapping[str, Any]) -> Path:
        """Writes the record into the item's partial folder and moves the folder into place (replacing an older
        result of the item, e.g. a failed one being retried)."""
        partial = self.items_dir / f".{items_lib.file_stem(item_id)}{PARTIAL_SUFFIX}"
        write_json(partial / RECORD_FILE, record)
        final = self.item_dir(item_id)
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        return final

    def records(self) -> dict[str, dict[str, Any]]:
        """{item id: record} of every finished item.

        Raises:
            ValueError: a record file that is not valid JSON or lacks its `id` (naming the file).
        """
        out = {}
        if not self.items_dir.is_dir():
            return out
        for path in sorted(self.items_dir.glob(f"*/{RECORD_FILE}")):
            try:
                record = json.loads(path.read_text("utf-8"))
            except ValueError as err:
                raise ValueError(f"item record {path} is not valid JSON: {err}") from err
            if not isinstance(record, dict) or not isinstance(record.get("id"), str):
                raise ValueError(f"item record {path} has no 'id'")
            out[record["id"]] = record
        return out
