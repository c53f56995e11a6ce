"""Version-2 wording: every phrasing of every fact reads back, hedged pages are told apart, requests parse."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from ranger_jax.env.sim import catalog, prose, requests
from ranger_jax.env.sim.world import Attributes, Entity


def _kit(**changes) -> Entity:
    fields = dict(id="e0001t", family="Zorvan FC", name="Zorvan FC 2026 Home", noun="kit", subcategory="team kits",
                  domain="Sports", edition="2026", variant="Home", released="2026-03-02",
                  attributes=Attributes(primary="navy", secondary="white", pattern="hoops", emblem="ZF26",
                                        trim="lime"), maker="Norvale")
    return Entity(**{**fields, **changes})


@pytest.mark.parametrize("kind", ["released", "colours", "pattern", "emblem", "trim"])
def test_every_phrasing_reads_back(kind):
    entity = _kit()
    expected = {"released": {"released": "2026-03-02"}, "colours": {"primary": "navy", "secondary": "white"},
                "pattern": {"pattern": "hoops"}, "emblem": {"emblem": "ZF26"}, "trim": {"trim": "lime"}}[kind]
    for template in prose.PHRASINGS[kind]:
        style = prose.Style({**{k: v[:1] for k, v in prose.PHRASINGS.items()}, kind: (template,)})
        sentences = prose.statements(style, entity, [kind], random.Random(0), it="It")
        facts = prose.read_facts("The Zorvan FC 2026 Home kit is here. " + " ".join(sentences), "Zorvan FC", "kit")
        assert {f.field: f.value for f in facts} == expected, template
        assert {f.name for f in facts} == {"Zorvan FC 2026 Home kit"}


def test_every_pattern_and_colour_reads_back():
    for pattern in catalog.PATTERNS:
        for primary, secondary in (("maroon", "brown"), ("white", "black"), ("lime", "green")):
            entity = _kit(attributes=Attributes(primary=primary, secondary=secondary, pattern=pattern,
                                                emblem="ZF26", trim="cyan"))
            style = prose.Style.draw(random.Random(pattern))
            text = "The Zorvan FC 2026 Home kit is here. " + " ".join(
                prose.statements(style, entity, ["colours", "pattern", "trim"], random.Random(1), it="It"))
            facts = {f.field: f.value for f in prose.read_facts(text, "Zorvan FC", "kit")}
            assert facts == {"primary": primary, "secondary": secondary, "pattern": pattern, "trim": "cyan"}


def test_facts_belong_to_the_first_release_of_their_paragraph():
    text = ("The Zorvan FC 2026 Home kit is here. It comes in navy and white.\n\n"
            "The Zorvan FC 2025 Home kit is also covered here. It comes in red and black. Look for the ZF25 badge.")
    facts = prose.read_facts(text, "Zorvan FC", "kit")
    assert [(f.name, f.field, f.value) for f in facts] == [
        ("Zorvan FC 2026 Home kit", "primary", "navy"), ("Zorvan FC 2026 Home kit", "secondary", "white"),
        ("Zorvan FC 2025 Home kit", "primary", "red"), ("Zorvan FC 2025 Home kit", "secondary", "black"),
        ("Zorvan FC 2025 Home kit", "emblem", "ZF25")]
    assert prose.read_facts(text, "Quorn League", "match ball") == []


def test_names_with_abbreviated_editions_and_tags():
    text = "The Zorvan Collective Vol. 3 Deluxe Limited Edition album cover hit the shelves on March 4, 2026."
    facts = prose.read_facts(text, "Zorvan Collective", "album cover")
    assert [(f.name, f.value) for f in facts] == [("Zorvan Collective Vol. 3 Deluxe Limited Edition album cover",
                                                   "2026-03-04")]


def test_hedged_pages_and_makers():
    rumour = ("# Leak: is this the Zorvan FC 2026 Home kit?\n\nPublished March 1, 2026\n\nA leaked picture reportedly "
              "shows the Zorvan FC 2026 Home kit ahead of its launch; nothing is confirmed.\n\nIn it, the Zorvan FC "
              "2026 Home kit looks like this. It comes in navy and red.")
    assert prose.is_hedged(rumour)
    assert {f.hedged for f in prose.read_facts(rumour, "Zorvan FC", "kit")} == {True}
    official = rumour.replace("Leak: is this", "First look:").replace("A leaked picture reportedly shows",
                                                                     "Here is").replace("; nothing is confirmed", "")
    assert not prose.is_hedged(official)
    for template in prose.PHRASINGS["maker"]:
        sentence = template.format(family="Zorvan FC", maker="Norvale", owner="kit supplier")
        assert prose.read_makers(sentence) == [("Norvale", "Zorvan FC")], template


def test_styles_are_drawn_per_world():
    first, second = prose.Style.draw(random.Random(1)), prose.Style.draw(random.Random(2))
    assert first == prose.Style.draw(random.Random(1)) and first != second
    assert all(len(v) == prose.PHRASINGS_PER_WORLD for v in first.phrasings.values())


def test_request_wording_and_parsing_round_trip():
    today = dt.date(2026, 3, 9)
    target = _kit(tag="Limited Edition", name="Zorvan FC 2026 Home Limited Edition")
    for seed in range(20):
        rng = random.Random(seed)
        direct = requests.subject_phrase(target, today, rng, indirect=False)
        indirect = requests.subject_phrase(target, today, rng, indirect=True)
        [subject] = requests.parse_request(requests.request_text([direct], "hanging in a dressing room", rng))
        assert subject.family == "Zorvan FC" and subject.maker is None and subject.noun == "kit"
        assert {"Home", "Limited", "Edition"} <= set(subject.name_words)
        [subject] = requests.parse_request(requests.request_text([indirect], "worn by a player", rng))
        assert (subject.family, subject.maker, subject.noun) == (None, "Norvale", "kit")
        assert "Zorvan" not in indirect and subject.query == "Norvale kit" and subject.recent
    ball = _kit(family="Quorn League", name="Quorn League 2026 Official", noun="match ball", variant="Official",
                maker="Tessa")
    pair = requests.request_text([requests.subject_phrase(_kit(), today, random.Random(0), indirect=False),
                                  requests.subject_phrase(ball, today, random.Random(1), indirect=False)], "",
                                 random.Random(2))
    subjects = requests.parse_request(pair)
    assert [(s.family, s.noun) for s in subjects] == [("Zorvan FC", "kit"), ("Quorn League", "match ball")]


def test_version_one_requests_name_the_variant_after_the_noun():
    [subject] = requests.parse_request("Show the latest Tourshos Weekender festival poster in the Lineup version "
                                       "held up by a crowd at sunset.")
    assert subject.words == ("Tourshos", "Weekender", "Lineup") and subject.family == "Tourshos Weekender"
