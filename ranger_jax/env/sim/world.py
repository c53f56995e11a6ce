"""The offline world as typed values: entities, pages, images with object boxes, and tasks; plus box geometry.

`load_world(dir)` reads a directory written by `ranger_jax.env.sim.build` (layout in that module's docstring)
and `load_tasks(dir)` turns its `tasks.jsonl` into `env.Task`s whose `ground_truth` holds what
`ranger_jax.env.sim.rewards.score` needs.

Two generations of worlds share these types. A world of generator version 1 (`world.json` without a
`world_version` key) has four attributes per entity and every page and image served; a version-2 world (file
format 2, `"world_version": 2`) adds fields that are absent from version-1 rows, so those rows read back exactly
as before: an entity's `trim` colour, `maker` (who makes or fields it, for requests that do not name the family),
`tag` (a special edition's label) and `status` ("release", or "leak" / "mockup" for pictures of things that were
never released as shown); a page's or image's `error` (a dead link or a failed download, what the backend
answers instead); a placement's `visible` share (the part of the object not hidden behind objects in front);
a page's `kind`; and the world's `ranking_noise`, `split` and tasks with several targets.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ranger_jax.env import core

FORMAT_VERSION = 2  # the file format new worlds are written in (version-2 worlds)
FORMAT_VERSIONS = (1, 2)  # file formats this loader reads: 1 for version-1 worlds, 2 for version-2 worlds
WORLD_VERSIONS = (1, 2)  # generator versions (`build.build_world(world_version=...)`)
WORLD_FILE = "world.json"
ENTITIES_FILE = "entities.jsonl"
PAGES_FILE = "pages.jsonl"
IMAGES_FILE = "images.jsonl"
TASKS_FILE = "tasks.jsonl"
INDEX_FILE = "index.json"
IMAGES_DIR = "images"

Box = tuple[float, float, float, float]  # [x0, y0, x1, y1] in pixels, x1 > x0 and y1 > y0


def box_area(box: Box) -> float:
    """Area of a box; 0 for an empty or inverted one."""
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def box_intersection(a: Box, b: Box) -> Box:
    """The overlap of two boxes (possibly empty: check `box_area`)."""
    return (max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))


def box_iou(a: Box, b: Box) -> float:
    """Intersection over union of two boxes, 0 when either is empty."""
    inter = box_area(box_intersection(a, b))
    union = box_area(a) + box_area(b) - inter
    return inter / union if union > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Attributes:
    """The four visible attributes of a thing: what tells it from its look-alikes, in the pixels and in text.

    One record for the entity as built, the fact sheet an agent reads on a page, and what a detector sees in a
    picture, so the three compare with `==`.

    Attributes:
        primary, secondary: colour names (keys of `catalog.COLOURS`).
        pattern: one of `catalog.PATTERNS`, drawn in the secondary colour.
        emblem: the emblem text printed on it.
        trim: colour of the thin outline around it (version-2 worlds; None in version 1).
    """

    primary: str
    secondary: str
    pattern: str
    emblem: str
    trim: str | None = None

    def as_dict(self) -> dict[str, str]:
        """{slot name: value} in the order primary, secondary, pattern, emblem[, trim] (trim only when set)."""
        out = dataclasses.asdict(self)
        if self.trim is None:
            del out["trim"]
        return out


@dataclasses.dataclass(frozen=True)
class Entity:
    """One thing in the world (a kit, a phone finish, a poster), identified by its visible attributes.

    Attributes:
        id: stable id, e.g. "e0012".
        family: series name, e.g. "Lakeside FC".
        name: full name, e.g. "Lakeside FC 2026 Home"; `noun` completes it in text.
        noun: what it is ("kit").
        subcategory, domain: its Savanna subcategory and domain.
        edition: edition label ("2026", "7", "Season 3").
        variant: variant name ("Home", "Sage").
        released: release date, YYYY-MM-DD.
        attributes: its colours, pattern and emblem.
        maker: who makes or fields the family ("Norvale" for a club from Norvale); "" in version-1 worlds.
        tag: label of a special edition ("Limited Edition"), part of its name; "" for the standard one.
        status: "release", or "leak" / "mockup": a look that circulated under a release's name but is not it.
    """

    id: str
    family: str
    name: str
    noun: str
    subcategory: str
    domain: str
    edition: str
    variant: str
    released: str
    attributes: Attributes
    maker: str = ""
    tag: str = ""
    status: str = "release"

    def to_row(self) -> dict[str, str]:
        """Its row of entities.jsonl: every field, the attributes inline; fields at their defaults are left out
        (so a version-1 row has exactly the version-1 keys)."""
        row = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "attributes" and (f.name not in _ENTITY_DEFAULTS or getattr(self, f.name) != f.default)}
        return {**row, **self.attributes.as_dict()}


_ENTITY_DEFAULTS = ("maker", "tag", "status")  # optional fields of Entity, absent from rows at their defaults


@dataclasses.dataclass(frozen=True)
class Placement:
    """An entity drawn in an image at a pixel box; `visible` is the share of its silhouette not hidden behind
    objects drawn in front of it (1 when nothing overlaps it, and in every version-1 world)."""

    entity_id: str
    box: Box
    visible: float = 1.0


@dataclasses.dataclass(frozen=True)
class WorldImage:
    """A PNG in the world: where it is served, what surrounds it, and which entities it shows where."""

    id: str
    url: str
    file: str  # relative to the world directory
    width: int
    height: int
    title: str
    alt: str
    page_url: str
    date: str
    objects: tuple[Placement, ...]
    sha256: str | None = None  # of the image file as built (None in worlds built before it was recorded)
    error: str | None = None  # why downloading it fails ("HTTP 403 Forbidden"); None when it downloads
    kind: str = ""  # version 2: "photo", "rehost" (a re-encoded copy of another image), "leak" or "mockup"


@dataclasses.dataclass(frozen=True)
class WorldPage:
    """A dated page: markdown-ish text with links and image references."""

    url: str
    title: str
    date: str
    text: str
    links: tuple[str, ...]
    image_urls: tuple[str, ...]
    error: str | None = None  # why fetching it fails ("HTTP 404 Not Found": a dead link); None when it loads
    kind: str = ""  # version 2: announce, coverage, review, comparison, sale, catalogue, rumour, concept, seo, rehost


@dataclasses.dataclass(frozen=True)
class World:
    """Everything in a world directory, indexed by id and URL (read-only mappings)."""

    root: Path
    seed: int
    today: dt.date
    entities: Mapping[str, Entity]
    pages: Mapping[str, WorldPage]
    images: Mapping[str, WorldImage]
    version: int = 1  # generator version (world.json's `world_version`; absent = 1)
    ranking_noise: float = 0.0  # σ of the seeded log-normal noise on search scores (0: exact BM25 order)
    split: str | None = None  # "train" or "heldout" for worlds built as one side of a split (`sim.split`)

    def image_path(self, url: str) -> Path:
        """The PNG file behind an image URL.

        Raises:
            KeyError: naming the URL when the world has no such image.
        """
        image = self.images.get(url)
        if image is None:
            raise KeyError(f"no image with url {url!r} in the world at {self.root}")
        return self.root / image.file


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        lines = path.read_text("utf-8").splitlines()
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"world file {path} is missing; build a world with `python -m ranger_jax.env.sim.build --out DIR`"
        ) from err
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{path}:{number} is not valid JSON: {err}") from err
        yield number, row


def _field(row: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in row:
        raise ValueError(f"{where} has no {key!r} field (fields: {sorted(row)})")
    return row[key]


def read_meta(root: str | Path) -> dict[str, Any]:
    """The world's `world.json` (seed, today, counts), checked for the format version.

    Raises:
        FileNotFoundError: when the directory holds no world.
        ValueError: naming the file when its format version is not one of FORMAT_VERSIONS, or its
            `world_version` is not one of WORLD_VERSIONS.
    """
    path = Path(root) / WORLD_FILE
    try:
        meta = json.loads(path.read_text("utf-8"))
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"{path} not found: {root} is not an offline world; build one with "
            f"`python -m ranger_jax.env.sim.build --out {root}`"
        ) from err
    if meta.get("version") not in FORMAT_VERSIONS:
        raise ValueError(f"{path} has format version {meta.get('version')!r}, expected one of {list(FORMAT_VERSIONS)}; "
                         "rebuild it")
    if meta.get("world_version", 1) not in WORLD_VERSIONS:
        raise ValueError(f"{path} has world_version {meta.get('world_version')!r}, expected one of "
                         f"{list(WORLD_VERSIONS)}; rebuild it")
    return meta


def differences(root: str | Path, *, seed: int, num_tasks: int, world_version: int | None) -> list[str]:
    """What differs between the world in `root` and the one wanted, each as "key found (wanted value)"; empty when
    it is that world. `world_version` None accepts any generation.

    Raises:
        FileNotFoundError, ValueError: as `read_meta`.
    """
    meta = read_meta(root)
    found = {"seed": meta.get("seed"), "num_tasks": meta.get("num_tasks"),
             "world_version": meta.get("world_version", 1)}
    wanted = {"seed": seed, "num_tasks": num_tasks, "world_version": world_version}
    return [f"{key} {found[key]} (wanted {wanted[key]})" for key in wanted
            if wanted[key] is not None and found[key] != wanted[key]]


def load_world(root: str | Path) -> World:
    """Reads a world directory into a `World`.

    Raises:
        FileNotFoundError: naming the missing file.
        ValueError: naming the file and line of a malformed row, or an image that places an unknown entity.
    """
    root = Path(root)
    meta = read_meta(root)
    entities = {}
    for number, row in _read_jsonl(root / ENTITIES_FILE):
        where = f"{root / ENTITIES_FILE}:{number}"
        attributes = Attributes(**{f.name: _field(row, f.name, where) for f in dataclasses.fields(Attributes)
                                   if f.name != "trim"}, trim=row.get("trim"))
        entity = Entity(**{f.name: _field(row, f.name, where) for f in dataclasses.fields(Entity)
                           if f.name != "attributes" and f.name not in _ENTITY_DEFAULTS},
                        **{k: row[k] for k in _ENTITY_DEFAULTS if k in row}, attributes=attributes)
        entities[entity.id] = entity
    pages = {}
    for number, row in _read_jsonl(root / PAGES_FILE):
        where = f"{root / PAGES_FILE}:{number}"
        page = WorldPage(
            url=_field(row, "url", where), title=_field(row, "title", where), date=_field(row, "date", where),
            text=_field(row, "text", where), links=tuple(_field(row, "links", where)),
            image_urls=tuple(_field(row, "image_urls", where)), error=row.get("error"), kind=row.get("kind", ""),
        )
        pages[page.url] = page
    images = {}
    for number, row in _read_jsonl(root / IMAGES_FILE):
        where = f"{root / IMAGES_FILE}:{number}"
        objects = []
        for obj in _field(row, "objects", where):
            entity_id = _field(obj, "entity_id", where)
            if entity_id not in entities:
                raise ValueError(f"{where} places unknown entity {entity_id!r} in image {row.get('url')!r}")
            objects.append(Placement(entity_id=entity_id, box=tuple(float(v) for v in _field(obj, "box", where)),
                                     visible=float(obj.get("visible", 1.0))))
        image = WorldImage(
            id=_field(row, "id", where), url=_field(row, "url", where), file=_field(row, "file", where),
            width=int(_field(row, "width", where)), height=int(_field(row, "height", where)),
            title=_field(row, "title", where), alt=_field(row, "alt", where),
            page_url=_field(row, "page_url", where), date=_field(row, "date", where), objects=tuple(objects),
            sha256=row.get("sha256"), error=row.get("error"), kind=row.get("kind", ""),
        )
        images[image.url] = image
    return World(
        root=root, seed=int(meta["seed"]), today=dt.date.fromisoformat(meta["today"]),
        entities=MappingProxyType(entities), pages=MappingProxyType(pages), images=MappingProxyType(images),
        version=int(meta.get("world_version", 1)), ranking_noise=float(meta.get("ranking_noise", 0.0)),
        split=meta.get("split"),
    )


def load_tasks(root: str | Path) -> list[core.Task]:
    """The world's tasks as `env.Task`s.

    `ground_truth` is a dict with `target_id`, `target_name`, `image_url` and `image_file` (the ground-truth
    image, file relative to the world), `bbox` (the target's pixel box in it), `key_attributes`,
    `sibling_ids`, `sibling_only_attributes` and `target_ids` (every target: one, or two for a request with two
    subjects; `target_id` is the first); `metadata` has `domain`, `subcategory`, `today` (YYYY-MM-DD) and
    `request_kind` ("direct", or in version-2 worlds also "indirect" and "two_subjects").

    Raises:
        FileNotFoundError: naming the missing file.
        ValueError: naming the file and line of a malformed row.
    """
    root = Path(root)
    meta = read_meta(root)
    tasks = []
    for number, row in _read_jsonl(root / TASKS_FILE):
        where = f"{root / TASKS_FILE}:{number}"
        truth = {key: _field(row, key, where) for key in (
            "target_id", "target_name", "image_url", "image_file", "bbox", "key_attributes", "sibling_ids",
            "sibling_only_attributes")}
        truth["target_ids"] = list(row.get("target_ids", [truth["target_id"]]))
        metadata = {"domain": _field(row, "domain", where), "subcategory": _field(row, "subcategory", where),
                    "today": _field(row, "today", where), "world": str(root), "seed": meta["seed"],
                    "request_kind": row.get("request_kind", "direct")}
        tasks.append(core.Task(_field(row, "id", where), _field(row, "prompt", where),
                               ground_truth=truth, metadata=metadata))
    return tasks
