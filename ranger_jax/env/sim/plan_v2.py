"""Stage 1 of a version-2 world: its families, tasks, pages and image specs, before any text or pixel.

A version-2 family holds the version-1 roles (target, variant, previous, previous_variant, older; see
`ranger_jax.env.sim.build`) and, each seeded and optional:
  - `detail`: a special edition that differs from the target only in its trim colour ("Limited Edition"); in
    some families the target is the special edition and the standard release is the look-alike;
  - `leak`: a pre-release picture that circulated under the target's name with one visible attribute wrong;
  - `mockup`: a fan-made render of the target with one visible attribute wrong, posted any time around the
    release.
Every sibling differs from the target in something a picture shows (colours, pattern or trim).

Pages of a family: the target's launch article and one or two follow-ups, over which its identity facts are
spread (no page states them all); articles on the other releases; a reference page on older editions; rumour and
fan-concept pages (hedged); keyword-stuffed pages that name the family but no release; and copies of articles
and pictures on re-hosting sites, dated later, whose captions often claim the newest release. Pages may be dead
links and pictures may fail to download, except what a task needs: the target's launch article stays up, and
one picture of the target, where it stands in front, always downloads.

A task asks for one family's target, directly or through its maker, or for the targets of two families.
Everything is drawn from one `random.Random` in a fixed order.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import random

from ranger_jax.env.sim import catalog, plan, requests, split
from ranger_jax.env.sim.world import Attributes, Entity

REQUEST_KINDS = {"direct": 0.5, "indirect": 0.3, "two_subjects": 0.2}  # share of tasks
DEAD_PAGE_RATE = 0.12
BROKEN_IMAGE_RATE = 0.1
RANKING_NOISE = 0.3  # σ of the log-normal factor on search scores (backend, per query and document)
_CODES = {"target": "t", "variant": "v", "previous": "p", "previous_variant": "q", "older": "o", "detail": "d",
          "leak": "l", "mockup": "m"}


@dataclasses.dataclass
class Page:
    """A page to be written: what it is about and which facts of each entity it states."""

    kind: str  # announce, coverage, review, comparison, sale, catalogue, rumour, concept, seo, rehost
    entities: list[Entity]  # one paragraph each, in order
    date: str
    family: int
    site: str
    setting: str
    facts: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # entity id -> fact kinds it states
    source: "Page | None" = None  # for a re-host: the article it copies
    error: str | None = None  # dead link: what fetching it answers
    title: str = ""
    body: str = ""
    url: str = ""
    images: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ImageSpec:
    """A picture to be drawn (or, for a re-host, copied from `source`) and shown on `page`."""

    id: str
    main: Entity
    items: list[Entity]
    clean: bool
    named: bool
    setting: str
    page: Page
    kind: str = "photo"  # photo, leak, mockup or rehost
    front: bool = False  # the main entity stands in front of everything else
    source: "ImageSpec | None" = None
    error: str | None = None
    caption_claims: Entity | None = None  # whose name a re-host's caption claims
    url: str = ""


@dataclasses.dataclass
class Task:
    """A task: its families' targets and how the request names them."""

    families: list[int]
    kind: str  # direct, indirect or two_subjects


@dataclasses.dataclass
class WorldPlan:
    """A version-2 world before text and pixels."""

    today: dt.date
    families: list[dict[str, Entity]]
    tasks: list[Task]
    pages: list[Page]
    images: list[ImageSpec]

    @property
    def entities(self) -> list[Entity]:
        """All entities, family by family, in role order."""
        return [e for family in self.families for e in family.values()]


def _words_filter(split_side: str | None):
    """Words a version-2 world may make up: not the world's own vocabulary, and on the split's side."""
    on_side = split.accepts(split_side)
    return lambda w: w not in requests.VOCABULARY and (on_side is None or on_side(w))


def _other_colour(rng: random.Random, avoid: set[str]) -> str:
    return rng.choice([c for c in catalog.COLOURS if c not in avoid])


def _family(index: int, sc: catalog.Subcategory, today: dt.date, rng: random.Random, used: set[str],
            accept) -> dict[str, Entity]:
    """Entities of one family by role (see the module docstring)."""
    family = catalog.make_word(rng, used, accept)
    suffix = rng.choice(sc.suffixes)
    family += f" {suffix}" if suffix else ""
    maker = catalog.make_word(rng, used, accept)
    released = today - dt.timedelta(days=rng.randint(2, 20))
    number = released.year if "{year}" in sc.edition else rng.randint(3, 9)
    v_target, v_other = rng.sample(sc.variants, 2)
    primary = rng.choice(list(catalog.COLOURS))
    secondary = _other_colour(rng, {primary})
    other_primary = _other_colour(rng, {primary})
    colours_other = (other_primary, _other_colour(rng, {other_primary}))
    patterns = rng.sample(catalog.PATTERNS, 3)
    kept = (primary, secondary) if rng.random() < 0.6 else (primary, _other_colour(rng, {primary, secondary}))
    previous_release = released - dt.timedelta(days=rng.randint(330, 400))
    older_release = previous_release - dt.timedelta(days=rng.randint(330, 400))

    def entity(role: str, age: int, variant: str, colours: tuple[str, str], day: dt.date, *, pattern=None,
               trim=None, tag: str = "", status: str = "release") -> Entity:
        n = number - age
        edition = sc.edition.format(n=n, year=n)
        trim = trim or _other_colour(rng, set(colours))
        label = f"{variant} {tag}" if tag else variant
        return Entity(
            id=f"e{index:04d}{_CODES[role]}", family=family, name=f"{family} {edition} {label}", noun=sc.noun,
            subcategory=sc.name, domain=sc.domain, edition=edition, variant=variant, released=day.isoformat(),
            attributes=Attributes(primary=colours[0], secondary=colours[1], pattern=pattern or patterns[age],
                                  emblem=catalog.emblem_code(family, n), trim=trim),
            maker=maker, tag=tag, status=status)

    target_tag = ""
    has_detail = rng.random() < 0.45
    if has_detail and rng.random() < 0.4:
        target_tag = rng.choice(catalog.TAGS)
    out = {"target": entity("target", 0, v_target, (primary, secondary), released, tag=target_tag)}
    look = out["target"].attributes
    variant_release = released if rng.random() < 0.4 else released - dt.timedelta(days=rng.randint(1, 12))
    out["variant"] = entity("variant", 0, v_other, colours_other, variant_release)
    out["previous"] = entity("previous", 1, v_target, kept, previous_release)
    if rng.random() < 0.6:
        out["previous_variant"] = entity("previous_variant", 1, v_other, colours_other,
                                         previous_release - dt.timedelta(days=rng.randint(0, 20)))
    if rng.random() < 0.5:
        out["older"] = entity("older", 2, v_target, kept, older_release)
    if has_detail:
        tag = "" if target_tag else rng.choice(catalog.TAGS)
        day = released - dt.timedelta(days=rng.randint(0, 8)) if target_tag else \
            min(today - dt.timedelta(days=1), released + dt.timedelta(days=rng.randint(0, 6)))
        out["detail"] = entity("detail", 0, v_target, (primary, secondary), day, pattern=look.pattern,
                               trim=_other_colour(rng, {primary, secondary, look.trim}), tag=tag)
    for role, chance, day in (("leak", 0.5, released - dt.timedelta(days=rng.randint(8, 60))),
                              ("mockup", 0.5, released + dt.timedelta(days=rng.randint(-25, 1)))):
        if rng.random() < chance:
            wrong = rng.choice(("pattern", "secondary", "trim"))
            changes = {"pattern": look.pattern, "trim": look.trim}
            colours = (primary, secondary)
            if wrong == "pattern":
                changes["pattern"] = rng.choice([p for p in catalog.PATTERNS if p != look.pattern])
            elif wrong == "secondary":
                colours = (primary, _other_colour(rng, {primary, secondary, look.trim}))
            else:
                changes["trim"] = _other_colour(rng, {primary, secondary, look.trim})
            out[role] = entity(role, 0, v_target, colours, day, tag=target_tag, status=role, **changes)
    return out


def _after(day: str, today: dt.date, rng: random.Random, within: int) -> str:
    return plan._after(day, today, rng, within)


def _spread(kinds: list[str], pages: list[Page], entity: Entity, rng: random.Random, first: list[str]) -> None:
    """Gives each of `pages` a few of `kinds` about `entity` (the first page `first` and two more, the others
    three), so that together they state every kind and no page states all of them."""
    for i, p in enumerate(pages):
        rest = [k for k in kinds if k not in first] if i == 0 else list(kinds)
        size = 2 if i == 0 else 3
        chosen = (list(first) if i == 0 else []) + rng.sample(rest, size)
        p.facts[entity.id] = [k for k in kinds if k in chosen]
    missing = [k for k in kinds if not any(k in p.facts[entity.id] for p in pages)]
    for kind in missing:
        p = rng.choice(pages[1:] or pages)
        p.facts[entity.id] = [k for k in kinds if k in p.facts[entity.id] or k == kind]


FACT_KINDS = ["released", "colours", "pattern", "emblem", "trim"]


def _settle(pages: list[Page], entity: Entity) -> None:
    """Makes the live pages among `pages` (the first, the launch article, is always live) state every fact kind
    about `entity` between them, and no live page state all of them when another live page shares the load."""
    live = [p for p in pages if p.error is None]
    for kind in FACT_KINDS:  # a fact stated only on dead pages moves onto a live page: a follow-up, else the launch
        if not any(kind in p.facts[entity.id] for p in live):
            p = live[-1]
            p.facts[entity.id] = [k for k in FACT_KINDS if k in p.facts[entity.id] or k == kind]
    for p in live:
        if len(p.facts[entity.id]) == len(FACT_KINDS) and len(live) > 1:
            others = {k for q in live if q is not p for k in q.facts[entity.id]}
            shared = [k for k in FACT_KINDS[::-1] if k in others and not (p is live[0] and k == "released")]
            if shared:
                p.facts[entity.id] = [k for k in p.facts[entity.id] if k != shared[0]]


def _plan_family(index: int, roles: dict[str, Entity], sc: catalog.Subcategory, today: dt.date,
                 rng: random.Random, others: list[Entity], out_pages: list[Page], out_images: list[ImageSpec]) -> None:
    """Pages and picture specs of one family (see the module docstring), appended to the two lists."""
    family = [e for e in roles.values() if e.status == "release"]
    start = len(out_images)
    others_released = [e.released for e in others]

    def page(kind: str, entities: list[Entity], date: str, site: str | None = None, live: bool = False) -> Page:
        site = site or rng.choice(catalog.SITES[sc.domain])
        p = Page(kind=kind, entities=entities, date=date, family=index, site=site, setting=rng.choice(sc.settings))
        if not live and rng.random() < DEAD_PAGE_RATE:
            p.error = rng.choice(catalog.PAGE_ERRORS)
        out_pages.append(p)
        return p

    def image(main: Entity, p: Page, clean: bool, extra: list[Entity] | None = None, kind: str = "photo",
              front: bool = False) -> ImageSpec:
        items = [main]
        if not clean:
            pool = [e for e in family if e.id != main.id and e.released <= p.date] if kind == "photo" else []
            if extra is not None:
                items += extra
            elif pool and rng.random() < 0.75:
                items.append(rng.choice(pool))
            released = bisect.bisect_right(others_released, p.date)  # `others` is sorted by release date
            for _ in range(rng.randint(0 if len(items) > 1 else 1, 3)):
                for _ in range(8):  # a few draws among things released by then, from other families
                    pick = others[rng.randrange(released)] if released else None
                    if pick is not None and pick.family != main.family and pick not in items:
                        items.append(pick)
                        break
            rng.shuffle(items)
        spec = ImageSpec(id=f"im{len(out_images):05d}", main=main, items=items, clean=clean,
                         named=rng.random() < 0.5, setting=p.setting, page=p, kind=kind, front=front or clean)
        if not front and rng.random() < BROKEN_IMAGE_RATE:
            spec.error = rng.choice(catalog.IMAGE_ERRORS)
        out_images.append(spec)
        p.images.append(spec.id)
        return spec

    target, variant, previous = roles["target"], roles["variant"], roles["previous"]
    joint = variant.released == target.released
    launch = page("announce", [target, variant] if joint else [target], target.released, live=True)
    follow = [page("coverage", [target], _after(target.released, today, rng, 15)) for _ in range(rng.randint(1, 2))]
    _spread(FACT_KINDS, [launch, *follow], target, rng, first=["released"])
    _settle([launch, *follow], target)
    if joint:
        launch.facts[variant.id] = ["released", *rng.sample(FACT_KINDS[1:], 2)]
    if rng.random() < 0.3:
        image(target, launch, clean=True)
    image(target, follow[0], clean=False, front=True)
    for p in follow[1:]:
        image(target, p, clean=False, front=rng.random() < 0.5)
    if rng.random() < 0.4:
        p = page("comparison", [target, previous], _after(target.released, today, rng, 15))
        p.facts = {target.id: rng.sample(FACT_KINDS[1:], 2), previous.id: ["released", *rng.sample(FACT_KINDS[1:], 2)]}
        image(target, p, clean=False, extra=[previous])
    if not joint:
        own = page("announce", [variant], variant.released)
        own.facts[variant.id] = ["released", *rng.sample(FACT_KINDS[1:], 3)]
        image(variant, own, clean=True)
    if rng.random() < 0.5:
        p = page("coverage", [variant], _after(variant.released, today, rng, 15))
        p.facts[variant.id] = rng.sample(FACT_KINDS[1:], 2)
        image(variant, p, clean=False)
    if "detail" in roles:
        detail = roles["detail"]
        p = page("announce", [detail], detail.released)
        p.facts[detail.id] = ["released", *rng.sample(FACT_KINDS[1:], 3)]
        image(detail, p, clean=True)
        if rng.random() < 0.5:
            image(detail, page("coverage", [detail], _after(detail.released, today, rng, 10)), clean=False)
    for role in ("previous", "previous_variant", "older"):
        if role not in roles:
            continue
        entity = roles[role]
        weight = 2 if role == "previous" else 1
        p = page("announce", [entity], entity.released)
        p.facts[entity.id] = list(FACT_KINDS)
        for _ in range(weight + rng.randint(0, 1)):
            image(entity, p, clean=True)
        for _ in range(weight + rng.randint(0, 1)):
            p = page("review", [entity], _after(entity.released, today, rng, 150))
            p.facts[entity.id] = rng.sample(FACT_KINDS[1:], 3)
            image(entity, p, clean=rng.random() < 0.5)
    if rng.random() < 0.6:
        p = page("sale", [previous], (today - dt.timedelta(days=rng.randint(0, 30))).isoformat(),
                 site=catalog.SHOP_SITE)
        p.facts[previous.id] = rng.sample(FACT_KINDS, 3)
        image(previous, p, clean=True)
    older = sorted((e for r, e in roles.items() if r in ("previous", "previous_variant", "older")),
                   key=lambda e: e.released)
    last = dt.date.fromisoformat(older[-1].released) + dt.timedelta(days=rng.randint(20, 200))
    cap = dt.date.fromisoformat(target.released) - dt.timedelta(days=1)
    wiki = page("catalogue", older, min(last, cap).isoformat(), site=catalog.WIKI_SITE)
    wiki.facts = {e.id: list(FACT_KINDS) for e in older}
    for role in ("leak", "mockup"):
        if role in roles:
            fake = roles[role]
            kind = "rumour" if role == "leak" else "concept"
            day = fake.released if role == "leak" else _after(fake.released, today, rng, 30)
            p = page(kind, [fake], day, site=rng.choice(catalog.FAN_SITES))
            p.facts[fake.id] = rng.sample(FACT_KINDS[1:], 3)
            image(fake, p, clean=role == "mockup", kind=role)
            if rng.random() < 0.5:
                image(fake, p, clean=role == "mockup", kind=role)
    _plan_copies(index, roles, sc, today, rng, out_images[start:], page, out_images)


def _plan_copies(index: int, roles: dict[str, Entity], sc: catalog.Subcategory, today: dt.date, rng: random.Random,
                 originals: list[ImageSpec], page, out_images: list[ImageSpec]) -> None:
    """Keyword-stuffed pages, a re-hosted article, and re-hosted pictures whose captions claim the target."""
    target = roles["target"]
    articles = [p for p in {id(i.page): i.page for i in originals}.values()
                if p.kind in ("announce", "coverage", "review") and p.entities[0] in (target, roles["previous"])]
    if articles and rng.random() < 0.6:
        source = rng.choice(articles)
        copy = page("rehost", list(source.entities), _after(source.date, today, rng, 20),
                    site=rng.choice(catalog.REHOST_SITES))
        copy.source, copy.facts = source, dict(source.facts)
    hosts = [page("seo", [target], (today - dt.timedelta(days=rng.randint(0, 25))).isoformat(),
                  site=rng.choice(catalog.SEO_SITES)) for _ in range(rng.randint(1, 2))]
    hosts.append(page("rehost", [target], (today - dt.timedelta(days=rng.randint(0, 12))).isoformat(),
                      site=rng.choice(catalog.REHOST_SITES)))
    sources = [i for i in originals if i.error is None and i.kind in ("photo", "leak", "mockup")]
    preferred = [i for i in sources if i.main.id != target.id] or sources
    for _ in range(rng.randint(2, 4)):
        source = rng.choice(preferred if rng.random() < 0.8 else sources)
        host = rng.choice(hosts)
        day = max(host.date, source.page.date)
        spec = ImageSpec(id=f"im{len(out_images):05d}", main=source.main, items=list(source.items),
                         clean=source.clean, named=True, setting=source.setting, page=host, kind="rehost",
                         source=source, caption_claims=target if rng.random() < 0.75 else source.main)
        if day > host.date:  # a copy is never older than its original; it moves to a page of its own date
            host = page("rehost", [target], day, site=rng.choice(catalog.REHOST_SITES))
            spec.page = host
        if rng.random() < BROKEN_IMAGE_RATE:
            spec.error = rng.choice(catalog.IMAGE_ERRORS)
        out_images.append(spec)
        host.images.append(spec.id)


def _kinds(num_tasks: int, rng: random.Random) -> list[str]:
    names, weights = zip(*REQUEST_KINDS.items())
    return [rng.choices(names, weights)[0] for _ in range(num_tasks)]


def plan_world(num_tasks: int, rng: random.Random, *, split_side: str | None = None) -> WorldPlan:
    """Stage 1 of a version-2 world: `today`, the tasks and their families (subcategories dealt round-robin, so
    the two subjects of a task are different kinds of things), and every family's pages and picture specs."""
    today = plan.FIRST_TODAY + dt.timedelta(days=rng.randrange(730))
    order = list(catalog.SUBCATEGORIES)
    rng.shuffle(order)
    tasks, count = [], 0
    for kind in _kinds(num_tasks, rng):
        size = 2 if kind == "two_subjects" else 1
        tasks.append(Task(families=list(range(count, count + size)), kind=kind))
        count += size
    used: set[str] = set()
    accept = _words_filter(split_side)
    families = [_family(i, order[i % len(order)], today, rng, used, accept) for i in range(count)]
    world_plan = WorldPlan(today=today, families=families, tasks=tasks, pages=[], images=[])
    everyone = sorted((e for e in world_plan.entities if e.status == "release"), key=lambda e: (e.released, e.id))
    for i, roles in enumerate(families):
        _plan_family(i, roles, order[i % len(order)], today, rng, everyone, world_plan.pages, world_plan.images)
    return world_plan
