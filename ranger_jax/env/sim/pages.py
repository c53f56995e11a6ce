"""News-style text for the offline world: page titles and bodies, fact sheets, image titles and alt text.

Pages read like the web a search agent meets: a dated headline, a few sentences of prose that name things
and describe their colours, pattern and emblem, `![alt](url)` image references, and `[title](url)` links.
Announcements, comparisons and catalogue pages carry a fact sheet, one `Key: value` per line:

    Fact sheet
    Name: Lakeside FC 2026 Home kit
    Series: Lakeside FC
    Release date: 2026-03-02
    Colours: navy, gold
    Pattern: hoops
    Emblem: LF26

Every choice comes from the `rng` passed in, so text is deterministic per seed.
"""

from __future__ import annotations

import datetime as dt
import random
import re

from ranger_jax.env.sim import catalog
from ranger_jax.env.sim.world import Entity

FACT_SHEET_HEADER = "Fact sheet"


def long_date(iso: str) -> str:
    """"2026-03-02" -> "March 2, 2026"."""
    day = dt.date.fromisoformat(iso)
    return f"{day.strftime('%B')} {day.day}, {day.year}"


def slugify(text: str, limit: int = 60) -> str:
    """URL slug of `text`: lower-case words joined by hyphens, at most `limit` characters."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].rstrip("-")


def full_name(entity: Entity) -> str:
    """Name with its noun, e.g. "Lakeside FC 2026 Home kit"."""
    return f"{entity.name} {entity.noun}"


def pattern_phrase(entity: Entity) -> str:
    """The entity's pattern in words, with its secondary colour filled in."""
    return catalog.PATTERN_PHRASES[entity.attributes.pattern].format(c=entity.attributes.secondary)


def fact_sheet(entity: Entity) -> str:
    """The fact-sheet block for `entity` (see the module docstring)."""
    look = entity.attributes
    return "\n".join((
        FACT_SHEET_HEADER,
        f"Name: {full_name(entity)}",
        f"Series: {entity.family}",
        f"Release date: {entity.released}",
        f"Colours: {look.primary}, {look.secondary}",
        f"Pattern: {look.pattern}",
        f"Emblem: {look.emblem}",
    ))


def describe(entity: Entity, rng: random.Random, with_emblem: bool = True) -> str:
    """One or two prose sentences on how `entity` looks."""
    look = rng.choice((
        "The {noun} pairs a {primary} base with {pattern}.",
        "It comes in {primary} with {pattern}.",
        "Expect a {primary} body covered in {pattern}.",
        "The design sets {pattern} against a {primary} ground.",
    )).format(noun=entity.noun, primary=entity.attributes.primary, pattern=pattern_phrase(entity))
    if not with_emblem:
        return look
    mark = rng.choice((
        "The {emblem} emblem sits front and centre.",
        "A bold {emblem} badge finishes it off.",
        "Look for the {emblem} emblem on the front.",
    )).format(emblem=entity.attributes.emblem)
    return f"{look} {mark}"


def _filler(entity: Entity, rng: random.Random) -> str:
    return rng.choice((
        f"Collectors have followed the {entity.family} line closely for years.",
        f"Demand for {entity.family} releases usually outstrips supply in the first weeks.",
        f"Retail partners expect the {entity.noun} to be one of the season's most searched items.",
        f"The {entity.family} team said the design grew out of feedback from fans.",
        "Early listings suggest stock will be limited at launch.",
    ))


def announcement(entities: list[Entity], date: str, rng: random.Random) -> tuple[str, str]:
    """(title, body) of a launch article for one entity or a joint launch of several; with fact sheets."""
    first = entities[0]
    if len(entities) == 1:
        title = rng.choice((
            "{family} unveils the {name}",
            "First look: the {name}",
            "Revealed: {name} arrives",
            "Official: this is the {name}",
        )).format(family=first.family, name=full_name(first))
        lede = (f"{first.family} has officially revealed the {full_name(first)}, "
                f"which goes on sale on {long_date(first.released)}.")
    else:
        names = " and ".join(e.variant for e in entities)
        title = f"{first.family} reveals {first.edition} {names} {first.noun}s"
        lede = (f"{first.family} today revealed its {first.edition} {first.noun}s in {names} versions, "
                f"released on {long_date(first.released)}.")
    body = [lede]
    for entity in entities:
        body.append(f"The {entity.variant} version: " + describe(entity, rng))
    body.append(_filler(first, rng))
    body.extend(fact_sheet(e) for e in entities)
    return title, "\n\n".join(body)


def coverage(entity: Entity, setting: str, recent: bool, rng: random.Random) -> tuple[str, str]:
    """(title, body) of a news or review piece about one entity, prose only."""
    if recent:
        title = rng.choice((
            "Spotted: the new {family} {noun} at the {setting}",
            "Fans react to the {name}",
            "{name}: first impressions",
            "Inside the {setting} as the {family} {variant} {noun} lands",
        ))
    else:
        title = rng.choice((
            "{name} review: worth it?",
            "Why the {family} {variant} {noun} is everywhere",
            "{name} sells out at the {setting}",
            "The new {family} {noun} in pictures",
        ))
    title = title.format(family=entity.family, noun=entity.noun, setting=setting, name=full_name(entity),
                         variant=entity.variant)
    body = [
        rng.choice((
            f"We went to the {setting} to see the {full_name(entity)} up close.",
            f"The {full_name(entity)} has become a fixture at every {setting}.",
            f"Crowds at the {setting} were quick to pick out the {entity.family} {entity.variant} {entity.noun}.",
        )),
        describe(entity, rng, with_emblem=rng.random() < 0.7),
        _filler(entity, rng),
    ]
    return title, "\n\n".join(body)


def sale(entity: Entity, rng: random.Random) -> tuple[str, str]:
    """(title, body) of a recent discount story about an older entity."""
    title = rng.choice((
        "{name} now discounted as the new {family} {noun} arrives",
        "Deal: the {name} drops in price",
        "Last chance to buy the {name}",
    )).format(name=full_name(entity), family=entity.family, noun=entity.noun)
    body = [
        f"Retailers have cut the price of the {full_name(entity)}, first released on "
        f"{long_date(entity.released)}.",
        describe(entity, rng),
        f"Shoppers hunting for the latest {entity.family} {entity.noun} should check which edition they are buying.",
    ]
    return title, "\n\n".join(body)


def comparison(new: Entity, old: Entity, rng: random.Random) -> tuple[str, str]:
    """(title, body) of a side-by-side piece on a new entity and its previous edition, with fact sheets."""
    title = rng.choice((
        "{new} vs {old}: what changed",
        "Side by side: {new} and {old}",
    )).format(new=full_name(new), old=full_name(old))
    body = [
        f"The {full_name(new)} replaces the {full_name(old)}. At a glance they look alike, so here is how to "
        f"tell them apart.",
        f"New: {describe(new, rng)}",
        f"Old: {describe(old, rng)}",
        fact_sheet(new),
        fact_sheet(old),
    ]
    return title, "\n\n".join(body)


def catalogue(entities: list[Entity]) -> tuple[str, str]:
    """(title, body) of a reference page listing known editions (older ones; it lags the news)."""
    first = entities[0]
    title = f"{first.family} {first.noun}s: list of releases"
    lines = [f"This page lists every {first.family} {first.noun} released so far."]
    for e in sorted(entities, key=lambda e: (e.released, e.id)):
        lines.append(f"- {full_name(e)} ({e.released}): {e.attributes.primary} with {pattern_phrase(e)}, "
                     f"emblem {e.attributes.emblem}")
    return title, "\n".join(lines)


def page_text(title: str, date: str, body: str, images: list[tuple[str, str]], links: list[tuple[str, str]]) -> str:
    """Assembles a page: headline, dateline, body, image references and related links (markdown-ish)."""
    parts = [f"# {title}", f"Published {long_date(date)}", body]
    parts.extend(f"![{alt}]({url})" for url, alt in images)
    if links:
        parts.append("Related:\n" + "\n".join(f"- [{t}]({u})" for u, t in links))
    return "\n\n".join(parts)


def image_caption(entity: Entity, clean: bool, named: bool, setting: str, rng: random.Random) -> tuple[str, str]:
    """(title, alt) for an image whose main subject is `entity`.

    Args:
        entity: the subject.
        clean: a product shot (else a crowded scene at `setting`).
        named: the caption names the full edition; otherwise only family, variant and noun.
        setting: where a scene takes place.
        rng: randomness source.
    """
    short = f"{entity.family} {entity.variant} {entity.noun}"
    label = full_name(entity) if named else short
    if clean:
        title = rng.choice(("{label} official product photo", "{label} press image", "The new {short}",
                            "{short} studio shot")).format(label=label, short=short)
        alt = f"{label} in {entity.attributes.primary} and {entity.attributes.secondary}"
    else:
        title = rng.choice(("{label} spotted at the {setting}", "Crowd at the {setting}",
                            "{setting} featuring the {short}")).format(label=label, setting=setting, short=short)
        title = title[0].upper() + title[1:]
        article = "An" if setting[0] in "aeiou" else "A"
        alt = f"{article} {setting} scene with the {label} among other items"
    return title, alt
