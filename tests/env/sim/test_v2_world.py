"""Version-2 worlds: every web-like feature is present, seeded (same seed, same bytes) and seed-dependent."""

from __future__ import annotations

import asyncio
import collections
import json
import shutil

import pytest

from ranger_jax.env.backends.offline import OfflineBackend
from ranger_jax.env.sim import catalog, load_tasks, load_world, photo, plan_v2, prose, world

from tests.env.sim.test_build import _files


def _layout(text: str) -> str:
    head = text.split("\n", 1)[0]
    return "press" if head.startswith("PRESS RELEASE") else "digest" if head.startswith("## ") else \
        "news" if head.startswith("# ") else "blog"


def _phrasings(the_world) -> set[tuple[str, int]]:
    """(fact kind, phrasing number) of every phrasing some page uses."""
    used = set()
    for page in the_world.pages.values():
        for kind, templates in prose.PHRASINGS.items():
            for number, template in enumerate(templates):
                if prose._compile(template).search(page.text):
                    used.add((kind, number))
    return used


def _facts_by_page(the_world, tasks):
    out = []
    for task in tasks:
        for target_id in task.ground_truth["target_ids"]:
            target = the_world.entities[target_id]
            for page in sorted(the_world.pages.values(), key=lambda p: p.url):
                if page.kind in ("announce", "coverage") and page.error is None:
                    facts = {f.field for f in prose.read_facts(page.text, target.family, target.noun)
                             if f.name == f"{target.name} {target.noun}" and not f.hedged}
                    if facts:
                        out.append((target_id, page.url, tuple(sorted(facts))))
    return out


def _ranking(root):
    backend = OfflineBackend(root)

    async def search():
        out = []
        for task in load_tasks(root)[:6]:
            hits = await backend.text_search(task.prompt, top_k=10)
            out.append(tuple(h.url for h in hits))
        return out

    return asyncio.run(search())


FEATURES = {
    "dead links": lambda w, t: sorted((p.url, p.error) for p in w.pages.values() if p.error),
    "failed downloads": lambda w, t: sorted((i.url, i.error) for i in w.images.values() if i.error),
    "near-duplicate re-hosts": lambda w, t: sorted((i.url, i.title, i.sha256) for i in w.images.values()
                                                   if i.kind == "rehost"),
    "keyword-stuffed pages": lambda w, t: sorted((p.url, p.title) for p in w.pages.values() if p.kind == "seo"),
    "rumours, leaks and mock-ups": lambda w, t: sorted((e.id, e.status, e.attributes) for e in w.entities.values()
                                                       if e.status != "release"),
    "indirect requests": lambda w, t: sorted(x.prompt for x in t if x.metadata["request_kind"] == "indirect"),
    "two subjects": lambda w, t: sorted((x.prompt, tuple(x.ground_truth["target_ids"])) for x in t
                                        if len(x.ground_truth["target_ids"]) == 2),
    "occlusion": lambda w, t: sorted((i.id, o.entity_id, o.visible) for i in w.images.values() for o in i.objects
                                     if o.visible < 1.0),
    "lighting, scale and JPEG": lambda w, t: sorted((i.id, i.width, i.height, i.sha256) for i in w.images.values()
                                                    if i.error is None),
    "special editions": lambda w, t: sorted((e.id, e.tag, e.attributes.trim) for e in w.entities.values() if e.tag),
    "layouts": lambda w, t: sorted((p.url.split("/")[2], _layout(p.text)) for p in w.pages.values()),
    "facts spread over pages": lambda w, t: _facts_by_page(w, t),
}


@pytest.fixture(scope="module")
def worlds(v2_world, v2_twin, v2_other):
    return {name: (load_world(root), load_tasks(root)) for name, root in
            (("world", v2_world), ("twin", v2_twin), ("other", v2_other))}


def test_same_seed_same_bytes(v2_world, v2_twin, v2_other):
    first, second = _files(v2_world), _files(v2_twin)
    assert sorted(first) == sorted(second)
    assert [n for n in first if first[n] != second[n]] == []
    assert _files(v2_other)[world.TASKS_FILE] != first[world.TASKS_FILE]


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_each_feature_is_present_seeded_and_seed_dependent(worlds, feature):
    extract = FEATURES[feature]
    here, twin, other = (extract(*worlds[name]) for name in ("world", "twin", "other"))
    assert here, f"the world has no {feature}"
    assert here == twin
    assert here != other


def test_ranking_noise_is_seeded_and_reorders_results(v2_world, v2_twin, tmp_path):
    noisy = _ranking(v2_world)
    assert noisy == _ranking(v2_twin)
    exact_world = tmp_path / "exact"
    shutil.copytree(v2_world, exact_world)
    meta = json.loads((exact_world / world.WORLD_FILE).read_text())
    (exact_world / world.WORLD_FILE).write_text(json.dumps({**meta, "ranking_noise": 0.0}))
    exact = _ranking(exact_world)
    assert sum(a != b for a, b in zip(noisy, exact)) >= 3  # the noise moves documents, each query always alike
    assert all(set(a) & set(b) for a, b in zip(noisy, exact))


def test_world_file_records_the_version(v2_world):
    meta = json.loads((v2_world / world.WORLD_FILE).read_text())
    assert (meta["version"], meta["world_version"], meta["ranking_noise"]) == (2, 2, plan_v2.RANKING_NOISE)
    assert "split" not in meta
    the_world = load_world(v2_world)
    assert (the_world.version, the_world.ranking_noise, the_world.split) == (2, plan_v2.RANKING_NOISE, None)


def test_several_layouts_and_phrasings_per_world(worlds):
    the_world, _ = worlds["world"]
    assert len({_layout(p.text) for p in the_world.pages.values()}) >= 3
    used = _phrasings(the_world)
    for kind in ("released", "colours", "pattern", "emblem", "trim", "maker"):
        assert len({n for k, n in used if k == kind}) >= 2, kind  # several phrasings of each fact in one world
    other, _ = worlds["other"]
    assert _phrasings(other) != used  # and other worlds word them differently


def test_no_fact_sheet_and_no_page_states_everything(worlds):
    the_world, tasks = worlds["world"]
    assert not any("Fact sheet" in p.text for p in the_world.pages.values())
    per_target = collections.defaultdict(list)
    for target_id, _, facts in _facts_by_page(the_world, tasks):
        per_target[target_id].append(set(facts))
    for target_id, pages in per_target.items():
        assert all(len(facts) < 6 for facts in pages)  # no page holds date, colours, pattern, emblem and trim
        assert set().union(*pages) == set(prose.FIELDS), target_id  # the live pages together do


def _seen(entity):
    a = entity.attributes
    return {"primary": a.primary, "secondary": a.secondary, "pattern": a.pattern, "trim": a.trim}


def test_look_alikes_differ_in_what_a_picture_shows(worlds):
    the_world, tasks = worlds["world"]
    kinds = collections.Counter()
    for task in tasks:
        for target_id in task.ground_truth["target_ids"]:
            target = the_world.entities[target_id]
            family = [the_world.entities[s] for s in task.ground_truth["sibling_ids"]
                      if the_world.entities[s].family == target.family]
            for sibling in family:
                differ = {k for k, v in _seen(sibling).items() if v != _seen(target)[k]}
                assert differ, (target_id, sibling.id)  # every look-alike differs in something a picture shows
                if sibling.status != "release":  # a leak or fan mock-up circulates under the target's name
                    assert sibling.name == target.name and len(differ) == 1
                    kinds[sibling.status] += 1
                elif sibling.edition == target.edition and sibling.variant == target.variant:
                    assert differ == {"trim"} and sibling.tag != target.tag  # a special edition
                    kinds["special edition"] += 1
    assert set(kinds) == {"leak", "mockup", "special edition"}


def test_tasks_count_on_a_picture_that_downloads(v2_world, worlds):
    the_world, _ = worlds["world"]
    rows = [json.loads(line) for line in (v2_world / world.TASKS_FILE).read_text().splitlines()]
    for row in rows:
        assert len(row["target_images"]) == len(row["target_ids"])
        for target_id, picture in zip(row["target_ids"], row["target_images"]):
            image = the_world.images[picture["image_url"]]
            assert image.error is None and image.kind == "photo"
            assert next(o for o in image.objects if o.entity_id == target_id).visible >= 0.9
            target = the_world.entities[target_id]
            launch = [p for p in the_world.pages.values() if p.kind == "announce" and target.name in p.title]
            assert launch and all(p.error is None for p in launch)  # the launch article stays up


def test_backgrounds_are_muted():
    assert photo._MUTED and all(photo.is_muted(c) for c in photo._MUTED[::50])
    assert not photo.is_muted(catalog.COLOURS["navy"]) and not photo.is_muted((238, 238, 238))
