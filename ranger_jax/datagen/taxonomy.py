"""What the prompt synthesis searches for: Savanna's subcategories with their news meta queries, Gen-Searcher's
20 categories, and the meta queries of the offline world.

Savanna (Ranger paper) builds its 500 prompts over 5 domains and 16 subcategories, retrieving news with a meta query
per subcategory inside a one-day window. The paper's table shows six rows (Film & TV, Anime, Games, Collectibles,
Music, General Sports); they are copied into `SAVANNA_META_QUERIES` as printed. The other ten subcategories of its
five domains are not listed in the text; `SAVANNA_META_QUERIES` completes them with rows of our own, in the same
style, marked in `OUR_ROWS`. Gen-Searcher writes multi-hop prompts across `GEN_SEARCHER_CATEGORIES` (its paper's
list, in its order).

The offline world has its own 16 subcategories (`env.sim.catalog.SUBCATEGORIES`) and writes its headlines with its
own verbs ("X unveils the …", "First look: the …", "Revealed: … arrives"), so `world_meta_queries` builds its meta
queries from each subcategory's noun and those verbs.
"""

from __future__ import annotations

import dataclasses

from ranger_jax.env.sim import catalog


@dataclasses.dataclass(frozen=True)
class Subcategory:
    """A subcategory of prompts: its domain, name and the news meta queries that find its headlines."""

    domain: str
    name: str
    meta_queries: tuple[str, ...]


SAVANNA_META_QUERIES = (
    # the paper's table
    Subcategory("Entertainment", "Film & TV", ("movie costume first look", "television series costume debut",
                                               "film set design first look", "movie poster artwork unveiling")),
    Subcategory("Entertainment", "Anime", ("anime key visual release", "anime character design reveal")),
    Subcategory("Entertainment", "Games", ("video game character costume reveal", "video game vehicle model debut",
                                           "video game expansion content announcement")),
    Subcategory("Entertainment", "Collectibles", ("collectible figure reveal", "comic issue variant cover reveal",
                                                  "collector edition box set reveal")),
    Subcategory("Entertainment", "Music", ("album cover artwork reveal", "concert stage design debut",
                                           "music video costume design")),
    Subcategory("Sports", "General Sports", ("team kit design unveiling", "championship trophy presentation",
                                             "championship medal ceremony", "player signing jersey presentation")),
    # ours: the subcategories the paper's text does not list
    Subcategory("Sports", "Motorsport", ("race car livery reveal", "driver helmet design unveiling")),
    Subcategory("Sports", "Sports Gear", ("signature shoe colorway release", "official match ball unveiling")),
    Subcategory("Fashion", "Runway", ("runway collection debut look", "fashion week show first look")),
    Subcategory("Fashion", "Streetwear", ("streetwear collaboration drop", "limited sneaker release")),
    Subcategory("Fashion", "Accessories", ("designer handbag launch", "luxury watch new edition unveiled")),
    Subcategory("Products", "Consumer Electronics", ("smartphone new colour launch", "gadget special edition reveal")),
    Subcategory("Products", "Vehicles", ("concept car unveiling", "new car model special edition debut")),
    Subcategory("Products", "Toys & Design", ("toy brick set reveal", "designer furniture launch")),
    Subcategory("Culture", "Art & Exhibitions", ("new mural unveiled", "museum exhibition poster reveal")),
    Subcategory("Culture", "Stamps & Coins", ("commemorative stamp issue unveiled",
                                              "commemorative coin design reveal")),
)
OUR_ROWS = tuple(s.name for s in SAVANNA_META_QUERIES[6:])  # rows that are ours, not the paper's
SAVANNA_DOMAINS = ("Entertainment", "Sports", "Fashion", "Products", "Culture")

GEN_SEARCHER_CATEGORIES = (
    "Anime", "Architecture", "Art", "Astronomy", "Biology", "Celebrities", "Chemistry", "Culture", "Engineering",
    "Film", "Game", "Geography", "History", "Industry", "Medicine", "Physics", "Politics", "Posters", "Religion",
    "Sports",
)

# Words of the offline world's launch headlines (`env.sim.pages`): a meta query pairs one with a subcategory noun.
WORLD_HEADLINE_QUERIES = ("{noun} unveils", "first look {noun}", "revealed {noun} arrives")


def world_meta_queries() -> tuple[Subcategory, ...]:
    """The offline world's subcategories with meta queries built from their nouns and its headline verbs."""
    return tuple(Subcategory(sc.domain, sc.name, tuple(q.format(noun=sc.noun) for q in WORLD_HEADLINE_QUERIES))
                 for sc in catalog.SUBCATEGORIES)


def select(subcategories: tuple[Subcategory, ...], names: list[str] | None) -> tuple[Subcategory, ...]:
    """The subcategories called `names` (all when None), in table order.

    Raises:
        ValueError: naming an unknown subcategory and the known ones.
    """
    if names is None:
        return subcategories
    known = {s.name: s for s in subcategories}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown subcategories {unknown}; known: {list(known)}")
    return tuple(s for s in subcategories if s.name in set(names))
