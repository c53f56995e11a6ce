"""The exact reward in version-2 worlds still credits exactly the target(s), whatever each web-like feature adds."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil

import pytest

from ranger_jax import env
from ranger_jax.env import core
from ranger_jax.env.backends import base
from ranger_jax.env.backends.offline import OfflineBackend
from ranger_jax.env.sim import agents, load_tasks, load_world, prose, rewards, world
from ranger_jax.env.sim.detector import OracleDetector
from ranger_jax.env.sim.world import Attributes, Entity, Placement, World, WorldImage


@pytest.fixture(scope="module")
def setup(v2_world):
    return load_world(v2_world), load_tasks(v2_world)


def _crop(img_id: str, image: world.WorldImage, entity_id: str) -> core.ImageRecord:
    """An episode's exact crop of an entity's placement in a world picture."""
    box = next(o.box for o in image.objects if o.entity_id == entity_id)
    return core.ImageRecord(img_id=img_id, path="/unused", sha256="0" * 64, width=int(box[2] - box[0]),
                            height=int(box[3] - box[1]), root_url=image.url, root_box=box, parent_id="IMG_000")


def _judge(the_world, task, records, gen_prompt="") -> rewards.SimScore:
    answer = core.Answer(gen_prompt, tuple(core.AnswerRef(r.img_id) for r in records))
    return rewards.score(the_world, task, answer, {r.img_id: r for r in records})


def _pictures(the_world, entity_id, *, kind=None, downloads=True, unhidden=0.9):
    return [im for im in the_world.images.values() if (kind is None or im.kind == kind)
            and (im.error is None) == downloads
            and any(o.entity_id == entity_id and o.visible >= unhidden for o in im.objects)]


def _target_crop(the_world, task, target_id=None, img_id="IMG_001"):
    target_id = target_id or task.ground_truth["target_id"]
    return _crop(img_id, _pictures(the_world, target_id, kind="photo")[0], target_id)


def _task_with(the_world, tasks, predicate):
    for task in tasks:
        for sibling_id in task.ground_truth["sibling_ids"]:
            sibling = the_world.entities[sibling_id]
            if predicate(sibling) and _pictures(the_world, sibling_id, unhidden=0.6):
                return task, sibling
    raise AssertionError("no task in the world has such a look-alike in a picture")


@pytest.mark.parametrize("status", ["leak", "mockup"])
def test_leaks_and_mockups_are_not_the_target(setup, status):
    the_world, tasks = setup
    task, fake = _task_with(the_world, tasks, lambda e: e.status == status)
    target = the_world.entities[task.ground_truth["target_id"]]
    assert fake.name == target.name  # it circulates under the target's name
    fake_crop = _crop("IMG_002", _pictures(the_world, fake.id, unhidden=0.6)[0], fake.id)
    assert _judge(the_world, task, [_target_crop(the_world, task)]).search_pass
    judged = _judge(the_world, task, [fake_crop])
    assert not judged.search_pass and fake.id in judged.references[0].shown_siblings
    assert not _judge(the_world, task, [_target_crop(the_world, task), fake_crop]).search_pass
    wrong = {k: v for k, v in fake.attributes.as_dict().items() if v != target.attributes.as_dict()[k]}
    text = " ".join(target.attributes.as_dict().values())
    assert _judge(the_world, task, [], text).text_score == 1.0
    assert _judge(the_world, task, [], f"{text} {' '.join(wrong.values())}").text_score < 1.0


def test_special_editions_differ_only_in_trim_and_are_not_the_target(setup):
    the_world, tasks = setup
    task, special = _task_with(the_world, tasks, lambda e: e.status == "release" and e.tag != "" or (
        e.status == "release" and e.id.endswith("d")))
    target = the_world.entities[task.ground_truth["target_id"]]
    assert special.attributes.trim != target.attributes.trim
    assert dataclasses.replace(special.attributes, trim=target.attributes.trim) == target.attributes
    crop = _crop("IMG_002", _pictures(the_world, special.id, unhidden=0.6)[0], special.id)
    assert not _judge(the_world, task, [crop]).search_pass
    assert _judge(the_world, task, [_target_crop(the_world, task)]).search_pass
    key = " ".join(target.attributes.as_dict().values())
    assert _judge(the_world, task, [], key).text_score == 1.0
    assert _judge(the_world, task, [], f"{key} {special.attributes.trim}").text_score == 0.8  # the look-alike's trim


def test_re_hosts_count_for_what_they_show_not_their_caption(setup):
    the_world, tasks = setup
    checked = 0
    for task in tasks:
        target = the_world.entities[task.ground_truth["target_id"]]
        for image in the_world.images.values():
            if image.kind != "rehost" or image.error is not None or target.name not in image.title:
                continue
            shown = {o.entity_id for o in image.objects if o.visible >= 0.6}
            for entity_id in shown & {target.id, *task.ground_truth["sibling_ids"]}:
                judged = _judge(the_world, task, [_crop("IMG_005", image, entity_id)])
                assert judged.search_pass == (entity_id == target.id), (image.title, entity_id)
                checked += 1
    assert checked >= 2  # captions claim the target's name over look-alikes as well as over the target itself


def test_dead_links_and_failed_downloads(setup, v2_world):
    the_world, tasks = setup
    backend = OfflineBackend(v2_world)
    dead = next(p for p in the_world.pages.values() if p.error)
    broken = next(i for i in the_world.images.values() if i.error)
    with pytest.raises(base.BackendError, match=f"^{dead.error} from "):
        __import__("asyncio").run(backend.fetch_page(dead.url))
    with pytest.raises(base.BackendError, match=f"^{broken.error.split(' (')[0]}"):
        __import__("asyncio").run(backend.fetch_image(broken.url))
    task = tasks[0]
    forged = core.ImageRecord(img_id="IMG_009", path="/unused", sha256="0" * 64, width=10, height=10,
                              url=broken.url, root_url=broken.url)
    assert _judge(the_world, task, [forged]).reason == "no reference contains the target"
    assert _judge(the_world, task, [_target_crop(the_world, task)]).search_pass


def test_two_subjects_need_both_targets_and_no_look_alike(setup):
    the_world, tasks = setup
    task = next(t for t in tasks if len(t.ground_truth["target_ids"]) == 2)
    first, second = task.ground_truth["target_ids"]
    crop_a = _target_crop(the_world, task, first, "IMG_001")
    crop_b = _target_crop(the_world, task, second, "IMG_002")
    both = _judge(the_world, task, [crop_a, crop_b])
    assert both.search_pass and both.targets_shown == (first, second) and both.crop_iou == 1.0
    assert [c.target_id for c in both.references] == [first, second]
    alone = _judge(the_world, task, [crop_a])
    assert not alone.search_pass and alone.reason == f"target(s) {[second]} not shown by any reference"
    assert 0.5 <= alone.crop_iou < 1.0  # the mean over the two targets of each one's best IoU
    assert not _judge(the_world, task, [crop_b]).search_pass
    sibling = next(s for s in task.ground_truth["sibling_ids"] if the_world.entities[s].family ==
                   the_world.entities[second].family and _pictures(the_world, s, unhidden=0.6))
    look_alike = _crop("IMG_003", _pictures(the_world, sibling, unhidden=0.6)[0], sibling)
    assert not _judge(the_world, task, [crop_a, crop_b, look_alike]).search_pass
    assert not _judge(the_world, task, [crop_a, look_alike]).search_pass


def test_indirect_requests_credit_the_makers_target(setup):
    the_world, tasks = setup
    task = next(t for t in tasks if t.metadata["request_kind"] == "indirect")
    target = the_world.entities[task.ground_truth["target_id"]]
    assert target.family not in task.prompt and target.maker in task.prompt
    assert _judge(the_world, task, [_target_crop(the_world, task)]).search_pass
    previous = target.id[:-1] + "p"
    crop = _crop("IMG_002", _pictures(the_world, previous, unhidden=0.6)[0], previous)
    assert not _judge(the_world, task, [crop]).search_pass


def _hand_world(tmp_path, visible):
    kit = lambda eid, edition, pattern, trim: Entity(  # noqa: E731
        id=eid, family="Lake FC", name=f"Lake FC {edition} Home", noun="kit", subcategory="team kits",
        domain="Sports", edition=edition, variant="Home", released="2026-01-01",
        attributes=Attributes(primary="navy", secondary="white", pattern=pattern, emblem="LF26", trim=trim))
    entities = {"T": kit("T", "2026", "hoops", "lime"), "S": kit("S", "2025", "stripes", "red")}
    image = WorldImage(id="scene", url="https://m.sim/scene.jpg", file="images/scene.jpg", width=400, height=300,
                       title="scene", alt="scene", page_url="https://p.sim/a", date="2026-01-02",
                       objects=(Placement("S", (20.0, 60.0, 160.0, 260.0)),
                                Placement("T", (200.0, 60.0, 320.0, 260.0), visible=visible)))
    the_world = World(root=tmp_path, seed=0, today=dt.date(2026, 1, 9), entities=entities, pages={},
                      images={image.url: image}, version=2)
    task = core.Task("t", "the new Lake FC Home kit", ground_truth={
        "target_id": "T", "target_ids": ["T"], "sibling_ids": ["S"], "key_attributes": ["navy", "white", "hoops",
                                                                                     "LF26", "lime"],
        "sibling_only_attributes": ["LF25", "red", "stripes"]})
    return the_world, task, image


@pytest.mark.parametrize("visible, passes", [(1.0, True), (0.7, True), (0.5, False)])
def test_a_target_hidden_behind_others_is_not_shown(tmp_path, visible, passes):
    the_world, task, image = _hand_world(tmp_path, visible)
    judged = _judge(the_world, task, [_crop("IMG_001", image, "T")])
    assert judged.search_pass is passes
    assert judged.crop_iou == 1.0  # the box is the box; how much of it shows decides whether it counts


def test_judgement_reads_no_pixels_so_lighting_and_compression_do_not_matter(setup, v2_world, tmp_path):
    the_world, tasks = setup
    task = tasks[0]
    record = _target_crop(the_world, task)
    before = _judge(the_world, task, [record])
    copy = tmp_path / "copy"
    shutil.copytree(v2_world, copy)
    shutil.rmtree(copy / world.IMAGES_DIR)  # no picture file left
    assert _judge(load_world(copy), task, [record]) == before and before.search_pass


def test_ranking_noise_changes_the_search_not_the_judgement(v2_world, tmp_path):
    """The expert solves the same tasks with and without the noise, and every answer is judged by geometry."""
    quiet = tmp_path / "quiet"
    shutil.copytree(v2_world, quiet)
    meta = json.loads((quiet / world.WORLD_FILE).read_text())
    (quiet / world.WORLD_FILE).write_text(json.dumps({**meta, "ranking_noise": 0.0}))
    for root in (v2_world, quiet):
        the_world, tasks = load_world(root), load_tasks(root)
        with env.make("offline", world=str(root)) as tool_env:
            for task in tasks[:3]:
                state = agents.run_episode(tool_env, task, agents.ExpertAgent(OracleDetector(the_world)))
                judged = rewards.score(the_world, task, state.answer, state.images)
                assert judged.search_pass, (root, task.id, judged.reason)
                shown = {c.target_id for c in judged.references if c.shows_target}
                assert shown == set(task.ground_truth["target_ids"])


def test_hedged_pages_never_speak_for_the_release(setup):
    the_world, tasks = setup
    for page in the_world.pages.values():
        if page.kind in ("rumour", "concept"):
            assert prose.is_hedged(page.text), page.title
        elif page.kind in ("announce", "coverage", "review", "comparison", "catalogue", "sale"):
            assert not prose.is_hedged(page.text), page.title
