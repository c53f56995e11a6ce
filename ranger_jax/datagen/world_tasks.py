"""Offline prompts as offline-world tasks: exact ground truth, written as a world folder the whole library reads.

`task_row(world, prompt)` builds the `tasks.jsonl` row the world's own tasks have (`env.sim.world.load_tasks`): the
target, its reference picture (the world image where it fills the largest visible share) and box, the attributes
that identify it and the ones only its siblings have, its domain, subcategory and the day it is asked on, plus the
prompt's `meta` (source headline, keep reason, …). A target the world never pictures has no ground truth
(`NoGroundTruth`).

`write_world_view(source, out, rows)` makes `out` a world whose tasks are `rows`: its `world.json` is the source's
(with the new task count and where it was derived from), its `tasks.jsonl` is written, and everything else
(entities, pages, images, the search index) is a symbolic link into the source world. So `env.make("savanna_sim",
world=out)`, `data.load_tasks(out)` and `env.sim.savanna.evaluate(out, agent)` all work on the new tasks with exact
rewards, without copying the world.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ranger_jax.datagen import ledger, records
from ranger_jax.env.sim import pages as sim_pages
from ranger_jax.env.sim import world as world_lib

LINKED = (world_lib.ENTITIES_FILE, world_lib.PAGES_FILE, world_lib.IMAGES_FILE, world_lib.INDEX_FILE,
          world_lib.IMAGES_DIR)


class NoGroundTruth(ValueError):
    """The world has no usable picture of a prompt's target."""


def best_picture(the_world: world_lib.World, entity_id: str) -> tuple[world_lib.WorldImage, list[float]]:
    """The world image where `entity_id` fills the largest visible share, and its box there.

    Raises:
        NoGroundTruth: no downloadable image shows it.
    """
    best, best_share, best_box = None, -1.0, None
    for image in the_world.images.values():
        if getattr(image, "error", None):
            continue
        for obj in image.objects:
            if obj.entity_id != entity_id:
                continue
            share = world_lib.box_area(obj.box) * float(getattr(obj, "visible", 1.0)) / (image.width * image.height)
            if share > best_share:
                best, best_share, best_box = image, share, list(obj.box)
    if best is None:
        raise NoGroundTruth(f"no image of the world at {the_world.root} shows entity {entity_id!r}")
    return best, best_box


def task_row(the_world: world_lib.World, prompt: records.Prompt) -> dict[str, Any]:
    """The world-format task row of an offline prompt (see the module docstring).

    Raises:
        ValueError: the prompt has no `target_id`, or one the world lacks.
        NoGroundTruth: the world never pictures the target.
    """
    if prompt.target_id is None or prompt.target_id not in the_world.entities:
        raise ValueError(f"prompt {prompt.id} has target_id {prompt.target_id!r}, which is not in the world at "
                         f"{the_world.root}")
    target = the_world.entities[prompt.target_id]
    siblings = sorted((e for e in the_world.entities.values() if e.family == target.family and e.id != target.id),
                      key=lambda e: e.id)
    image, box = best_picture(the_world, target.id)
    key = list(target.attributes.as_dict().values())
    sibling_only = sorted({v for s in siblings for v in s.attributes.as_dict().values()} - set(key))
    return {"id": prompt.id, "prompt": prompt.prompt, "target_id": target.id, "target_ids": [target.id],
            "target_name": sim_pages.full_name(target), "image_url": image.url, "image_file": image.file, "bbox": box,
            "key_attributes": key, "sibling_ids": [s.id for s in siblings], "sibling_only_attributes": sibling_only,
            "domain": target.domain, "subcategory": target.subcategory, "today": prompt.today,
            "request_kind": "direct", "meta": prompt.meta()}


def write_world_view(source: str | os.PathLike, out: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Writes the world `out` whose tasks are `rows`, linked to `source` (see the module docstring).

    Raises:
        FileNotFoundError / ValueError: `source` is not an offline world.
        FileExistsError: `out` holds a file where a link belongs that is not already that link.
    """
    source, out = Path(source).resolve(), Path(out)
    meta = world_lib.read_meta(source)
    rows = list(rows)
    out.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        link, target = out / name, source / name
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        if link.exists() or link.is_symlink():
            raise FileExistsError(f"{link} exists and is not a link to {target}; remove it or choose another folder")
        link.symlink_to(target, target_is_directory=target.is_dir())
    ledger.write_json(out / world_lib.WORLD_FILE, {**meta, "num_tasks": len(rows), "derived_from": str(source)},
                      indent=None)
    ledger.write_jsonl(out / world_lib.TASKS_FILE, rows)
    return out
