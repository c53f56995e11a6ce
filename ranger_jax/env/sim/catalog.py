"""The vocabulary of the offline world: Savanna's domains and subcategories, colours, patterns, names, sites.

Everything the generator draws from lives here as plain constants, so a reader can see what the world can
contain. Identity in the world is carried by four visible attributes: a primary colour, a secondary colour,
a pattern (drawn in the secondary colour) and an emblem text. A *variant* (colourway, finish, trim) fixes the
colours; an *edition* (year, model number, season) fixes the pattern and the emblem, so the previous edition
of a variant has the same colours and only its pattern and emblem tell it apart.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

DOMAINS = ("Entertainment", "Sports", "Fashion", "Products", "Culture")

# Colour names are single words so a prompt that names one never contains another by accident.
COLOURS = {
    "red": (214, 40, 40),
    "orange": (245, 130, 32),
    "yellow": (250, 214, 45),
    "lime": (170, 220, 50),
    "green": (36, 140, 64),
    "teal": (20, 140, 140),
    "cyan": (70, 200, 230),
    "blue": (40, 90, 220),
    "navy": (22, 32, 90),
    "purple": (120, 50, 170),
    "magenta": (220, 40, 160),
    "pink": (250, 160, 190),
    "maroon": (120, 20, 40),
    "brown": (120, 76, 40),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}

PATTERNS = ("stripes", "hoops", "diagonals", "checks", "dots", "chevrons", "halves", "plain")

# How the pattern reads in prose, with {c} the secondary colour.
PATTERN_PHRASES = {
    "stripes": "{c} stripes",
    "hoops": "{c} hoops",
    "diagonals": "{c} diagonals",
    "checks": "{c} checks",
    "dots": "{c} dots",
    "chevrons": "{c} chevrons",
    "halves": "{c} halves",
    "plain": "a plain finish with {c} trim",
}


@dataclasses.dataclass(frozen=True)
class Subcategory:
    """One of Savanna's 16 subcategories and how its things look and are named.

    Attributes:
        name: subcategory name as reported in tasks (e.g. "team kits").
        domain: one of DOMAINS.
        noun: what one thing is called in text ("kit", "sneaker").
        shape: the drawer in `render.py` that paints it.
        aspect: object width / height.
        edition: format of an edition label; `{n}` is the edition number, `{year}` its year.
        variants: names of the variants (colourways, finishes, trims) a family offers.
        suffixes: second words for family names ("" for one-word names).
        settings: scenes in which the thing appears (for scene titles and prompts).
        contexts: prompt endings that set the requested picture's context (words apart from `settings`, so a
            request never matches the captions of news photos by its scenery).
    """

    name: str
    domain: str
    noun: str
    shape: str
    aspect: float
    edition: str
    variants: tuple[str, ...]
    suffixes: tuple[str, ...]
    settings: tuple[str, ...]
    contexts: tuple[str, ...]


SUBCATEGORIES = (
    Subcategory("anime key visuals", "Entertainment", "key visual", "panel", 1.4, "Season {n}",
                ("Main", "Teaser", "Finale"), ("Saga", "Chronicle", "Quest"),
                ("convention hall", "train station billboard", "fan cafe"),
                ("painted as a mural on a rainy street at night", "as a framed print above a desk")),
    Subcategory("album covers", "Entertainment", "album cover", "square", 1.0, "Vol. {n}",
                ("Standard", "Deluxe", "Live"), ("", "Collective", "Ensemble"),
                ("record store", "listening party", "festival merch tent"),
                ("on a vinyl sleeve lying on a wooden floor", "as a poster in a teenager's bedroom")),
    Subcategory("film posters", "Entertainment", "film poster", "poster", 0.7, "Part {n}",
                ("Teaser", "Theatrical", "Character"), ("Rising", "Legacy", "Reborn"),
                ("cinema lobby", "premiere red carpet", "bus shelter"),
                ("in a lightbox on a rainy evening", "pinned to a wall in a dorm room")),
    Subcategory("video game covers", "Entertainment", "game cover", "cover", 0.75, "{n}",
                ("Standard", "Deluxe", "Ultimate"), ("Tactics", "Odyssey", "Frontier"),
                ("game store", "gaming expo booth", "living room shelf"),
                ("held by a kid on a sofa", "next to a console on a desk")),
    Subcategory("team kits", "Sports", "kit", "shirt", 0.95, "{year}",
                ("Home", "Away", "Third"), ("FC", "United", "Rovers"),
                ("stadium stand", "club shop", "training ground"),
                ("worn by a player celebrating a goal", "hanging in a dressing room")),
    Subcategory("match balls", "Sports", "match ball", "ball", 1.0, "{year}",
                ("Official", "Winter", "Final"), ("League", "Cup", "Series"),
                ("penalty spot", "sports shop", "kick-off ceremony"),
                ("on the centre circle before a match", "mid-flight in front of a goal")),
    Subcategory("racing helmets", "Sports", "helmet", "helmet", 1.1, "{year}",
                ("Race", "Tribute", "Testing"), ("Racing", "Motorsport", "GP"),
                ("pit lane", "paddock garage", "podium"),
                ("on a driver's head at sunset", "resting on a car's nose under floodlights")),
    Subcategory("sneakers", "Fashion", "sneaker", "sneaker", 1.6, "{n}",
                ("Ember", "Glacier", "Moss", "Dune", "Volt"), ("Runner", "Glide", "Court"),
                ("street corner", "sneaker boutique", "skate park"),
                ("worn on a rainy city pavement", "on a display plinth in soft light")),
    Subcategory("handbags", "Fashion", "handbag", "bag", 1.2, "Line {n}",
                ("Classic", "Mini", "Tote"), ("Atelier", "Maison", ""),
                ("runway", "boutique window", "cafe terrace"),
                ("carried by a model in Paris", "on a marble table next to sunglasses")),
    Subcategory("hoodies", "Fashion", "hoodie", "hoodie", 0.95, "Drop {n}",
                ("Core", "Tour", "Archive"), ("Supply", "Studio", "Club"),
                ("pop-up store", "street market", "concert crowd"),
                ("worn by a skater at dusk", "folded on a wooden bench")),
    Subcategory("smartphones", "Products", "smartphone", "phone", 0.5, "{n}",
                ("Midnight", "Sage", "Coral", "Frost"), ("", "Pro", "Max"),
                ("launch event stage", "electronics store", "office desk"),
                ("held in a hand on a sunny day", "lying next to a laptop and coffee")),
    Subcategory("cars", "Products", "car", "car", 1.8, "{year}",
                ("Sport", "Touring", "Trail"), ("", "GT", "EV"),
                ("motor show", "city street", "mountain road"),
                ("driving along a coastal highway", "parked outside a modern villa")),
    Subcategory("watches", "Products", "watch", "watch", 0.7, "Ref. {n}",
                ("Diver", "Field", "Pilot"), ("", "Horology", "Chrono"),
                ("watch fair", "jeweller's window", "wrist shot"),
                ("on a diver's arm underwater", "on a velvet cushion in soft light")),
    Subcategory("festival posters", "Culture", "festival poster", "poster", 0.7, "{year}",
                ("Main", "Lineup", "Night"), ("Festival", "Fest", "Weekender"),
                ("city wall", "festival gate", "tram stop"),
                ("pasted on brick in the old town", "held up by a crowd at sunset")),
    Subcategory("postage stamps", "Culture", "stamp", "stamp", 0.8, "Issue {n}",
                ("Definitive", "Airmail", "Souvenir"), ("Post", "Mail", "Philatelic"),
                ("stamp album", "post office counter", "collector's fair"),
                ("on an envelope under a magnifier", "on a vintage letter with a postmark")),
    Subcategory("book covers", "Culture", "book cover", "book", 0.66, "Book {n}",
                ("Hardcover", "Paperback", "Collector"), ("Tales", "Cycle", "Trilogy"),
                ("bookshop table", "library shelf", "reading nook"),
                ("held by a reader on a park bench", "next to a cup of tea on a windowsill")),
)

# News, shop and reference sites per domain; every URL in the world lives on one of these hosts.
SITES = {
    "Entertainment": ("screenbeat.sim", "animeharbor.sim", "tracklist.sim"),
    "Sports": ("pitchside.sim", "kitwatch.sim", "paddockwire.sim"),
    "Fashion": ("stylefeed.sim", "solewire.sim", "runwaydaily.sim"),
    "Products": ("gadgetline.sim", "techpulse.sim", "motorwire.sim"),
    "Culture": ("culturedesk.sim", "stampnews.sim", "shelfreads.sim"),
}
WIKI_SITE = "wiki.sim"
SHOP_SITE = "shop.sim"

_ONSETS = ("b", "c", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "br", "cr", "dr", "gr", "st", "tr", "pl", "sh", "th", "qu")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "io", "ou")
_CODAS = ("", "", "n", "r", "s", "l", "x", "nd", "rk")
# Words a family name must never be, so names do not collide with attribute or request vocabulary.
_RESERVED = frozenset(COLOURS) | frozenset(PATTERNS) | {"new", "latest", "image", "photo", "picture", "the"}


def make_word(rng: random.Random, used: set[str], accept: Callable[[str], bool] | None = None) -> str:
    """A fresh two-syllable capitalised word (e.g. "Zorvan") not in `used`; adds it to `used`.

    Args:
        accept: only words it accepts are returned (e.g. the words of one side of a train/held-out split).
    """
    while True:
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(2))
        word = word.capitalize()
        if 4 <= len(word) <= 10 and word.lower() not in _RESERVED and word not in used and (
                accept is None or accept(word)):
            used.add(word)
            return word


def emblem_code(family: str, number: int) -> str:
    """Emblem text of an edition: family initials (two letters for one-word names) + number, e.g. "LF26"."""
    words = family.split()
    initials = "".join(w[0] for w in words) if len(words) > 1 else family[:2]
    return f"{initials.upper()}{number % 100 if number >= 1000 else number}"


def luminance(rgb: tuple[int, int, int]) -> float:
    """Relative luminance in 0–1 (Rec. 709 weights), used to pick legible emblem ink."""
    r, g, b = rgb
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255.0


# ---- version-2 worlds ------------------------------------------------------------------------------------------
# Who makes each subcategory's things: requests that do not name a family name its maker instead ("the new
# Home kit from the kit supplier Norvale"), and pages say which maker is behind a family.
OWNERS = {
    "anime key visuals": "animation studio", "album covers": "record label", "film posters": "film studio",
    "video game covers": "developer", "team kits": "kit supplier", "match balls": "ball maker",
    "racing helmets": "helmet maker", "sneakers": "shoe brand", "handbags": "fashion house",
    "hoodies": "streetwear label", "smartphones": "phone maker", "cars": "carmaker", "watches": "watchmaker",
    "festival posters": "promoter", "postage stamps": "postal service", "book covers": "publisher",
}
# Labels of special editions that differ from the standard release only in their trim colour.
TAGS = ("Limited Edition", "Special Edition", "Anniversary Edition", "Founders Edition", "Signature Edition")
# Hosts that copy other sites' pictures and articles (near-duplicates with their own captions and dates).
REHOST_SITES = ("pinwall.sim", "imgdump.sim", "trendboard.sim", "newsmirror.sim")
# Keyword-stuffed pages that rank well and say little.
SEO_SITES = ("bestdeals-guide.sim", "topreleases.sim", "whatsnew-hub.sim")
# Forums and fan sites: rumours, leaks and fan-made mock-ups.
FAN_SITES = ("leakwatch.sim", "fanforum.sim", "conceptcorner.sim")
# What a dead link or a failed download answers instead of the page or picture.
PAGE_ERRORS = ("HTTP 404 Not Found", "HTTP 410 Gone", "HTTP 503 Service Unavailable", "connection timed out")
IMAGE_ERRORS = ("HTTP 403 Forbidden (hotlinking not allowed)", "HTTP 404 Not Found", "connection reset",
                "not an image (text/html)")
