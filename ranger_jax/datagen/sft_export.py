"""Kept trajectories as SFT data two ways: our trajectory shards, and a ShareGPT dataset LLaMA-Factory loads.

The ShareGPT export is laid out as Gen-Searcher's `gen_sft` is:

    <out>/dataset_info.json    {"gen_sft": {"file_name": "gen_sft.json", "formatting": "sharegpt",
                                 "columns": {"messages": "messages", "images": "images"},
                                 "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                          "assistant_tag": "assistant", "system_tag": "system"}}}
    <out>/gen_sft.json         [{"messages": [{"role", "content"}, …], "images": ["images/<task>/<k>.png", …]}, …]
    <out>/images/<task>/<k>.png

One row per trajectory: its messages in order (system, task, then assistant turns and tool responses as user
turns), each image part written as an `<image>` placeholder. A user turn's images come first, then its text, which
is where the policy's tokens put them (`ChatRenderer.render_user`), so LLaMA-Factory's expansion of the
placeholders — and `data.sft_file.SftFile`, which reads the export back — renders the tokens the policy saw. The
images are the PNGs the policy's processor received (`TrajectoryImage.png`), paths relative to the dataset folder.

Every file is written to a temporary sibling folder first and the folder renamed into place, so a reader never sees
half an export; an earlier export at `out` is replaced.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ranger_jax.data import shards, trajectory
from ranger_jax.datagen import ledger
from ranger_jax.processing import sharegpt

DATASET_NAME = "gen_sft"
FILE_NAME = "gen_sft.json"
DATASET_INFO = {DATASET_NAME: {
    "file_name": FILE_NAME, "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"},
    "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
             "system_tag": "system"}}}


def replace_folder(out: str | os.PathLike, build: Callable[[Path], Any]) -> Any:
    """Runs `build(staging)` on a fresh sibling folder of `out`, then renames it onto `out` (an old `out` goes);
    returns what `build` returned. On an error nothing at `out` changes."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        staging.chmod(0o755)
        result = build(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    retired = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    if out.exists():
        os.replace(out, retired / out.name)
    try:
        os.replace(staging, out)
    except BaseException:
        if (retired / out.name).exists():
            os.replace(retired / out.name, out)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if out.exists():
            shutil.rmtree(retired, ignore_errors=True)
    return result


def sharegpt_row(traj: trajectory.Trajectory, image_paths: dict[str, str]) -> dict[str, Any]:
    """The ShareGPT row of one trajectory; `image_paths` maps each image's id to its path in the export.

    Raises:
        ValueError: a message shows an image the trajectory does not hold (naming the task and id).
    """
    messages, images = [], []
    for message in traj.messages:
        content = message["content"]
        if isinstance(content, str):
            messages.append({"role": message["role"], "content": content})
            continue
        shown = [p["img_id"] for p in content if p.get("type") == "image"]
        missing = [i for i in shown if i not in image_paths]
        if missing:
            raise ValueError(f"trajectory of task {traj.task_id!r} shows images {missing} it does not hold")
        text = "".join(p.get("text", "") for p in content if p.get("type") == "text")
        messages.append({"role": message["role"], "content": sharegpt.IMAGE_TAG * len(shown) + text})
        images.extend(image_paths[i] for i in shown)
    return {"messages": messages, "images": images}


def export_sharegpt(trajectories: Iterable[trajectory.Trajectory], out: str | os.PathLike) -> dict[str, int]:
    """Writes the ShareGPT dataset of the module docstring to `out`; returns {"rows", "images"}."""
    trajectories = list(trajectories)

    def build(folder: Path) -> dict[str, int]:
        rows, count = [], 0
        for traj in trajectories:
            paths = {}
            for k, image in enumerate(traj.images):
                if image.img_id is None:
                    continue
                relative = f"images/{traj.task_id}/{k:03d}.png"
                (folder / relative).parent.mkdir(parents=True, exist_ok=True)
                (folder / relative).write_bytes(image.png)
                paths[image.img_id] = relative
                count += 1
            rows.append(sharegpt_row(traj, paths))
        ledger.write_json(folder / FILE_NAME, rows, indent=None)
        ledger.write_json(folder / "dataset_info.json", DATASET_INFO)
        return {"rows": len(rows), "images": count}

    return replace_folder(out, build)


def export_shards(trajectories: Sequence[trajectory.Trajectory], out: str | os.PathLike, *,
                  records_per_shard: int = 256, prefix: str = "sft") -> list[Path]:
    """Writes `trajectories` as trajectory shards in the folder `out` (replacing it); returns the shard paths."""
    def build(folder: Path) -> list[str]:
        with shards.RollingShardWriter(folder, prefix=prefix, records_per_shard=records_per_shard) as writer:
            for traj in trajectories:
                writer.write(traj)
        return [p.name for p in writer.shards]

    names = replace_folder(out, build)
    return [Path(out) / name for name in names]
