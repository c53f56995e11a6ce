"""The world generator (version 1 here; version 2 in test_v2_world): determinism, byte-identity with the first
generator, layout, the three difficulties, visible identity, and every error."""

from __future__ import annotations

import collections
import datetime as dt
import hashlib
import json
import random

import pytest
from PIL import Image

from ranger_jax.env import core
from ranger_jax.env.sim import build, catalog, load_tasks, load_world, plan, world


# Worlds built by the generator before version 2 existed (same seed and task count), hashed file by file: a
# world_version=1 build must reproduce them byte for byte.
FIRST_GENERATOR = {(0, 3): "461a721b9dcb472b646a58c86e7775f03b9a7c6a3fb5cd0cd7de0caa52d26f1d",
                   (7, 4): "693cef6b4a5b0bb4487f4564641515bd9610a9c14f50e73411fff576990c02a9",
                   (424242, 2): "35864c5d6216d3b356f789df37a7379568c9593b3c590c3655290cd03f076282"}


def _files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def world_hash(root):
    """SHA-256 over every file's relative path and content hash, in path order."""
    digest = hashlib.sha256()
    for name, data in _files(root).items():
        digest.update(name.encode())
        digest.update(hashlib.sha256(data).digest())
    return digest.hexdigest()


# Version-2 worlds as the generator wrote them on 2026-12-07 (before tasks.jsonl's reference pictures came from a
# per-entity index instead of a scan of every picture per target): refactors of the builder keep these bytes.
VERSION_TWO = {(3, 5): "98aff3631e5f39e4810d2a9c07697a85edf3f2ead2e05ce404ccc018e928606d",
               (11, 12): "38f1dfeda577bb59ce5b96e2fd01bf6e0bcddcfd91440c1af06c4a1dbb771d90"}


@pytest.mark.parametrize("seed, num_tasks", sorted(FIRST_GENERATOR))
def test_version_one_reproduces_the_first_generator_byte_for_byte(tmp_path, seed, num_tasks):
    root = build.build_world(tmp_path / "w", num_tasks, seed, world_version=1)
    assert world_hash(root) == FIRST_GENERATOR[(seed, num_tasks)]
    meta = world.read_meta(root)
    assert meta["version"] == 1 and "world_version" not in meta  # an old world reads as version 1
    assert load_world(root).version == 1


# A version-1 world large enough for scenes to draw distractors from many families, as the generator wrote it on
# 2026-12-07 before those draws came from `plan.EntityTable` instead of a scan of every entity per scene.
VERSION_ONE_SCENES = {(2026, 40): "1ec7aaf8ccc5e13ee654ece29d410644a2daef9b414902dc1bee32f94476193f"}


@pytest.mark.parametrize("seed, num_tasks", sorted(VERSION_ONE_SCENES))
def test_version_one_scenes_keep_their_bytes(tmp_path, seed, num_tasks):
    root = build.build_world(tmp_path / "w", num_tasks, seed, world_version=1)
    assert world_hash(root) == VERSION_ONE_SCENES[(seed, num_tasks)]


def test_entity_table_finds_what_a_scan_of_the_entities_finds():
    rng = random.Random(5)
    everyone = plan.plan_world(30, random.Random(11)).entities
    table = plan.EntityTable(everyone)
    dates = sorted({e.released for e in everyone})
    for _ in range(200):
        main, date = rng.choice(everyone), rng.choice(dates)
        items = [main, *rng.sample(everyone, rng.randint(0, 3))]
        scan = [e for e in everyone if e.family != main.family and e.released <= date]
        found = table.released_elsewhere(main.family, date)
        assert [everyone[i] for i in found] == scan
        assert [everyone[i] for i in table.without(found, items)] == [e for e in scan if e not in items]
    assert table.released_elsewhere("No Such Family", "0000-00-00").size == 0


@pytest.mark.parametrize("seed, num_tasks", sorted(VERSION_TWO))
def test_version_two_keeps_its_bytes(tmp_path, seed, num_tasks):
    assert world_hash(build.build_world(tmp_path / "w", num_tasks, seed)) == VERSION_TWO[(seed, num_tasks)]


def test_same_seed_is_byte_identical_and_other_seed_differs(tmp_path, small_world):
    again = build.build_world(tmp_path / "again", 6, 7, world_version=1)
    first, second = _files(small_world), _files(again)
    assert sorted(first) == sorted(second)
    assert all(first[name] == second[name] for name in first), [n for n in first if first[n] != second[n]]
    other = _files(build.build_world(tmp_path / "other", 6, 8, world_version=1))
    assert other[world.TASKS_FILE] != first[world.TASKS_FILE]


def test_rebuild_replaces_a_world_without_leftovers(tmp_path):
    out = tmp_path / "w"
    build.build_world(out, 3, 1, world_version=1)
    build.build_world(out, 1, 2)  # a version-2 world replaces it: JPEG files, none for failed downloads
    meta = world.read_meta(out)
    assert meta["seed"] == 2 and meta["num_tasks"] == 1
    served = [i for i in load_world(out).images.values() if i.error is None]
    assert sorted(p.name for p in (out / world.IMAGES_DIR).iterdir()) == sorted(f"{i.id}.jpg" for i in served)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folders left


def test_layout_and_loaders(hard_world):
    meta = world.read_meta(hard_world)
    the_world = load_world(hard_world)
    tasks = load_tasks(hard_world)
    assert meta["num_tasks"] == len(tasks) == 32
    assert len(the_world.pages) == meta["num_pages"] and len(the_world.images) == meta["num_images"]
    assert {t.metadata["subcategory"] for t in tasks} == {sc.name for sc in catalog.SUBCATEGORIES}
    assert {t.metadata["domain"] for t in tasks} == set(catalog.DOMAINS)
    assert len(catalog.SUBCATEGORIES) == 16
    for task in tasks:
        assert isinstance(task, core.Task)
        assert dt.date.fromisoformat(task.metadata["today"]) == the_world.today
        truth = task.ground_truth
        target = the_world.entities[truth["target_id"]]
        image = the_world.images[truth["image_url"]]
        assert (hard_world / truth["image_file"]).is_file()
        placed = [o.box for o in image.objects if o.entity_id == target.id]
        assert placed == [tuple(float(v) for v in truth["bbox"])]
        assert truth["key_attributes"] == list(target.attributes.as_dict().values())
        assert truth["target_name"] in task.prompt or target.family in task.prompt


def test_temporal_novelty(hard_world):
    the_world, tasks = load_world(hard_world), load_tasks(hard_world)
    pages_of = collections.Counter()
    for page in the_world.pages.values():
        for entity in the_world.entities.values():
            if f"{entity.name} {entity.noun}" in page.text:
                pages_of[entity.id] += 1
    images_of = collections.Counter(o.entity_id for im in the_world.images.values() for o in im.objects)
    fewer_pages = fewer_images = 0
    for task in tasks:
        target = the_world.entities[task.ground_truth["target_id"]]
        previous = target.id[:-1] + "p"
        age = (the_world.today - dt.date.fromisoformat(target.released)).days
        assert 2 <= age <= 20
        assert all(the_world.entities[s].released <= target.released or s.endswith("v")
                   for s in task.ground_truth["sibling_ids"])
        fewer_pages += pages_of[target.id] < pages_of[previous]
        fewer_images += images_of[target.id] < images_of[previous]
    assert fewer_pages >= 0.9 * len(tasks) and fewer_images >= 0.9 * len(tasks)
    # no picture shows a thing before it was released, no page predates what it is about
    for image in the_world.images.values():
        assert all(the_world.entities[o.entity_id].released <= image.date for o in image.objects)


def test_semantic_crowding_siblings_differ_visibly(hard_world):
    the_world, tasks = load_world(hard_world), load_tasks(hard_world)
    for task in tasks:
        target = the_world.entities[task.ground_truth["target_id"]]
        for sibling_id in task.ground_truth["sibling_ids"]:
            sibling = the_world.entities[sibling_id]
            assert sibling.family == target.family
            mine, theirs = target.attributes, sibling.attributes
            assert theirs != mine
            if sibling.edition == target.edition:  # other variant: other colours
                assert theirs.primary != mine.primary
            else:  # previous editions: other pattern and emblem
                assert theirs.pattern != mine.pattern and theirs.emblem != mine.emblem
        assert task.ground_truth["sibling_only_attributes"]
        assert not set(task.ground_truth["sibling_only_attributes"]) & set(task.ground_truth["key_attributes"])


def test_spatial_entanglement(hard_world):
    the_world, tasks = load_world(hard_world), load_tasks(hard_world)
    target_ids = {t.ground_truth["target_id"] for t in tasks}
    shots = [im for im in the_world.images.values() if any(o.entity_id in target_ids for o in im.objects)]
    scenes = [im for im in shots if len(im.objects) >= 2]
    assert len(scenes) >= 0.7 * len(shots)
    with_sibling = 0
    for task in tasks:
        truth = task.ground_truth
        for im in scenes:
            ids = {o.entity_id for o in im.objects}
            if truth["target_id"] in ids:
                target_box = next(o.box for o in im.objects if o.entity_id == truth["target_id"])
                assert world.box_area(target_box) < 0.3 * im.width * im.height  # a detail of the scene
                with_sibling += bool(ids & set(truth["sibling_ids"]))
    assert with_sibling >= len(tasks) // 2


def test_identity_is_visible_in_pixels(hard_world):
    the_world, task = load_world(hard_world), load_tasks(hard_world)[0]
    truth = task.ground_truth
    target = the_world.entities[truth["target_id"]]
    picture = Image.open(hard_world / truth["image_file"]).convert("RGB")
    region = picture.crop(tuple(int(v) for v in truth["bbox"]))
    colours = collections.Counter(region.getdata())
    for name in (target.attributes.primary, target.attributes.secondary):
        rgb = catalog.COLOURS[name]
        assert colours[rgb] > 0.02 * region.width * region.height, name
    sibling = the_world.entities[truth["sibling_ids"][0]]
    sibling_shots = [im for im in the_world.images.values() if [o.entity_id for o in im.objects] == [sibling.id]]
    other = Image.open(hard_world / sibling_shots[0].file).convert("RGB")
    box = sibling_shots[0].objects[0].box
    assert other.crop(tuple(int(v) for v in box)).resize(region.size).tobytes() != region.tobytes()


def test_cli_writes_a_world(tmp_path, capsys):
    build.main(["--out", str(tmp_path / "cli"), "--tasks", "2", "--seed", "5"])
    assert "world version 2" in capsys.readouterr().out and world.read_meta(tmp_path / "cli")["world_version"] == 2
    assert len(load_tasks(tmp_path / "cli")) == 2
    build.main(["--out", str(tmp_path / "cli1"), "--tasks", "2", "--seed", "5", "--world-version", "1",
                "--split", "heldout"])
    assert "world version 1" in capsys.readouterr().out
    assert world.read_meta(tmp_path / "cli1")["split"] == "heldout"


@pytest.mark.parametrize("argv, match", [
    (["--tasks", "0"], "--tasks must be in 1..5000, got 0"),
    (["--tasks", "-3"], "--tasks must be in 1..5000, got -3"),
    (["--out", "FILE"], "--out must be a folder, and "),
    (["--out", "BUSY"], "--out must be a new or empty folder or an offline world; "),
    (["--world-version", "3"], "--world-version: invalid choice: 3"),
    (["--split", "test"], "--split: invalid choice: 'test'"),
])
def test_cli_errors_are_usage_errors(tmp_path, capsys, argv, match):
    (tmp_path / "FILE").write_text("x")
    (tmp_path / "BUSY").mkdir()
    (tmp_path / "BUSY" / "notes.txt").write_text("keep me")
    argv = [str(tmp_path / a) if a in ("FILE", "BUSY") else a for a in argv]
    with pytest.raises(SystemExit) as info:
        build.main(["--out", str(tmp_path / "w"), *argv])
    assert info.value.code == 2 and match in capsys.readouterr().err
    assert (tmp_path / "BUSY" / "notes.txt").read_text() == "keep me" and not (tmp_path / "w").exists()


def test_image_rows_record_the_file_hash(small_world):
    the_world = load_world(small_world)
    for image in the_world.images.values():
        assert image.sha256 == hashlib.sha256((small_world / image.file).read_bytes()).hexdigest()


def test_build_errors_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match=r"^num_tasks must be in 1\.\.5000, got 0$"):
        build.build_world(tmp_path / "w", 0, 1)
    with pytest.raises(ValueError, match=r"^world_version must be one of \[1, 2\]; got 3$"):
        build.build_world(tmp_path / "w", 1, 1, world_version=3)
    with pytest.raises(ValueError, match=r"^split must be one of \['train', 'heldout'\] or None; got 'test'$"):
        build.build_world(tmp_path / "w", 1, 1, split="test")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"^out must be a folder, and .*file is a file$"):
        build.build_world(tmp_path / "file", 1, 1)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match=r"^out must be a new or empty folder or an offline world; .*busy holds"):
        build.build_world(tmp_path / "busy", 1, 1)
    assert (tmp_path / "busy" / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "file"]  # nothing staged


def test_loader_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not an offline world"):
        load_world(tmp_path)
    root = build.build_world(tmp_path / "w", 1, 3, world_version=1)
    tasks_text = (root / world.TASKS_FILE).read_text()
    (root / world.TASKS_FILE).write_text(tasks_text + "{not json\n")
    with pytest.raises(ValueError, match=r"tasks.jsonl:2 is not valid JSON"):
        load_tasks(root)
    row = json.loads(tasks_text)
    del row["bbox"]
    (root / world.TASKS_FILE).write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="has no 'bbox' field"):
        load_tasks(root)
    images_text = (root / world.IMAGES_FILE).read_text()
    (root / world.IMAGES_FILE).write_text(images_text.replace('"entity_id":"e0000t"', '"entity_id":"e9999x"'))
    with pytest.raises(ValueError, match="places unknown entity 'e9999x'"):
        load_world(root)
    (root / world.IMAGES_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="images.jsonl is missing"):
        load_world(root)
    meta = json.loads((root / world.WORLD_FILE).read_text())
    (root / world.WORLD_FILE).write_text(json.dumps({**meta, "version": 99}))
    with pytest.raises(ValueError, match=r"format version 99, expected one of \[1, 2\]"):
        load_world(root)
    (root / world.WORLD_FILE).write_text(json.dumps({**meta, "world_version": 7}))
    with pytest.raises(ValueError, match="world_version 7"):
        load_world(root)
    with pytest.raises(KeyError, match="no image with url 'https://nowhere.sim/x.png'"):
        load_world(build.build_world(tmp_path / "w2", 1, 3)).image_path("https://nowhere.sim/x.png")
