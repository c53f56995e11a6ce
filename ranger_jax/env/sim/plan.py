"""The first stages of building a world: what it holds, before any picture is drawn or index built.

`plan_world` draws the world's `today`, one family of confusable entities per task (roles and release dates as
described in `ranger_jax.env.sim.build`), and for each family the pages and image specs (which entities an image
shows, clean product shot or crowded scene, on which page). `write_page_texts` then gives every page its title,
body and URL, and `task_prompt` words a task's request. All of them draw from one `random.Random` in a fixed
order, so the same seed gives the same plan.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import random

import numpy as np

from ranger_jax.env.sim import catalog, pages
from ranger_jax.env.sim.world import Attributes, Entity

FIRST_TODAY = dt.date(2025, 1, 1)  # the world's `today` is drawn from two years starting here
SUBCATEGORY = {sc.name: sc for sc in catalog.SUBCATEGORIES}  # subcategory name -> catalog entry
_ROLE_CODES = {"target": "t", "variant": "v", "previous": "p", "previous_variant": "q", "older": "o"}


@dataclasses.dataclass
class Page:
    """A page to be written: its kind, the entities it is about, its date and family; text and URL come later."""

    kind: str  # announce, coverage, review, comparison, sale or catalogue
    entities: list[Entity]
    date: str
    family: int  # task index of the family
    setting: str
    title: str = ""
    body: str = ""
    url: str = ""
    images: list[str] = dataclasses.field(default_factory=list)  # image ids


@dataclasses.dataclass
class ImageSpec:
    """An image to be drawn: the entity it is about, all entities in it, and the page that shows it."""

    id: str
    main: Entity
    items: list[Entity]  # in drawing order; a clean shot holds `main` alone
    clean: bool  # a product shot on a plain ground; otherwise a scene of 2-4 objects
    named: bool  # the caption names the entity
    setting: str
    page: Page
    url: str = ""


@dataclasses.dataclass
class WorldPlan:
    """Everything a world holds before rendering: `families[i]` (role -> entity) is task i's family."""

    today: dt.date
    families: list[dict[str, Entity]]
    pages: list[Page]
    images: list[ImageSpec]

    @property
    def entities(self) -> list[Entity]:
        """All entities, family by family, in role order."""
        return [e for family in self.families for e in family.values()]


def _colour_pair(rng: random.Random, avoid_primary: str | None = None) -> tuple[str, str]:
    names = [c for c in catalog.COLOURS if c != avoid_primary]
    primary = rng.choice(names)
    secondary = rng.choice([c for c in catalog.COLOURS if c != primary])
    return primary, secondary


def _family(index: int, sc: catalog.Subcategory, today: dt.date, rng: random.Random,
            used: set[str], accept=None) -> dict[str, Entity]:
    """Entities of one family by role: target, variant, previous, and optionally previous_variant, older."""
    suffix = rng.choice(sc.suffixes)
    family = catalog.make_word(rng, used, accept) + (f" {suffix}" if suffix else "")
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
            attributes=Attributes(primary=colours[0], secondary=colours[1], pattern=patterns[age],
                                  emblem=catalog.emblem_code(family, n)),
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


class EntityTable:
    """A world's entities as arrays, for drawing a scene's distractors: the entities of other families already
    released on a date, in the list's order, found without a scan of Python objects per draw (a 960-task world has
    ~4,300 entities and ~5,800 scenes, and the scan compared whole dataclasses: a third of the world's build)."""

    def __init__(self, entities: list[Entity]):
        self.entities = entities
        self.released = np.array([e.released for e in entities], dtype=str)  # ISO dates: string order is date order
        codes: dict[str, int] = {}
        self.family = np.array([codes.setdefault(e.family, len(codes)) for e in entities], dtype=np.int64)
        self._codes = codes
        self._positions: dict[str, list[int]] = collections.defaultdict(list)
        for position, entity in enumerate(entities):
            self._positions[entity.id].append(position)

    def released_elsewhere(self, family: str, date: str) -> np.ndarray:
        """Ascending positions of the entities not of `family` whose release date is on or before `date`."""
        return np.flatnonzero((self.family != self._codes.get(family, -1)) & (self.released <= date))

    def without(self, positions: np.ndarray, items: list[Entity]) -> np.ndarray:
        """`positions` less those of entities equal to one of `items` (as `e not in items` would leave out)."""
        drop = [position for item in items for position in self._positions.get(item.id, ())
                if self.entities[position] == item]
        return positions[~np.isin(positions, drop)] if drop else positions


def _plan_family(index: int, roles: dict[str, Entity], sc: catalog.Subcategory, today: dt.date,
                 rng: random.Random, others: EntityTable, out_pages: list[Page],
                 out_images: list[ImageSpec]) -> None:
    """Pages and image specs (not yet rendered) of one family; appended to `out_pages` / `out_images`. A scene's
    distractors are drawn from `others`: entities of other families already released on its page's date."""
    family = [e for e in roles.values()]

    def page(kind: str, entities: list[Entity], date: str) -> Page:
        p = Page(kind=kind, entities=entities, date=date, family=index, setting=rng.choice(sc.settings))
        out_pages.append(p)
        return p

    def image(main: Entity, p: Page, clean: bool, extra: list[Entity] | None = None) -> None:
        items = [main]
        if not clean:  # a scene shows only things already released on its page's date, each once
            pool = [e for e in family if e.id != main.id and e.released <= p.date]
            if extra is not None:
                items += extra
            elif pool and rng.random() < 0.75:
                items.append(rng.choice(pool))
            distractors = others.released_elsewhere(main.family, p.date)
            for _ in range(rng.randint(0 if len(items) > 1 else 1, 2)):
                fresh = others.without(distractors, items)
                if len(fresh):  # the draw of rng.choice over the list of those entities: it reads only the length
                    items.append(others.entities[int(rng.choice(fresh))])
            rng.shuffle(items)
        named = rng.random() < 0.5
        out_images.append(ImageSpec(id=f"im{len(out_images):05d}", main=main, items=items, clean=clean,
                                    named=named, setting=p.setting, page=p))
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


def plan_world(num_tasks: int, rng: random.Random, accept=None) -> WorldPlan:
    """Stage 1: the world's `today`, one family per task (subcategories dealt round-robin from a shuffled
    order), and every family's pages and image specs. Texts, URLs and pixels are left for later stages.

    Args:
        accept: only family names it accepts are drawn (one side of a train/held-out split; None: any).
    """
    today = FIRST_TODAY + dt.timedelta(days=rng.randrange(730))
    order = list(catalog.SUBCATEGORIES)
    rng.shuffle(order)
    used: set[str] = set()
    families = [_family(i, order[i % len(order)], today, rng, used, accept) for i in range(num_tasks)]
    plan = WorldPlan(today=today, families=families, pages=[], images=[])
    everyone = EntityTable(plan.entities)
    for i, roles in enumerate(families):
        _plan_family(i, roles, order[i % len(order)], today, rng, everyone, plan.pages, plan.images)
    return plan


def _write_page_text(p: Page, sc: catalog.Subcategory, today: dt.date, rng: random.Random) -> None:
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


def write_page_texts(plan: WorldPlan, rng: random.Random) -> None:
    """Stage 2: every page's title, body and URL (site and section by kind), in page order, in place."""
    for p in plan.pages:
        _write_page_text(p, SUBCATEGORY[p.entities[0].subcategory], plan.today, rng)


def task_prompt(target: Entity, today: dt.date, rng: random.Random) -> str:
    """The user's request for a task: a generation prompt that names the target loosely (family, variant, how
    recent) and ends in one of its subcategory's contexts."""
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
    return f"{opener} {subject} {rng.choice(SUBCATEGORY[target.subcategory].contexts)}."
