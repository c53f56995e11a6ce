"""Generates an offline "wild web" world: `python -m ranger_jax.env.sim.build --out DIR --tasks N --seed S`.

Each task gets its own family of confusable entities in one of the 16 Savanna subcategories:
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
"""

from __future__ import annotations

import argparse
import dataclasses
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

from ranger_jax.env.sim import bm25, catalog, pages, render, world
from ranger_jax.env.sim.world import Entity

log = logging.getLogger(__name__)

FIRST_TODAY = dt.date(2025, 1, 1)  # the world's `today` is drawn from two years starting here
MAX_TASKS = 5000

_SUBCATEGORY = {sc.name: sc for sc in catalog.SUBCATEGORIES}
_ROLE_CODES = {"target": "t", "variant": "v", "previous": "p", "previous_variant": "q", "older": "o"}


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@dataclasses.dataclass
class _Page:
    kind: str
    entities: list[Entity]
    date: str
    family: int
    setting: str
    title: str = ""
    body: str = ""
    url: str = ""
    images: list[str] = dataclasses.field(default_factory=list)  # image ids


@dataclasses.dataclass
class _Image:
    id: str
    main: Entity
    items: list[Entity]
    clean: bool
    named: bool
    setting: str
    page: _Page
    url: str = ""
    boxes: list[tuple] = dataclasses.field(default_factory=list)
    size: tuple[int, int] = (0, 0)


def _colour_pair(rng: random.Random, avoid_primary: str | None = None) -> tuple[str, str]:
    names = [c for c in catalog.COLOURS if c != avoid_primary]
    primary = rng.choice(names)
    secondary = rng.choice([c for c in catalog.COLOURS if c != primary])
    return primary, secondary


def _family(index: int, sc: catalog.Subcategory, today: dt.date, rng: random.Random,
            used: set[str]) -> dict[str, Entity]:
    """Entities of one family by role: target, variant, previous, and optionally previous_variant, older."""
    suffix = rng.choice(sc.suffixes)
    family = catalog.make_word(rng, used) + (f" {suffix}" if suffix else "")
    released = today - dt.timedelta(days=rng.randint(2, 20))
    number = released.year if "{year}" in sc.edition else rng.randint(3, 9)
    v_target, v_other = rng.sample(sc.variants, 2)
    colours_target = _colour_pair(rng)
    colours_other = _colour_pair(rng, avoid_primary=colours_target[0])
    patterns = rng.sample(catalog.PATTERNS, 3)
    previous_release = released - dt.timedelta(days=rng.randint(330, 400))
    older_release = previous_release - dt.timedelta(days=rng.randint(330, 400))

    def entity(role: str, age: int, variant: str, colours: tuple[str, str], day: dt.date) -> Entity:
        n = number - age
        edition = sc.edition.format(n=n, year=n)
        return Entity(
            id=f"e{index:04d}{_ROLE_CODES[role]}", family=family, name=f"{family} {edition} {variant}", noun=sc.noun,
            subcategory=sc.name, domain=sc.domain, edition=edition, variant=variant, released=day.isoformat(),
            primary=colours[0], secondary=colours[1], pattern=patterns[age],
            emblem=catalog.emblem_code(family, n),
        )

    # the previous edition keeps the variant's colours, or at least its primary colour
    kept = colours_target if rng.random() < 0.6 else (colours_target[0], _colour_pair(rng, colours_target[0])[0])
    variant_release = released if rng.random() < 0.4 else released - dt.timedelta(days=rng.randint(1, 12))
    out = {
        "target": entity("target", 0, v_target, colours_target, released),
        "variant": entity("variant", 0, v_other, colours_other, variant_release),
        "previous": entity("previous", 1, v_target, kept, previous_release),
    }
    if rng.random() < 0.6:
        out["previous_variant"] = entity("previous_variant", 1, v_other, colours_other,
                                         previous_release - dt.timedelta(days=rng.randint(0, 20)))
    if rng.random() < 0.5:
        out["older"] = entity("older", 2, v_target, kept, older_release)
    return out


def _after(day: str, today: dt.date, rng: random.Random, within: int) -> str:
    """A date between `day` and min(`day` + `within` days, `today`)."""
    start = dt.date.fromisoformat(day)
    return (start + dt.timedelta(days=rng.randint(0, max(0, min(within, (today - start).days))))).isoformat()


def _plan_family(index: int, roles: dict[str, Entity], sc: catalog.Subcategory, today: dt.date,
                 rng: random.Random, others: list[Entity], out_pages: list[_Page], out_images: list[_Image]) -> None:
    """Pages and image specs (not yet rendered) of one family; appended to `out_pages` / `out_images`."""
    family = [e for e in roles.values()]

    def page(kind: str, entities: list[Entity], date: str) -> _Page:
        p = _Page(kind=kind, entities=entities, date=date, family=index, setting=rng.choice(sc.settings))
        out_pages.append(p)
        return p

    def image(main: Entity, p: _Page, clean: bool, extra: list[Entity] | None = None) -> None:
        items = [main]
        if not clean:  # a scene shows only things already released on its page's date, each once
            pool = [e for e in family if e.id != main.id and e.released <= p.date]
            if extra is not None:
                items += extra
            elif pool and rng.random() < 0.75:
                items.append(rng.choice(pool))
            distractors = [e for e in others if e.family != main.family and e.released <= p.date]
            for _ in range(rng.randint(0 if len(items) > 1 else 1, 2)):
                fresh = [e for e in distractors if e not in items]
                if fresh:
                    items.append(rng.choice(fresh))
            rng.shuffle(items)
        named = rng.random() < 0.5
        out_images.append(_Image(id=f"im{len(out_images):05d}", main=main, items=items, clean=clean, named=named,
                                 setting=p.setting, page=p))
        p.images.append(out_images[-1].id)

    target, variant, previous = roles["target"], roles["variant"], roles["previous"]
    joint = variant.released == target.released
    launch = page("announce", [target, variant] if joint else [target], target.released)
    if rng.random() < 0.3:
        image(target, launch, clean=True)
    scenes = [page("coverage", [target], _after(target.released, today, rng, 20))
              for _ in range(rng.randint(1, 2))]
    for p in scenes:
        image(target, p, clean=False)
    if rng.random() < 0.5:
        p = page("comparison", [target, previous], _after(target.released, today, rng, 20))
        image(target, p, clean=False, extra=[previous])
    if not joint:
        own = page("announce", [variant], variant.released)
        image(variant, own, clean=True)
    if rng.random() < 0.5:
        image(variant, page("coverage", [variant], _after(variant.released, today, rng, 20)), clean=False)
    for role, entity in roles.items():
        if role in ("target", "variant"):
            continue
        weight = 2 if role == "previous" else 1
        launch = page("announce", [entity], entity.released)
        for _ in range(weight + rng.randint(0, 1)):
            image(entity, launch, clean=True)
        for _ in range(weight + rng.randint(0, 2)):
            p = page("review", [entity], _after(entity.released, today, rng, 150))
            image(entity, p, clean=rng.random() < 0.5)
            if rng.random() < 0.5:
                image(entity, p, clean=True)
    if rng.random() < 0.6:
        p = page("sale", [previous], (today - dt.timedelta(days=rng.randint(0, 30))).isoformat())
        image(previous, p, clean=True)
    older = sorted((e for r, e in roles.items() if r not in ("target", "variant")), key=lambda e: e.released)
    last = dt.date.fromisoformat(older[-1].released) + dt.timedelta(days=rng.randint(20, 200))
    cap = dt.date.fromisoformat(target.released) - dt.timedelta(days=1)
    page("catalogue", older, min(last, cap).isoformat())


def _write_page_text(p: _Page, sc: catalog.Subcategory, today: dt.date, rng: random.Random) -> None:
    first = p.entities[0]
    if p.kind == "announce":
        p.title, p.body = pages.announcement(p.entities, p.date, rng)
    elif p.kind == "comparison":
        p.title, p.body = pages.comparison(p.entities[0], p.entities[1], rng)
    elif p.kind == "sale":
        p.title, p.body = pages.sale(first, rng)
    elif p.kind == "catalogue":
        p.title, p.body = pages.catalogue(p.entities)
    else:
        recent = (today - dt.date.fromisoformat(first.released)).days < 30
        p.title, p.body = pages.coverage(first, p.setting, recent, rng)
    site = {"catalogue": catalog.WIKI_SITE, "sale": catalog.SHOP_SITE}.get(p.kind)
    site = site or rng.choice(catalog.SITES[sc.domain])
    section = {"announce": "news", "coverage": "news", "review": "reviews", "comparison": "features",
               "sale": "deals", "catalogue": "wiki"}[p.kind]
    p.url = f"https://{site}/{section}/{pages.slugify(p.title)}-{p.family}{rng.randint(100, 999)}"


def _prompt(target: Entity, sc: catalog.Subcategory, today: dt.date, rng: random.Random) -> str:
    days = (today - dt.date.fromisoformat(target.released)).days
    when = "this week" if days <= 6 else "last week" if days <= 13 else "a few weeks ago"
    subject = rng.choice((
        "the new {family} {variant} {noun}",
        "the just-released {family} {variant} {noun}",
        "the {family} {variant} {noun} that was revealed {when}",
        "the latest {family} {noun} in the {variant} version",
        "the {family} {edition} {variant} {noun}",
    )).format(family=target.family, variant=target.variant, noun=target.noun, when=when, edition=target.edition)
    opener = rng.choice(("Generate an image of", "Create a photo of", "Make a picture of", "Show"))
    return f"{opener} {subject} {rng.choice(sc.contexts)}."


def _commit(out: Path, files: dict[str, bytes]) -> None:
    """Writes `files` into a fresh sibling folder, then renames it onto `out`: the world appears whole or not at all.

    Raises:
        FileExistsError: when `out` is a non-empty folder that is not an offline world (it is left untouched).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists() and any(out.iterdir()) and not (out / world.WORLD_FILE).exists():
        raise FileExistsError(f"{out} exists and is not an offline world; refusing to replace it (pick another --out)")
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


def build_world(out: str | Path, num_tasks: int, seed: int, *, progress: bool = False) -> Path:
    """Generates a world with `num_tasks` tasks into directory `out` (layout in the module docstring).

    Raises:
        ValueError: when `num_tasks` is not in 1..MAX_TASKS.
        FileExistsError: when `out` is a file, or a non-empty folder that is not an offline world.
    """
    if not 1 <= num_tasks <= MAX_TASKS:
        raise ValueError(f"num_tasks must be in 1..{MAX_TASKS}, got {num_tasks}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file, not a folder")
    rng = random.Random(seed)
    today = FIRST_TODAY + dt.timedelta(days=rng.randrange(730))
    order = list(catalog.SUBCATEGORIES)
    rng.shuffle(order)
    used: set[str] = set()
    families = [_family(i, order[i % len(order)], today, rng, used) for i in range(num_tasks)]
    everyone = [e for f in families for e in f.values()]
    plan_pages: list[_Page] = []
    plan_images: list[_Image] = []
    for i, roles in enumerate(families):
        _plan_family(i, roles, order[i % len(order)], today, rng, everyone, plan_pages, plan_images)
    for p in plan_pages:
        _write_page_text(p, _SUBCATEGORY[p.entities[0].subcategory], today, rng)
    by_id = {im.id: im for im in plan_images}
    for im in plan_images:
        host = im.page.url.split("/")[2]
        # opaque CDN-style names: the URL must not tell which entity (or edition) the picture shows
        digest = hashlib.sha256(f"{seed}:{im.id}".encode()).hexdigest()[:20]
        im.url = f"https://media.{host}/img/{digest}.png"

    rows_images = []
    files = {}
    for im in tqdm.tqdm(plan_images, desc="render", disable=not progress):
        draw_rng = random.Random(f"{seed}:{im.id}")
        if im.clean:
            sc = _SUBCATEGORY[im.items[0].subcategory]
            picture, box = render.render_clean(im.items[0], sc.shape, sc.aspect, draw_rng)
            im.boxes = [box]
        else:
            specs = [(e, _SUBCATEGORY[e.subcategory].shape, _SUBCATEGORY[e.subcategory].aspect) for e in im.items]
            picture, im.boxes = render.render_scene(specs, draw_rng)
        im.size = picture.size
        buffer = io.BytesIO()
        picture.save(buffer, "PNG", compress_level=1)
        files[f"{world.IMAGES_DIR}/{im.id}.png"] = buffer.getvalue()
        title, alt = pages.image_caption(im.main, im.clean, im.named, im.setting, rng)
        rows_images.append({
            "id": im.id, "url": im.url, "file": f"{world.IMAGES_DIR}/{im.id}.png", "width": im.size[0],
            "height": im.size[1], "title": title, "alt": alt, "page_url": im.page.url, "date": im.page.date,
            "objects": [{"entity_id": e.id, "box": list(b)} for e, b in zip(im.items, im.boxes)],
            "sha256": hashlib.sha256(buffer.getvalue()).hexdigest(),
        })
    captions = {row["id"]: row for row in rows_images}

    rows_pages = []
    by_family: dict[int, list[_Page]] = {}
    for p in plan_pages:
        by_family.setdefault(p.family, []).append(p)
    for p in plan_pages:
        earlier = [q for q in by_family[p.family] if q is not p and q.date <= p.date]
        linked = rng.sample(earlier, min(len(earlier), 2))
        refs = [(captions[i]["url"], captions[i]["alt"]) for i in p.images]
        text = pages.page_text(p.title, p.date, p.body, refs, [(q.url, q.title) for q in linked])
        rows_pages.append({"url": p.url, "title": p.title, "date": p.date, "text": text,
                           "links": [q.url for q in linked], "image_urls": [by_id[i].url for i in p.images]})

    rows_tasks = []
    for i, roles in enumerate(families):
        target = roles["target"]
        siblings = [e for r, e in roles.items() if r != "target"]
        shots = [row for row in rows_images for obj in row["objects"] if obj["entity_id"] == target.id]

        def share(row: dict) -> float:
            box = next(o["box"] for o in row["objects"] if o["entity_id"] == target.id)
            return world.box_area(box) / (row["width"] * row["height"])

        best = max(shots, key=share)
        key = list(target.attributes().values())
        sibling_only = sorted({v for s in siblings for v in s.attributes().values()} - set(key))
        sc = _SUBCATEGORY[target.subcategory]
        rows_tasks.append({
            "id": f"task_{i:04d}", "prompt": _prompt(target, sc, today, rng), "target_id": target.id,
            "target_name": pages.full_name(target), "image_url": best["url"], "image_file": best["file"],
            "bbox": next(o["box"] for o in best["objects"] if o["entity_id"] == target.id),
            "key_attributes": key, "sibling_ids": [s.id for s in siblings], "sibling_only_attributes": sibling_only,
            "domain": target.domain, "subcategory": target.subcategory, "today": today.isoformat(),
        })

    page_index = bm25.build_index(
        (row["url"], bm25.tokenize(row["title"]) * 2 + bm25.tokenize(row["text"])) for row in rows_pages)
    page_by_url = {p.url: p for p in plan_pages}

    def image_tokens(row: dict) -> list[str]:
        p = page_by_url[row["page_url"]]
        lede = p.body.split("\n\n", 1)[0]
        return bm25.tokenize(row["title"]) * 3 + bm25.tokenize(row["alt"]) * 2 + bm25.tokenize(f"{p.title} {lede}")

    image_index = bm25.build_index((row["url"], image_tokens(row)) for row in rows_images)

    entities_rows = sorted((dataclasses.asdict(e) for e in everyone), key=lambda r: r["id"])
    for name, rows in ((world.ENTITIES_FILE, entities_rows), (world.PAGES_FILE, rows_pages),
                       (world.IMAGES_FILE, rows_images), (world.TASKS_FILE, rows_tasks)):
        files[name] = "".join(_dumps(r) + "\n" for r in rows).encode("utf-8")
    files[world.INDEX_FILE] = _dumps({"pages": page_index.to_json(), "images": image_index.to_json()}).encode("utf-8")
    meta = {"version": world.FORMAT_VERSION, "seed": seed, "today": today.isoformat(), "num_tasks": num_tasks,
            "num_entities": len(everyone), "num_pages": len(rows_pages), "num_images": len(rows_images)}
    files[world.WORLD_FILE] = (_dumps(meta) + "\n").encode("utf-8")
    _commit(out, files)
    log.info("built world %s: %d tasks, %d pages, %d images", out, num_tasks, len(rows_pages), len(rows_images))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", required=True, help="directory to write the world into")
    parser.add_argument("--tasks", type=int, default=40, help="number of tasks (one family each)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        out = build_world(args.out, args.tasks, args.seed, progress=True)
    except (ValueError, FileExistsError) as err:
        parser.error(str(err))
    meta = world.read_meta(out)
    print(f"{out}: today {meta['today']}, {meta['num_tasks']} tasks, {meta['num_entities']} entities, "
          f"{meta['num_pages']} pages, {meta['num_images']} images")


if __name__ == "__main__":
    main()
