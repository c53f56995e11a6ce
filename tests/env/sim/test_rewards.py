"""Exact sim judgement on a hand-built world: crops of the target pass, siblings and whole scenes fail."""

from __future__ import annotations

import pytest

from ranger_jax.env import core
from ranger_jax.env.sim import rewards
from ranger_jax.env.sim.world import Attributes, Entity, Placement, World, WorldImage, box_iou

T_BOX = (40.0, 100.0, 140.0, 220.0)  # 100 x 120 in a 400 x 300 scene
S_BOX = (160.0, 100.0, 260.0, 220.0)
D_BOX = (280.0, 120.0, 360.0, 220.0)


def _entity(eid, family, edition, variant, primary, secondary, pattern, emblem):
    return Entity(id=eid, family=family, name=f"{family} {edition} {variant}", noun="kit", subcategory="team kits",
                  domain="Sports", edition=edition, variant=variant, released="2026-01-01",
                  attributes=Attributes(primary=primary, secondary=secondary, pattern=pattern, emblem=emblem))


def _image(name, size, objects):
    return WorldImage(id=name, url=f"https://m.sim/{name}.png", file=f"images/{name}.png", width=size[0],
                      height=size[1], title=name, alt=name, page_url="https://p.sim/a", date="2026-01-02",
                      objects=tuple(Placement(e, b) for e, b in objects))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    entities = {
        "T": _entity("T", "Lake FC", "2026", "Home", "navy", "yellow", "hoops", "LF26"),
        "S": _entity("S", "Lake FC", "2025", "Home", "navy", "yellow", "stripes", "LF25"),
        "V": _entity("V", "Lake FC", "2026", "Away", "red", "white", "hoops", "LF26"),
        "D": _entity("D", "Hill Rovers", "2026", "Home", "green", "black", "dots", "HR26"),
    }
    images = [
        _image("scene", (400, 300), [("T", T_BOX), ("S", S_BOX), ("D", D_BOX)]),
        _image("clean", (300, 300), [("T", (30.0, 30.0, 270.0, 270.0))]),
        _image("sibling", (300, 300), [("S", (30.0, 30.0, 270.0, 270.0))]),
        _image("other", (300, 300), [("D", (30.0, 30.0, 270.0, 270.0))]),
    ]
    the_world = World(root=tmp_path_factory.mktemp("hand"), seed=0, today=__import__("datetime").date(2026, 1, 9),
                      entities=entities, pages={}, images={im.url: im for im in images})
    task = core.Task("t", "the new Lake FC Home kit", ground_truth={
        "target_id": "T", "sibling_ids": ["S", "V"], "key_attributes": ["navy", "yellow", "hoops", "LF26"],
        "sibling_only_attributes": ["LF25", "red", "stripes", "white"]})
    return the_world, task


def _record(img_id, name, size, root_box=None):
    url = f"https://m.sim/{name}.png"
    return core.ImageRecord(img_id=img_id, path="/unused", sha256="0" * 64, width=size[0], height=size[1],
                            url=None if root_box else url, root_url=url, root_box=root_box)


def _score(setup, records, gen_prompt="navy yellow hoops LF26", **kwargs):
    the_world, task = setup
    answer = core.Answer(gen_prompt, tuple(core.AnswerRef(r.img_id) for r in records))
    return rewards.score(the_world, task, answer, {r.img_id: r for r in records}, **kwargs)


def test_exact_crop_of_the_target_passes_with_iou_one(setup):
    s = _score(setup, [_record("IMG_002", "scene", (100, 120), T_BOX)])
    assert s.search_pass and s.crop_iou == pytest.approx(1.0) and s.text_score == 1.0
    assert s.references[0].shows_target and s.references[0].target_share == pytest.approx(1.0)
    assert "IMG_002 shows the target" in s.reason


def test_loose_crop_passes_with_its_iou(setup):
    region = (50.0, 100.0, 150.0, 220.0)  # shifted by 10 px: 90 x 120 overlap
    s = _score(setup, [_record("IMG_002", "scene", (100, 120), region)])
    assert s.search_pass
    assert s.crop_iou == pytest.approx(10800 / 13200)
    assert s.references[0].target_coverage == pytest.approx(0.9)


def test_crop_of_a_sibling_fails(setup):
    s = _score(setup, [_record("IMG_002", "scene", (100, 120), S_BOX)])
    assert not s.search_pass and s.crop_iou == 0.0
    assert s.references[0].shown_siblings == ("S",)
    assert "sibling" in s.reason


def test_product_shot_of_a_sibling_fails(setup):
    s = _score(setup, [_record("IMG_001", "sibling", (300, 300))])
    assert not s.search_pass and "sibling(s) ['S']" in s.reason


def test_whole_crowded_scene_fails(setup):
    s = _score(setup, [_record("IMG_001", "scene", (400, 300))])
    assert not s.search_pass
    check = s.references[0]
    assert check.target_coverage == 1.0 and check.target_share == pytest.approx(0.1)
    assert s.crop_iou == pytest.approx(box_iou((0, 0, 400, 300), T_BOX))
    assert "target not isolated" in s.reason


def test_product_shot_of_the_target_passes_uncropped(setup):
    s = _score(setup, [_record("IMG_001", "clean", (300, 300))])
    assert s.search_pass and s.crop_iou == pytest.approx(240 * 240 / 300 / 300)


def test_crop_holding_target_and_sibling_fails(setup):
    s = _score(setup, [_record("IMG_002", "scene", (220, 120), (40.0, 100.0, 260.0, 220.0))])
    check = s.references[0]
    assert not check.shows_target and check.rival_ratio == pytest.approx(1.0)
    assert not s.search_pass


def test_half_of_the_target_is_not_enough(setup):
    s = _score(setup, [_record("IMG_002", "scene", (50, 120), (40.0, 100.0, 90.0, 220.0))])
    assert s.references[0].target_coverage == pytest.approx(0.5)
    assert not s.search_pass


def test_a_sibling_reference_spoils_a_good_one(setup):
    good = _record("IMG_002", "scene", (100, 120), T_BOX)
    bad = _record("IMG_003", "sibling", (300, 300))
    assert not _score(setup, [good, bad]).search_pass


def test_every_reference_of_the_answer_counts(setup):
    """The parser keeps at most max_answer_refs references; all of them are judged (a fifth one too)."""
    others = [_record(f"IMG_00{i}", "other", (300, 300)) for i in (1, 3, 4, 6)]
    good = _record("IMG_005", "scene", (100, 120), T_BOX)
    s = _score(setup, [*others, good])
    assert s.search_pass and [c.img_id for c in s.references] == ["IMG_001", "IMG_003", "IMG_004", "IMG_006",
                                                                  "IMG_005"]
    assert not _score(setup, [*others, good, _record("IMG_007", "sibling", (300, 300))]).search_pass


def test_criteria_from_reward_settings():
    assert rewards.Criteria.from_settings({"coverage_min": 0.5, "text_coef": 0.5, "kind": "sim"}) == \
        rewards.Criteria(coverage_min=0.5)
    assert rewards.Criteria.from_settings({}) == rewards.Criteria()


def test_unknown_ids_and_foreign_images_show_nothing(setup):
    the_world, task = setup
    answer = core.Answer("x", (core.AnswerRef("IMG_009"),))
    s = rewards.score(the_world, task, answer, {})
    assert not s.search_pass and s.references[0].root_url is None
    foreign = core.ImageRecord("IMG_001", "/x", "0" * 64, 10, 10, url="https://web.example/a.png",
                               root_url="https://web.example/a.png")
    s = rewards.score(the_world, task, core.Answer("x", (core.AnswerRef("IMG_001"),)), {"IMG_001": foreign})
    assert not s.search_pass and s.reason == "no reference contains the target"


def test_no_answer_scores_zero(setup):
    the_world, task = setup
    s = rewards.score(the_world, task, None, {})
    assert (s.search_pass, s.crop_iou, s.text_score, s.reason) == (False, 0.0, 0.0, "no answer")
    assert s.key_attributes_missing == ("navy", "yellow", "hoops", "LF26")
    s = _score(setup, [])
    assert s.reason == "no reference images"


def test_text_score():
    key, sibling = ["navy", "yellow", "hoops", "LF26"], ["LF25", "stripes", "red", "white"]
    assert rewards.text_match("Navy kit, YELLOW hoops, LF26 crest", key, sibling)[0] == 1.0
    score, present, missing, mentioned = rewards.text_match("a navy kit with hoops", key, sibling)
    assert score == 0.5 and present == ("navy", "hoops") and missing == ("yellow", "LF26")
    score, _, _, mentioned = rewards.text_match("navy yellow hoops LF26, unlike the LF25 stripes", key, sibling)
    assert score == 0.5 and mentioned == ("LF25", "stripes")
    assert rewards.text_match("LF250 navyblue", key, sibling)[0] == 0.0  # whole words only
    assert rewards.text_match("red stripes white LF25", key, sibling)[0] == 0.0  # clipped at 0
    # key phrases are matched first and masked: a sibling's "blue" is not found inside a key "sky blue"
    assert rewards.text_match("a sky blue shirt", ["sky blue"], ["blue"])[3] == ()
    assert rewards.text_match("sky blue and blue", ["sky blue"], ["blue"])[3] == ("blue",)


def test_errors(setup):
    the_world, task = setup
    with pytest.raises(ValueError, match="task 'x' has no offline-world ground truth"):
        rewards.score(the_world, core.Task("x", "p"), None, {})
    with pytest.raises(ValueError, match=r"task 'y' ground truth lacks \['sibling_ids'"):
        rewards.score(the_world, core.Task("y", "p", ground_truth={"target_id": "T"}), None, {})
    bad = core.Task("z", "p", ground_truth={**task.ground_truth, "sibling_ids": ["Q"]})
    with pytest.raises(ValueError, match="names entity 'Q', which is not in the world"):
        rewards.score(the_world, bad, None, {})
    with pytest.raises(ValueError, match=r"Criteria.share_min must be in \(0, 1\]"):
        rewards.Criteria(share_min=0.0)
