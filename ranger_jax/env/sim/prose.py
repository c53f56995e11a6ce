"""How version-2 pages word identity facts, and the reader that gets them back from page text.

Version-1 pages carry a machine-readable fact sheet. Version-2 pages state facts in prose, a few per page, in
phrasings drawn per world from `PHRASINGS` (several per fact, so two worlds read differently):

    The Zorvan FC 2026 Home kit goes on sale on March 2, 2026. It pairs a navy base with white details.
    Its pattern is horizontal hoops. The ZF26 emblem sits front and centre. The edges are trimmed in gold.
    Zorvan FC is made by the kit supplier Norvale.

Facts are attributed by paragraph: a paragraph is about the first release it names (a name is the family, up to
six capitalised words or numbers, then the noun: "Zorvan FC 2026 Home kit"), and pages keep one release per
paragraph. A page whose title or lede carries a hedge cue (`HEDGE_CUES`: leaks, rumours, fan concepts) reports
what someone claims, not what was released, and its facts come back flagged `hedged`.

`read_facts(text, family, noun)` is that reader; `read_makers(text)` finds which family a maker stands behind.
Both also read the version-1 fact sheets, so one reader serves both world versions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import re

from ranger_jax.env.sim import catalog

FIELDS = ("released", "primary", "secondary", "pattern", "emblem", "trim")
# How each pattern reads in version-2 prose, and back.
PATTERN_WORDS = {
    "stripes": "vertical stripes", "hoops": "horizontal hoops", "diagonals": "diagonal bands",
    "checks": "a check pattern", "dots": "polka dots", "chevrons": "chevrons", "halves": "two contrasting halves",
    "plain": "a plain body with edge bands",
}
_PATTERN_BACK = {words: name for name, words in PATTERN_WORDS.items()}
HEDGE_CUES = ("leak", "leaked", "leaks", "rumour", "rumoured", "rumours", "reportedly", "unconfirmed", "concept",
              "fan-made", "mock-up", "mockup")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")

# Per fact, the phrasings a world can use. `{It}` is the sentence's subject ("It", "The kit" or the full name);
# the other fields are the values. A world draws `PHRASINGS_PER_WORLD` of each list.
PHRASINGS = {
    "released": ("{It} goes on sale on {released}.", "{It} was released on {released}.",
                 "The release date is {released}.", "{It} hit the shelves on {released}.",
                 "Availability starts {released}."),
    "colours": ("{It} pairs a {primary} base with {secondary} details.",
                "The main colour is {primary}, with {secondary} as the second colour.",
                "{It} comes in {primary} and {secondary}.", "The colourway is {primary} first, {secondary} second.",
                "Mostly {primary}, it is set off by {secondary}."),
    "pattern": ("The design uses {pattern}.", "{It} is covered in {pattern}.", "Its pattern is {pattern}.",
                "Expect {pattern} across the body."),
    "emblem": ("The {emblem} emblem sits front and centre.", "Look for the {emblem} badge.",
               "{It} carries the {emblem} crest.", "The badge reads {emblem}."),
    "trim": ("{It} is finished with {trim} trim.", "A thin {trim} outline runs around the edge.",
             "The edges are trimmed in {trim}.", "Trim colour: {trim}."),
    "maker": ("{family} is made by the {owner} {maker}.", "The {family} line comes from {maker}, the {owner}.",
              "{maker}, the {owner} behind {family}, confirmed the details."),
}
PHRASINGS_PER_WORLD = 3

_COLOUR = "|".join(sorted(catalog.COLOURS, key=len, reverse=True))
_DATE = r"(?:%s) \d{1,2}, \d{4}|\d{4}-\d{2}-\d{2}" % "|".join(_MONTHS)
_VALUES = {
    "released": f"(?P<released>{_DATE})", "primary": f"(?P<primary>{_COLOUR})",
    "secondary": f"(?P<secondary>{_COLOUR})", "trim": f"(?P<trim>{_COLOUR})",
    "pattern": "(?P<pattern>%s)" % "|".join(re.escape(w) for w in PATTERN_WORDS.values()),
    "emblem": r"(?P<emblem>[A-Z]{2,3}\d{1,2})", "family": r"(?P<family>[A-Z][A-Za-z]+(?: [A-Z][A-Za-z]*)?)",
    "maker": r"(?P<maker>[A-Z][a-z]+)", "owner": "(?:%s)" % "|".join(sorted(set(catalog.OWNERS.values()))),
}


def _compile(template: str) -> re.Pattern:
    """The regex that reads a phrasing back: its words fixed, `{It}` dropped, each value a named group."""
    body = template.replace("{It} ", "").replace("{It}", "")
    parts = re.split(r"(\{\w+\})", body)
    return re.compile("".join(_VALUES[p[1:-1]] if p.startswith("{") else re.escape(p) for p in parts))


_READERS = {kind: tuple(_compile(t) for t in templates) for kind, templates in PHRASINGS.items()}
_FACT_SHEET = re.compile(
    r"Fact sheet\nName: (?P<name>.+)\nSeries: (?P<series>.+)\nRelease date: (?P<released>\d{4}-\d{2}-\d{2})\n"
    r"Colours: (?P<primary>[\w-]+), (?P<secondary>[\w-]+)\nPattern: (?P<pattern>[\w-]+)\nEmblem: (?P<emblem>\S+)")


def long_date(iso: str) -> str:
    """"2026-03-02" -> "March 2, 2026"."""
    day = dt.date.fromisoformat(iso)
    return f"{_MONTHS[day.month - 1]} {day.day}, {day.year}"


def _iso(text: str) -> str:
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        return text
    month, day, year = re.fullmatch(r"(\w+) (\d{1,2}), (\d{4})", text).groups()
    month = next(i for i, m in enumerate(_MONTHS, 1) if m.lower() == month.lower())
    return dt.date(int(year), month, int(day)).isoformat()


@dataclasses.dataclass(frozen=True)
class Style:
    """A world's way of wording facts: for each fact kind, the phrasings it uses."""

    phrasings: dict[str, tuple[str, ...]]

    @classmethod
    def draw(cls, rng: random.Random) -> "Style":
        """`PHRASINGS_PER_WORLD` phrasings of each fact kind, drawn from `rng`."""
        return cls({kind: tuple(rng.sample(templates, PHRASINGS_PER_WORLD)) for kind, templates in PHRASINGS.items()})

    def say(self, kind: str, rng: random.Random, it: str, **values: str) -> str:
        """One sentence stating fact `kind` (`values` hold its fields) about subject `it`."""
        text = rng.choice(self.phrasings[kind]).format(It=it, **values)
        return text[0].upper() + text[1:]


def statements(style: Style, entity, fields: list[str], rng: random.Random, *, it: str) -> list[str]:
    """Sentences stating `fields` of `entity` (a `world.Entity`), the first naming it through `it`.

    `fields` holds fact kinds: "released", "colours", "pattern", "emblem", "trim".
    """
    look = entity.attributes
    values = {"released": {"released": long_date(entity.released)},
              "colours": {"primary": look.primary, "secondary": look.secondary},
              "pattern": {"pattern": PATTERN_WORDS[look.pattern]}, "emblem": {"emblem": look.emblem},
              "trim": {"trim": look.trim or ""}}
    out = []
    for i, kind in enumerate(fields):
        subject = it if i == 0 else rng.choice(("It", f"The {entity.noun}"))
        out.append(style.say(kind, rng, subject, **values[kind]))
    return out


@dataclasses.dataclass(frozen=True)
class Fact:
    """One stated fact: the release it is about, the field, its value, and whether the page only claims it."""

    name: str
    field: str
    value: str
    hedged: bool


def is_hedged(text: str) -> bool:
    """Whether a page reports claims (leaks, rumours, fan concepts): a hedge cue in its title lines (the first two
    paragraphs) or its lede (the first paragraph of prose: eight words or more, ending in a full stop)."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text.strip())]
    lede = next((p for p in paragraphs if len(p.split()) >= 8 and p.endswith(".")), "")
    words = set(re.findall(r"[a-z][a-z-]*", " ".join([*paragraphs[:2], lede]).lower()))
    return any(cue in words for cue in HEDGE_CUES)


def _names(paragraph: str, family: str, noun: str) -> list[tuple[int, str]]:
    pattern = r"(?<![\w-])" + re.escape(family) + r"((?: [A-Z0-9][\w.'-]*){0,6}?) " + re.escape(noun) + r"(?![\w-])"
    return [(m.start(), m.group(0)) for m in re.finditer(pattern, paragraph)]


def read_facts(text: str, family: str, noun: str) -> list[Fact]:
    """Every fact `text` states about releases of `family` (things called `noun`), in reading order.

    Reads the prose phrasings of version-2 pages (attributed by paragraph, see the module docstring) and the
    fact sheets of version-1 pages.
    """
    hedged = is_hedged(text)
    facts = []
    for m in _FACT_SHEET.finditer(text):
        if m["series"] == family:
            for name in FIELDS[:5]:
                facts.append(Fact(m["name"], name, m[name], hedged))
    for paragraph in re.split(r"\n\s*\n", text):
        names = _names(paragraph, family, noun)
        if not names:
            continue
        for kind, readers in _READERS.items():
            if kind == "maker":
                continue
            for reader in readers:
                for m in reader.finditer(paragraph):
                    name = names[0][1]
                    for key, value in m.groupdict().items():
                        if key == "released":
                            value = _iso(value)
                        elif key == "pattern":
                            value = _PATTERN_BACK[value.lower()]
                        elif key in ("primary", "secondary", "trim"):
                            value = value.lower()
                        facts.append(Fact(name, key, value, hedged))
    return facts


def read_makers(text: str) -> list[tuple[str, str]]:
    """(maker, family) pairs that `text` states ("Zorvan FC is made by the kit supplier Norvale")."""
    return [(m["maker"], m["family"]) for reader in _READERS["maker"] for m in reader.finditer(text)]
