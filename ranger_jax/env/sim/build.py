"""Generates an offline "wild web" world: `python -m ranger_jax.env.sim.build --out DIR --tasks N --seed S`.

Two generator versions, chosen by `world_version` and recorded in `world.json` (`world_version`; absent means
1). Version 2, the default for new worlds, is hard the way the web is (`ranger_jax.env.sim.plan_v2`,
`build_v2`): dead links and failed downloads, re-hosted near-duplicates and keyword-stuffed pages in the
results, seeded ranking noise, leaks and fan mock-ups under the new release's name, requests that name only the
maker or two subjects, occlusion, lighting, scale and JPEG noise in the pictures, special editions that differ
only in their trim, several layouts and phrasings per world, and identity facts spread over pages instead of a
fact sheet. `world_version=1` builds exactly the worlds described below, byte for byte as before version 2
existed. `split="train"` or `"heldout"` builds one side of a train/held-out split (`ranger_jax.env.sim.split`).

Version 1: each task gets its own family of confusable entities in one of the 16 Savanna subcategories:
  - the target: the newest edition of one variant, released 2–20 days before the world's `today`, with few
    pages (1–4) and few images, mostly crowded scenes (temporal novelty, spatial entanglement);
  - its siblings: the same edition in another variant (other colours), the previous edition of the same
    variant (same colours, other pattern and emblem) and sometimes the previous edition of the other variant
    and an edition before that. Older siblings have many pages and images, product shots whose titles match
    natural queries, so they outrank the target in image search (semantic crowding).
Scenes hold 2–4 objects (siblings and entities of other families) side by side; every object's pixel box is
recorded.

Directory layout (built in a sibling temporary folder and renamed into place, so a reader never sees a partial
world; same seed → byte-identical files):

    DIR/world.json      {"version", "seed", "today", "num_tasks", "num_entities", "num_pages", "num_images"}
    DIR/entities.jsonl  one `world.Entity` per line
    DIR/pages.jsonl     {"url", "title", "date", "text", "links", "image_urls"}
    DIR/images.jsonl    {"id", "url", "file", "width", "height", "title", "alt", "page_url", "date",
                         "objects": [{"entity_id", "box": [x0, y0, x1, y1]}],   (per-image annotations)
                         "sha256"}   (of the PNG file: the offline backend vouches for files that match it)
    DIR/images/<id>.png the rendered images
    DIR/tasks.jsonl     {"id", "prompt", "target_id", "target_name", "image_url", "image_file", "bbox",
                         "key_attributes", "sibling_ids", "sibling_only_attributes", "domain", "subcategory",
                         "today"}
    DIR/index.json      {"pages": BM25 index over title and text, "images": BM25 index over title (×3),
                         alt text (×2) and page context (page title and lede)}

`build_world` runs the stages in order, all drawing from one `random.Random(seed)`: plan (`plan.plan_world`:
`today`, families, page and image specs), page texts (`plan.write_page_texts`), image URLs, rendering with
captions, page rows (text with image references and links), tasks, indexes, files, and the atomic commit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import io
import json
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import tqdm

from ranger_jax.env.sim import bm25, build_v2, pages, plan, render, world
from ranger_jax.env.sim import split as split_lib

log = logging.getLogger(__name__)

MAX_TASKS = 5000
DEFAULT_WORLD_VERSION = 2  # what new worlds are built as


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _num_tasks_problem(num_tasks: int) -> str | None:
    """What is wrong with a task count, as the end of a sentence that starts with the argument's name."""
    return None if 1 <= num_tasks <= MAX_TASKS else f"must be in 1..{MAX_TASKS}, got {num_tasks}"


def _out_problem(out: Path) -> str | None:
    """What is wrong with an output folder, as the end of a sentence that starts with the argument's name.

    A missing or empty folder is fine, and so is an existing offline world (it gets replaced).
    """
    if out.exists() and not out.is_dir():
        return f"must be a folder, and {out} is a file"
    if out.exists() and any(out.iterdir()) and not (out / world.WORLD_FILE).exists():
        return f"must be a new or empty folder or an offline world; {out} holds other files (left untouched)"
    return None


def _assign_image_urls(world_plan: plan.WorldPlan, seed: int) -> None:
    """Stage 3: each image's URL on its page's media host, an opaque name that does not tell which entity (or
    edition) the picture shows."""
    for im in world_plan.images:
        host = im.page.url.split("/")[2]
        digest = hashlib.sha256(f"{seed}:{im.id}".encode()).hexdigest()[:20]
        im.url = f"https://media.{host}/img/{digest}.png"


def _draw(im: plan.ImageSpec, seed: int) -> tuple[bytes, list[tuple], tuple[int, int]]:
    """(PNG bytes, one pixel box per item, (width, height)) of one image; its own RNG comes from seed and id."""
    draw_rng = random.Random(f"{seed}:{im.id}")
    if im.clean:
        sc = plan.SUBCATEGORY[im.items[0].subcategory]
        picture, box = render.render_clean(im.items[0], sc.shape, sc.aspect, draw_rng)
        boxes = [box]
    else:
        specs = [(e, plan.SUBCATEGORY[e.subcategory].shape, plan.SUBCATEGORY[e.subcategory].aspect)
                 for e in im.items]
        picture, boxes = render.render_scene(specs, draw_rng)
    buffer = io.BytesIO()
    picture.save(buffer, "PNG", compress_level=1)
    return buffer.getvalue(), boxes, picture.size


def _render_images(world_plan: plan.WorldPlan, seed: int, rng: random.Random,
                   progress: bool) -> tuple[list[dict], dict[str, bytes]]:
    """Stage 4: draws every image and captions it (title and alt text, from `rng`).

    Returns:
        (rows of images.jsonl in image order, {relative path: PNG bytes}).
    """
    rows, files = [], {}
    for im in tqdm.tqdm(world_plan.images, desc="render", disable=not progress):
        png, boxes, (width, height) = _draw(im, seed)
        file = f"{world.IMAGES_DIR}/{im.id}.png"
        files[file] = png
        title, alt = pages.image_caption(im.main, im.clean, im.named, im.setting, rng)
        rows.append({
            "id": im.id, "url": im.url, "file": file, "width": width, "height": height, "title": title,
            "alt": alt, "page_url": im.page.url, "date": im.page.date,
            "objects": [{"entity_id": e.id, "box": list(b)} for e, b in zip(im.items, boxes)],
            "sha256": hashlib.sha256(png).hexdigest(),
        })
    return rows, files


def _page_rows(world_plan: plan.WorldPlan, image_rows: list[dict], rng: random.Random) -> list[dict]:
    """Stage 5: rows of pages.jsonl: each page's text with its images' references (URL and alt text) and links
    to up to two earlier pages of its family (drawn from `rng`)."""
    captions = {row["id"]: row for row in image_rows}
    by_family: dict[int, list[plan.Page]] = {}
    for p in world_plan.pages:
        by_family.setdefault(p.family, []).append(p)
    rows = []
    for p in world_plan.pages:
        earlier = [q for q in by_family[p.family] if q is not p and q.date <= p.date]
        linked = rng.sample(earlier, min(len(earlier), 2))
        refs = [(captions[i]["url"], captions[i]["alt"]) for i in p.images]
        text = pages.page_text(p.title, p.date, p.body, refs, [(q.url, q.title) for q in linked])
        rows.append({"url": p.url, "title": p.title, "date": p.date, "text": text,
                     "links": [q.url for q in linked], "image_urls": [captions[i]["url"] for i in p.images]})
    return rows


def _shots_by_entity(image_rows: list[dict]) -> dict[str, list[dict]]:
    """Per entity id, the image rows that show it, in image order, a row once per object of that entity: built once
    per world, where a scan of every image per task made tasks.jsonl cost tasks × images."""
    shots: dict[str, list[dict]] = {}
    for row in image_rows:
        for obj in row["objects"]:
            shots.setdefault(obj["entity_id"], []).append(row)
    return shots


def _task_row(index: int, roles: dict[str, world.Entity], shots_by_entity: dict[str, list[dict]], today: dt.date,
              rng: random.Random) -> dict:
    """Stage 6, per task: its row of tasks.jsonl: the prompt (from `rng`), the target, the image where it takes
    the largest share of the pixels (its reference picture and box; the first such on a tie), and the attributes
    that tell it from its siblings."""
    target = roles["target"]
    siblings = [e for r, e in roles.items() if r != "target"]
    shots = shots_by_entity.get(target.id, [])

    def box(row: dict) -> list[float]:
        return next(o["box"] for o in row["objects"] if o["entity_id"] == target.id)

    best = max(shots, key=lambda row: world.box_area(box(row)) / (row["width"] * row["height"]))
    key = list(target.attributes.as_dict().values())
    sibling_only = sorted({v for s in siblings for v in s.attributes.as_dict().values()} - set(key))
    return {
        "id": f"task_{index:04d}", "prompt": plan.task_prompt(target, today, rng), "target_id": target.id,
        "target_name": pages.full_name(target), "image_url": best["url"], "image_file": best["file"],
        "bbox": box(best), "key_attributes": key, "sibling_ids": [s.id for s in siblings],
        "sibling_only_attributes": sibling_only, "domain": target.domain, "subcategory": target.subcategory,
        "today": today.isoformat(),
    }


def _indexes(world_plan: plan.WorldPlan, page_rows: list[dict], image_rows: list[dict]) -> dict:
    """Stage 7: the BM25 indexes of index.json: pages by title (x2) and text; images by title (x3), alt text (x2)
    and their page's title and lede."""
    page_index = bm25.build_index(
        (row["url"], bm25.tokenize(row["title"]) * 2 + bm25.tokenize(row["text"])) for row in page_rows)
    page_by_url = {p.url: p for p in world_plan.pages}

    def image_tokens(row: dict) -> list[str]:
        p = page_by_url[row["page_url"]]
        lede = p.body.split("\n\n", 1)[0]
        return bm25.tokenize(row["title"]) * 3 + bm25.tokenize(row["alt"]) * 2 + bm25.tokenize(f"{p.title} {lede}")

    image_index = bm25.build_index((row["url"], image_tokens(row)) for row in image_rows)
    return {"pages": page_index.to_json(), "images": image_index.to_json()}


def _world_files(world_plan: plan.WorldPlan, seed: int, page_rows: list[dict], image_rows: list[dict],
                 task_rows: list[dict], split_side: str | None) -> dict[str, bytes]:
    """Stage 8: the bytes of world.json, the four .jsonl files (one sorted-key JSON object per line) and
    index.json."""
    entities = world_plan.entities
    entity_rows = sorted((e.to_row() for e in entities), key=lambda r: r["id"])
    files = {}
    for name, rows in ((world.ENTITIES_FILE, entity_rows), (world.PAGES_FILE, page_rows),
                       (world.IMAGES_FILE, image_rows), (world.TASKS_FILE, task_rows)):
        files[name] = "".join(_dumps(r) + "\n" for r in rows).encode("utf-8")
    files[world.INDEX_FILE] = _dumps(_indexes(world_plan, page_rows, image_rows)).encode("utf-8")
    meta = {"version": 1, "seed": seed, "today": world_plan.today.isoformat(),
            "num_tasks": len(world_plan.families), "num_entities": len(entities), "num_pages": len(page_rows),
            "num_images": len(image_rows)}
    if split_side is not None:
        meta["split"] = split_side
    files[world.WORLD_FILE] = (_dumps(meta) + "\n").encode("utf-8")
    return files


def _commit(out: Path, files: dict[str, bytes]) -> None:
    """Stage 9: writes `files` into a fresh sibling folder, then renames it onto `out`: the world appears whole or
    not at all. `out` is checked again here, as something may have appeared there while the world was built.

    Raises:
        ValueError: when `out` is a file, or a non-empty folder that is not an offline world (left untouched).
    """
    problem = _out_problem(out)
    if problem:
        raise ValueError(f"out {problem}")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    retired = None
    try:
        staging.chmod(0o755)
        for name, data in files.items():
            path = staging / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        if out.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, retired)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)


def _version_one_files(num_tasks: int, seed: int, split_side: str | None, progress: bool) -> dict[str, bytes]:
    """Every file of a version-1 world, stage by stage (see the module docstring)."""
    rng = random.Random(seed)  # one stream through the stages, in this order
    world_plan = plan.plan_world(num_tasks, rng, accept=split_lib.accepts(split_side))
    plan.write_page_texts(world_plan, rng)
    _assign_image_urls(world_plan, seed)
    image_rows, files = _render_images(world_plan, seed, rng, progress)
    page_rows = _page_rows(world_plan, image_rows, rng)
    shots = _shots_by_entity(image_rows)
    task_rows = [_task_row(i, roles, shots, world_plan.today, rng) for i, roles in enumerate(world_plan.families)]
    files.update(_world_files(world_plan, seed, page_rows, image_rows, task_rows, split_side))
    return files


def build_world(out: str | Path, num_tasks: int, seed: int, *, world_version: int = DEFAULT_WORLD_VERSION,
                split: str | None = None, progress: bool = False) -> Path:
    """Generates a world with `num_tasks` tasks into folder `out` (layout in the module docstring) and returns it.

    The same arguments give byte-identical files. An existing world at `out` is replaced atomically.

    Args:
        out: the world's folder: missing, empty, or an earlier offline world.
        num_tasks: tasks, 1..MAX_TASKS (a version-1 task has one family, a version-2 task one or two).
        seed: seed of every random draw.
        world_version: 2 (the default: the web-like world of `plan_v2`) or 1 (the worlds of the first
            generator, byte for byte).
        split: "train" or "heldout" to build one side of a split whose sides share no family (None: any family).
        progress: show a progress bar while rendering.

    Raises:
        ValueError: when `num_tasks`, `world_version` or `split` is out of range, or `out` is a file or a
            non-empty folder that is not an offline world (nothing is written then).
    """
    problem = _num_tasks_problem(num_tasks)
    if problem:
        raise ValueError(f"num_tasks {problem}")
    if world_version not in world.WORLD_VERSIONS:
        raise ValueError(f"world_version must be one of {list(world.WORLD_VERSIONS)}; got {world_version!r}")
    split_lib.accepts(split)  # raises on an unknown side
    out = Path(out)
    problem = _out_problem(out)
    if problem:
        raise ValueError(f"out {problem}")
    if world_version == 1:
        files = _version_one_files(num_tasks, seed, split, progress)
    else:
        files = build_v2.world_files(num_tasks, seed, split_side=split, progress=progress, indexes=_indexes)
    _commit(out, files)
    meta = json.loads(files[world.WORLD_FILE])
    log.info("built world %s (version %d): %d tasks, %d pages, %d images", out, world_version, num_tasks,
             meta["num_pages"], meta["num_images"])
    return out


def main(argv: list[str] | None = None) -> None:
    """The command line: `python -m ranger_jax.env.sim.build --out DIR [--tasks N] [--seed S]`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", required=True, help="directory to write the world into")
    parser.add_argument("--tasks", type=int, default=40, help="number of tasks (one family each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--world-version", type=int, choices=world.WORLD_VERSIONS, default=DEFAULT_WORLD_VERSION,
                        help="generator version: 2 (web-like, the default) or 1 (the first worlds, byte for byte)")
    parser.add_argument("--split", choices=split_lib.SPLITS, default=None,
                        help="build one side of a train/held-out split (sides never share a family)")
    args = parser.parse_args(argv)
    for flag, problem in (("--tasks", _num_tasks_problem(args.tasks)), ("--out", _out_problem(Path(args.out)))):
        if problem:
            parser.error(f"{flag} {problem}")
    try:
        out = build_world(args.out, args.tasks, args.seed, world_version=args.world_version, split=args.split,
                          progress=True)
    except ValueError:
        problem = _out_problem(Path(args.out))  # something appeared at --out while the world was built
        if problem is None:
            raise
        parser.error(f"--out {problem}")
    meta = world.read_meta(out)
    print(f"{out}: world version {meta.get('world_version', 1)}, today {meta['today']}, {meta['num_tasks']} tasks, "
          f"{meta['num_entities']} entities, {meta['num_pages']} pages, {meta['num_images']} images")


if __name__ == "__main__":
    main()
