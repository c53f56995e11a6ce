"""Version-2 requests: how a task asks for its target(s), and how a reader takes a request apart.

A request names each subject in one of two ways:
  - directly: family, variant and sometimes the edition ("the new Zorvan FC Home kit", "the Zorvan FC 2026 Home
    kit"), with a special edition's tag when the target is one ("the new Zorvan FC Home Limited Edition kit");
  - indirectly, by the family's maker instead of its name ("the new Home kit from the kit supplier Norvale",
    "the latest Home kit made by Norvale"): the family must be found first.
A request has one subject, or two joined by `JOINER` ("… the new Zorvan FC Home kit side by side with the new
Quorn League Official match ball, in one picture."); both are then targets.

`parse_request` is the reader's side: the subjects of a request with their proper nouns, maker, noun, tag and
whether a recent release is meant. It knows the world's vocabulary (nouns, variants, edition words, tags), as a
reader knows what a kit or an away version is, and nothing about any particular world.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import re

from ranger_jax.env.sim import catalog

JOINER = " side by side with "
OPENERS = ("Generate an image of", "Create a photo of", "Make a picture of", "Show")
RECENCY_CUES = ("new", "latest", "newest", "just-released", "just released", "revealed", "this week", "last week",
                "days ago", "weeks ago", "recent", "brand-new", "this season", "brought out")
_DIRECT = (
    "the new {family} {variant} {noun}",
    "the just-released {family} {variant} {noun}",
    "the {family} {variant} {noun} that was revealed {when}",
    "this season's {family} {variant} {noun}",
    "the {family} {edition} {variant} {noun}",
)
_INDIRECT = (
    "the new {variant} {noun} from the {owner} {maker}",
    "the {variant} {noun} that {maker} brought out {when}",
    "the latest {variant} {noun} made by {maker}",
)
_MAKER = re.compile(r"from the (?:%s) (?P<a>[A-Z][a-z]+)|that (?P<b>[A-Z][a-z]+) brought out|made by (?P<c>[A-Z][a-z]+)"
                    % "|".join(sorted(set(catalog.OWNERS.values()))))
NOUNS = tuple(sorted({sc.noun for sc in catalog.SUBCATEGORIES}, key=len, reverse=True))
VARIANTS = frozenset(v for sc in catalog.SUBCATEGORIES for v in sc.variants)
EDITION_WORDS = frozenset(sc.edition.split()[0].rstrip(".") for sc in catalog.SUBCATEGORIES if " " in sc.edition)
TAG_WORDS = frozenset(w for tag in catalog.TAGS for w in tag.split())
VOCABULARY = VARIANTS | EDITION_WORDS | TAG_WORDS | {s for sc in catalog.SUBCATEGORIES for s in sc.suffixes}


def _when(released: str, today: dt.date) -> str:
    days = (today - dt.date.fromisoformat(released)).days
    return "this week" if days <= 6 else "last week" if days <= 13 else "a few weeks ago"


def subject_phrase(target, today: dt.date, rng: random.Random, *, indirect: bool) -> str:
    """How a request names `target` (a `world.Entity`): directly, or by its maker when `indirect`."""
    variant = f"{target.variant} {target.tag}" if target.tag else target.variant
    template = rng.choice(_INDIRECT if indirect else _DIRECT)
    return template.format(family=target.family, variant=variant, noun=target.noun, edition=target.edition,
                           when=_when(target.released, today), maker=target.maker,
                           owner=catalog.OWNERS[target.subcategory])


def request_text(phrases: list[str], context: str, rng: random.Random) -> str:
    """The whole request: an opener, the subject phrase(s), and the context of a one-subject request."""
    opener = rng.choice(OPENERS)
    if len(phrases) == 1:
        return f"{opener} {phrases[0]} {context}."
    return f"{opener} {JOINER.join(phrases)}, in one picture."


@dataclasses.dataclass(frozen=True)
class Subject:
    """One thing a request asks for, as a reader sees it.

    Attributes:
        phrase: the words of the request that name it.
        words: its proper nouns and numbers in order (family, edition, variant, tag; or the maker's name).
        family: the family name when the request gives it (the words before edition, variant and tag).
        maker: the maker the request names instead of the family (None when the family is named).
        noun: what the thing is ("kit"), None when no known noun appears.
        recent: the request asks for a recent release.
    """

    phrase: str
    words: tuple[str, ...]
    family: str | None
    maker: str | None
    noun: str | None
    recent: bool

    @property
    def query(self) -> str:
        """A search query for it: its proper nouns, or the maker and its noun (a rare name is found alone)."""
        if self.maker is not None:
            return f"{self.maker} {self.noun or ''}".strip()
        return " ".join(self.words)

    @property
    def name_words(self) -> tuple[str, ...]:
        """Words the release's name must contain (everything named except the maker)."""
        return tuple(w for w in self.words if w != self.maker)


def wants_recent(text: str) -> bool:
    """Whether `text` asks for a recent release."""
    low = text.lower()
    return any(re.search(rf"(?<![a-z]){re.escape(cue)}(?![a-z])", low) for cue in RECENCY_CUES)


def _subject(phrase: str, first: bool) -> Subject:
    """One subject phrase: the proper nouns before its noun, and variant or tag words after it (the rest of what
    follows the noun is the picture's context)."""
    found = [(m.start(), n) for n in NOUNS for m in re.finditer(rf"(?<![\w-]){re.escape(n)}(?![\w-])", phrase)]
    at, noun = min(found) if found else (len(phrase), None)
    words = [w.rstrip(".,") for w in re.findall(r"[A-Za-z0-9][\w'.-]*", phrase[:at])]
    opener = next((o for o in OPENERS if phrase.startswith(o)), "") if first else ""
    words = words[len(opener.split()):]
    after = [w.rstrip(".,") for w in re.findall(r"[A-Za-z0-9][\w'.-]*", phrase[at:])]
    words += [w for w in after if w in VARIANTS or w in TAG_WORDS]  # "the latest X kit in the Home version"
    kept = list(dict.fromkeys(w for w in words if w[0].isupper() or w.isdigit()))
    m = _MAKER.search(phrase)
    maker = next((g for g in m.groups() if g), None) if m else None
    family = None
    if maker is None:
        head = []
        for w in kept:
            if w.isdigit() or w in VARIANTS or w in EDITION_WORDS or w in TAG_WORDS:
                break
            head.append(w)
        family = " ".join(head) or None
    else:
        kept.append(maker)
    return Subject(phrase=phrase.strip(), words=tuple(kept), family=family, maker=maker, noun=noun,
                   recent=wants_recent(phrase))


def parse_request(prompt: str) -> list[Subject]:
    """The subjects of a request (one, or two around `JOINER`), as `Subject`s."""
    parts = prompt.split(JOINER)
    return [_subject(part, first=(i == 0)) for i, part in enumerate(parts)]
