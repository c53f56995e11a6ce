"""Stage 2 of a version-2 world: page titles, bodies, layouts and URLs, and picture captions.

Each site of a world gets one of `LAYOUTS` (a news page, a blog post, a press release, a digest entry), and the
world words its facts in its own `prose.Style`, so a world has several page templates and several phrasings of
every fact. Bodies keep one release per paragraph (how `prose.read_facts` attributes facts); official pages
state only the facts the plan gave them; rumour and fan-concept pages open with a hedge; keyword-stuffed pages
name the family and its variants but no release; a re-hosted article repeats its source under a note naming the
original site. Captions of leaks, fan renders and re-hosted pictures claim a release's name whatever they show.
"""

from __future__ import annotations

import random

from ranger_jax.env.sim import catalog, pages, plan_v2, prose
from ranger_jax.env.sim.world import Entity

LAYOUTS = ("news", "blog", "press", "digest")
_SECTIONS = {"announce": "news", "coverage": "news", "review": "reviews", "comparison": "features", "sale": "deals",
             "catalogue": "wiki", "rumour": "rumours", "concept": "concepts", "seo": "guides", "rehost": "posts"}
_AUTHORS = ("Ana Ruiz", "Ben Okafor", "Chen Wei", "Dara Kelly", "Eli Novak", "Fay Moreau")
_FILLER = (
    "Stock is expected to move quickly in the first weeks.",
    "Retail partners expect it to be one of the season's most searched items.",
    "The design team said the look grew out of feedback from fans.",
    "Early listings suggest quantities will be limited at launch.",
    "Pre-orders opened at selected stores.",
)


def full_name(entity: Entity) -> str:
    """Name with its noun: "Zorvan FC 2026 Home kit"."""
    return pages.full_name(entity)


def _maker(style: prose.Style, entity: Entity, rng: random.Random) -> str:
    return style.say("maker", rng, "", family=entity.family, maker=entity.maker,
                     owner=catalog.OWNERS[entity.subcategory])


def _paragraph(style: prose.Style, entity: Entity, kinds: list[str], opening: str, rng: random.Random) -> str:
    """`opening` (a sentence naming `entity`) and statements of `kinds` about it."""
    said = prose.statements(style, entity, kinds, rng, it="It") if kinds else []
    return " ".join([opening, *said])


def _official(p: plan_v2.Page, style: prose.Style, today, rng: random.Random) -> tuple[str, list[str]]:
    """(title, paragraphs) of an announcement, news piece, review, comparison, sale or reference page."""
    first = p.entities[0]
    name = full_name(first)
    if p.kind == "announce":
        title = rng.choice(("{family} unveils the {name}", "First look: the {name}", "Revealed: {name} arrives",
                            "Official: this is the {name}", "Meet the {name}")).format(family=first.family, name=name)
        opening = rng.choice((f"{first.family} has officially revealed the {name}.",
                              f"The {name} is here, {first.family} confirmed.",
                              f"{first.family} today presented the {name}."))
    elif p.kind == "comparison":
        old = p.entities[1]
        title = rng.choice(("{new} vs {old}: what changed", "Side by side: {new} and {old}")).format(
            new=name, old=full_name(old))
        opening = f"The {name} is the newest of the line."
    elif p.kind == "sale":
        title = rng.choice(("Deal: the {name} drops in price", "Last chance to buy the {name}")).format(name=name)
        opening = f"Retailers have cut the price of the {name}."
    elif p.kind == "catalogue":
        title = f"{first.family} {first.noun}s: list of releases"
        opening = f"The {name} is listed here with its details."
    else:
        title = rng.choice(("Spotted: the {name} at the {setting}", "{name}: first impressions",
                            "{name} review: worth it?", "Why the {name} is everywhere",
                            "The {name} in pictures")).format(name=name, setting=p.setting)
        opening = rng.choice((f"We went to the {p.setting} to see the {name} up close.",
                              f"The {name} has become a fixture at every {p.setting}.",
                              f"Crowds at the {p.setting} were quick to pick out the {name}."))
    paragraphs = []
    if p.kind == "catalogue":
        paragraphs.append(f"This page lists every {first.family} {first.noun} released so far.")
    for i, entity in enumerate(p.entities):
        intro = opening if i == 0 else rng.choice((f"The {full_name(entity)} is also covered here.",
                                                   f"Then there is the {full_name(entity)}."))
        paragraphs.append(_paragraph(style, entity, p.facts.get(entity.id, []), intro, rng))
    if p.kind in ("announce", "catalogue") or rng.random() < 0.4:
        paragraphs.append(_maker(style, first, rng))
    paragraphs.append(rng.choice(_FILLER))
    return title, paragraphs


def _hedged(p: plan_v2.Page, style: prose.Style, rng: random.Random) -> tuple[str, list[str]]:
    """(title, paragraphs) of a rumour (a leak) or a fan-concept page about a picture of `p.entities[0]`."""
    fake = p.entities[0]
    name = full_name(fake)
    if p.kind == "rumour":
        title = rng.choice(("Leak: is this the {name}?", "Rumour: first look at the {name}",
                            "Leaked pictures reportedly show the {name}")).format(name=name)
        lede = f"A leaked picture reportedly shows the {name} ahead of its launch; nothing is confirmed."
    else:
        title = rng.choice(("Fan concept: the {name} reimagined", "Fan-made mock-up of the {name}")).format(name=name)
        lede = f"A fan-made concept of the {name} is doing the rounds online."
    return title, [lede, _paragraph(style, fake, p.facts.get(fake.id, []), f"In it, the {name} looks like this.",
                                    rng)]


def _seo(p: plan_v2.Page, rng: random.Random) -> tuple[str, list[str]]:
    """(title, paragraphs) of a keyword-stuffed page: the family and its variants, no release named."""
    e = p.entities[0]
    year = p.date[:4]
    sc = plan_v2.plan.SUBCATEGORY[e.subcategory]
    variants = ", ".join(f"{e.family} {v} {e.noun}" for v in sc.variants)
    title = rng.choice(("{family} {noun} {year}: release date, price, leaks and where to buy",
                        "Best {family} {noun} deals {year} (updated)", "New {family} {noun}: everything we know"))
    title = title.format(family=e.family, noun=e.noun, year=year)
    return title, [f"Looking for the new {e.family} {e.noun}? {variants}: release date, price, colours, leaks, "
                   f"reviews and where to buy the new {e.family} {e.noun} in {year}.",
                   f"Click through for the latest {e.family} {e.noun} news, {e.family} {e.noun} prices and "
                   f"{e.family} {e.noun} pictures. Updated daily."]


def _layout(layout: str, title: str, date: str, paragraphs: list[str], images: list[tuple[str, str]],
            links: list[tuple[str, str]], rng: random.Random) -> str:
    """The page text in one of `LAYOUTS`."""
    body = "\n\n".join(paragraphs)
    if layout == "news":
        head = f"# {title}\n\nPublished {prose.long_date(date)}"
        media = [f"![{alt}]({url})" for url, alt in images]
        more = ["Related:\n" + "\n".join(f"- [{t}]({u})" for u, t in links)] if links else []
    elif layout == "blog":
        head = f"{title}\n{'=' * min(len(title), 60)}\n\nPosted {date} by {rng.choice(_AUTHORS)}"
        media = [f"[image: {alt}] {url}" for url, alt in images]
        more = ["See also: " + "; ".join(f"[{t}]({u})" for u, t in links)] if links else []
    elif layout == "press":
        head = f"PRESS RELEASE | {date}\n\n{title.upper()}"
        media = [f"Media: ![{alt}]({url})" for url, alt in images]
        more = ["###"]
    else:
        head = f"## {title}\n\n*{prose.long_date(date)}*"
        media = [f"![{alt}]({url})" for url, alt in images]
        more = ["More: " + " | ".join(f"{t} ({u})" for u, t in links)] if links else []
    return "\n\n".join([head, body, *media, *more])


def write_page_texts(world_plan: plan_v2.WorldPlan, rng: random.Random) -> dict[str, str]:
    """Stage 2: every page's title, body (paragraphs joined) and URL, in page order, in place.

    Returns:
        {site: layout}: the layout each site uses (drawn here, one world's choice).
    """
    style = prose.Style.draw(rng)
    sites = sorted({p.site for p in world_plan.pages})
    layouts = {site: rng.choice(LAYOUTS) for site in sites}
    for p in world_plan.pages:
        if p.kind in ("rumour", "concept"):
            p.title, paragraphs = _hedged(p, style, rng)
        elif p.kind == "seo":
            p.title, paragraphs = _seo(p, rng)
        elif p.kind == "rehost" and p.source is not None:
            source = p.source
            p.title = rng.choice(("{t}", "[Repost] {t}", "{t} | newsmirror")).format(t=source.title)
            paragraphs = [f"Originally published on {source.site}.", source.body]
        elif p.kind == "rehost":
            e = p.entities[0]
            p.title = rng.choice(("Pictures: the new {family} {noun}", "{family} {noun} photo gallery")).format(
                family=e.family, noun=e.noun)
            paragraphs = [f"Our pick of pictures of the {e.family} {e.noun}s, old and new."]
        else:
            p.title, paragraphs = _official(p, style, world_plan.today, rng)
        p.body = "\n\n".join(paragraphs)
        p.url = f"https://{p.site}/{_SECTIONS[p.kind]}/{pages.slugify(p.title)}-{p.family}{rng.randint(100, 999)}"
    return layouts


def page_text(p: plan_v2.Page, layout: str, images: list[tuple[str, str]], links: list[tuple[str, str]],
              rng: random.Random) -> str:
    """The served text of a page: its body in its site's layout, with picture references and links."""
    return _layout(layout, p.title, p.date, p.body.split("\n\n"), images, links, rng)


def image_caption(spec: plan_v2.ImageSpec, rng: random.Random) -> tuple[str, str]:
    """(title, alt) of a picture: as in version 1 for photos, except that a scene where the main subject stands in
    front names it in full; leaks, fan renders and re-hosts claim a name."""
    if spec.kind == "photo" and spec.front and not spec.clean:  # the picture a task counts on names what it shows
        name = full_name(spec.main)
        title = rng.choice(("{name} spotted at the {setting}", "{Setting} featuring the {name}")).format(
            name=name, setting=spec.setting, Setting=spec.setting[0].upper() + spec.setting[1:])
        article = "An" if spec.setting[0] in "aeiou" else "A"
        return title, f"{article} {spec.setting} scene with the {name} among other items"
    if spec.kind == "photo":
        return pages.image_caption(spec.main, spec.clean, spec.named, spec.setting, rng)
    if spec.kind == "leak":
        name = full_name(spec.main)
        return (rng.choice(("Leaked: the {name}?", "Is this the {name}? Leaked photo")).format(name=name),
                f"Blurry photo said to show the {name}")
    if spec.kind == "mockup":
        name = full_name(spec.main)
        return (rng.choice(("{name} fan concept", "Fan render: {name}")).format(name=name),
                f"Fan-made render of the {name}")
    claimed = spec.caption_claims or spec.main
    title = rng.choice(("New {family} {variant} {noun} {year}", "{name}", "{family} {noun} first look",
                        "{name} official")).format(family=claimed.family, variant=claimed.variant, noun=claimed.noun,
                                                   year=claimed.released[:4], name=full_name(claimed))
    return title, f"{full_name(claimed)}"
