"""The stages of a version-2 world, from one seed to the bytes of its files (`build.build_world` commits them).

Same files as version 1 (layout in `ranger_jax.env.sim.build`), with pictures served as JPEG (`images/<id>.jpg`)
and these additions:

    world.json     + "world_version": 2, "ranking_noise": σ, and "split" for one side of a split
    entities.jsonl + "trim", "maker", and "tag" / "status" where set
    pages.jsonl    + "kind", and "error" for a dead link
    images.jsonl   + "kind", objects' "visible" share, and "error" for a picture that fails to download
                     (no file is written for it: width, height and objects are empty)
    tasks.jsonl    + "target_ids", "target_names", "target_images" (per target: the best picture and the box),
                     "request_kind" (direct, indirect or two_subjects)

Stages, all drawing from one `random.Random(seed)` in this order: plan (`plan_v2.plan_world`), page texts
(`pages_v2.write_page_texts`), picture URLs, pictures with captions (each picture's pixels from its own
`random.Random(f"{seed}:{id}")`, re-hosts from their source's bytes), page rows, tasks, indexes and files.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import tqdm

from ranger_jax.env.sim import pages_v2, photo, plan, plan_v2, requests, world
from ranger_jax.env.sim.world import Entity

WORLD_VERSION = 2
GOOD_VISIBLE = 0.9  # a task's reference picture shows its target at least this unhidden


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _assign_image_urls(world_plan: plan_v2.WorldPlan, seed: int) -> None:
    """Each picture's URL on its page's media host, an opaque name that does not tell what it shows."""
    for im in world_plan.images:
        host = im.page.url.split("/")[2]
        digest = hashlib.sha256(f"{seed}:{im.id}".encode()).hexdigest()[:20]
        im.url = f"https://media.{host}/img/{digest}.jpg"


def _shape(entity: Entity) -> tuple[Entity, str, float]:
    sc = plan.SUBCATEGORY[entity.subcategory]
    return entity, sc.shape, sc.aspect


def _draw(im: plan_v2.ImageSpec, seed: int, done: dict[str, tuple[bytes, dict]]) -> tuple[bytes, list, list, tuple]:
    """(JPEG bytes, boxes, visible shares, size) of one picture."""
    draw_rng = random.Random(f"{seed}:{im.id}")
    if im.kind == "rehost":
        source_bytes, source_row = done[im.source.id]
        boxes = [o["box"] for o in source_row["objects"]]
        data, moved, size = photo.rehost(source_bytes, boxes, draw_rng)
        return data, moved, [o.get("visible", 1.0) for o in source_row["objects"]], size
    if im.clean:
        _, shape, aspect = _shape(im.items[0])
        data, box, size = photo.clean_shot(im.items[0], shape, aspect, draw_rng)
        return data, [box], [1.0], size
    front = im.items.index(im.main) if im.front else None
    data, boxes, visible, size = photo.scene([_shape(e) for e in im.items], draw_rng, front=front,
                                             light="leak" if im.kind == "leak" else "scene")
    return data, boxes, visible, size


def _render_images(world_plan: plan_v2.WorldPlan, seed: int, rng: random.Random, progress: bool
                   ) -> tuple[list[dict], dict[str, bytes]]:
    """Draws every picture that downloads, captions every picture; returns (images.jsonl rows, files)."""
    rows, files, done = [], {}, {}
    for im in tqdm.tqdm(world_plan.images, desc="render", disable=not progress):
        title, alt = pages_v2.image_caption(im, rng)
        row = {"id": im.id, "url": im.url, "title": title, "alt": alt, "page_url": im.page.url,
               "date": im.page.date, "kind": im.kind}
        if im.error is not None:
            row.update(file="", width=0, height=0, objects=[], error=im.error)
        else:
            data, boxes, visible, (width, height) = _draw(im, seed, done)
            file = f"{world.IMAGES_DIR}/{im.id}.jpg"
            files[file] = data
            row.update(file=file, width=width, height=height, sha256=hashlib.sha256(data).hexdigest(),
                       objects=[{"entity_id": e.id, "box": [float(v) for v in b], "visible": v}
                                for e, b, v in zip(im.items, boxes, visible)])
            done[im.id] = (data, row)
        rows.append(row)
    return rows, files


def _page_rows(world_plan: plan_v2.WorldPlan, image_rows: list[dict], layouts: dict[str, str],
               rng: random.Random) -> list[dict]:
    """Rows of pages.jsonl: each page in its site's layout, with picture references and up to two links to
    earlier pages of its family."""
    captions = {row["id"]: row for row in image_rows}
    by_family: dict[int, list[plan_v2.Page]] = {}
    for p in world_plan.pages:
        by_family.setdefault(p.family, []).append(p)
    rows = []
    for p in world_plan.pages:
        earlier = [q for q in by_family[p.family] if q is not p and q.date <= p.date]
        linked = rng.sample(earlier, min(len(earlier), 2))
        refs = [(captions[i]["url"], captions[i]["alt"]) for i in p.images]
        text = pages_v2.page_text(p, layouts[p.site], refs, [(q.url, q.title) for q in linked], rng)
        row = {"url": p.url, "title": p.title, "date": p.date, "text": text, "links": [q.url for q in linked],
               "image_urls": [captions[i]["url"] for i in p.images], "kind": p.kind}
        if p.error is not None:
            row["error"] = p.error
        rows.append(row)
    return rows


def _good_shots(image_rows: list[dict]) -> dict[str, list[tuple[dict, dict]]]:
    """entity id -> the (row, object) pairs of the downloadable photos where it stands unhidden, in picture order.

    Built once per world: a scan of every picture per target made tasks.jsonl quadratic in the world's size
    (~30% of a 960-task world's build: 65 s of CPU against 46)."""
    shots: dict[str, list[tuple[dict, dict]]] = {}
    for row in image_rows:
        if row.get("error") is None and row["kind"] == "photo":
            for obj in row["objects"]:
                if obj["visible"] >= GOOD_VISIBLE:
                    shots.setdefault(obj["entity_id"], []).append((row, obj))
    return shots


def _best_picture(target: Entity, shots: dict[str, list[tuple[dict, dict]]]) -> dict:
    """The downloadable picture where `target` stands unhidden and fills the largest share: {url, file, box}
    (the first such picture on a tie)."""
    def share(row: dict, obj: dict) -> float:
        return world.box_area(obj["box"]) / (row["width"] * row["height"])

    row, obj = max(shots.get(target.id, []), key=lambda s: share(*s))
    return {"image_url": row["url"], "image_file": row["file"], "bbox": obj["box"]}


def _task_row(index: int, task: plan_v2.Task, world_plan: plan_v2.WorldPlan,
              shots: dict[str, list[tuple[dict, dict]]], rng: random.Random) -> dict:
    """A row of tasks.jsonl: the request (from `rng`), the targets, their pictures and what tells them apart."""
    families = [world_plan.families[f] for f in task.families]
    targets = [roles["target"] for roles in families]
    siblings = [e for roles in families for r, e in roles.items() if r != "target"]
    phrases = [requests.subject_phrase(t, world_plan.today, rng, indirect=task.kind == "indirect") for t in targets]
    prompt = requests.request_text(phrases, rng.choice(plan.SUBCATEGORY[targets[0].subcategory].contexts), rng)
    key = list(dict.fromkeys(v for t in targets for v in t.attributes.as_dict().values()))
    sibling_only = sorted({v for s in siblings for v in s.attributes.as_dict().values()} - set(key))
    pictures = [_best_picture(t, shots) for t in targets]
    return {
        "id": f"task_{index:04d}", "prompt": prompt, "target_id": targets[0].id, "target_ids": [t.id for t in targets],
        "target_name": pages_v2.full_name(targets[0]), "target_names": [pages_v2.full_name(t) for t in targets],
        **pictures[0], "target_images": pictures, "key_attributes": key, "sibling_ids": [s.id for s in siblings],
        "sibling_only_attributes": sibling_only, "domain": targets[0].domain, "subcategory": targets[0].subcategory,
        "today": world_plan.today.isoformat(), "request_kind": task.kind,
    }


def world_files(num_tasks: int, seed: int, *, split_side: str | None, progress: bool,
                indexes) -> dict[str, bytes]:
    """Every file of a version-2 world of `num_tasks` tasks from `seed`, as {relative path: bytes}.

    Args:
        indexes: `(world_plan, page_rows, image_rows) -> index.json dict` (the builder's BM25 stage).
    """
    rng = random.Random(seed)
    world_plan = plan_v2.plan_world(num_tasks, rng, split_side=split_side)
    layouts = pages_v2.write_page_texts(world_plan, rng)
    _assign_image_urls(world_plan, seed)
    image_rows, files = _render_images(world_plan, seed, rng, progress)
    page_rows = _page_rows(world_plan, image_rows, layouts, rng)
    shots = _good_shots(image_rows)
    task_rows = [_task_row(i, t, world_plan, shots, rng) for i, t in enumerate(world_plan.tasks)]
    entity_rows = sorted((e.to_row() for e in world_plan.entities), key=lambda r: r["id"])
    for name, rows in ((world.ENTITIES_FILE, entity_rows), (world.PAGES_FILE, page_rows),
                       (world.IMAGES_FILE, image_rows), (world.TASKS_FILE, task_rows)):
        files[name] = "".join(_dumps(r) + "\n" for r in rows).encode("utf-8")
    files[world.INDEX_FILE] = _dumps(indexes(world_plan, page_rows, image_rows)).encode("utf-8")
    meta = {"version": world.FORMAT_VERSION, "world_version": WORLD_VERSION, "seed": seed,
            "today": world_plan.today.isoformat(), "num_tasks": num_tasks, "num_entities": len(entity_rows),
            "num_pages": len(page_rows), "num_images": len(image_rows), "ranking_noise": plan_v2.RANKING_NOISE}
    if split_side is not None:
        meta["split"] = split_side
    files[world.WORLD_FILE] = (_dumps(meta) + "\n").encode("utf-8")
    return files

