"""The pixel-only object finder and the find_object tool, checked against the world's own annotations: drawn
pictures (version-1 worlds) and photographs (lit, JPEG-compressed version-2 worlds)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw
from scipy import ndimage

from ranger_jax import env
from ranger_jax.env import perception
from ranger_jax.env.sim import agents, catalog, render, world
from ranger_jax.env.sim.finder_agent import FinderAgent, SnippetAgent
from ranger_jax.env.sim.world import box_iou

TOOLS = ["text_search", "image_search", "web_fetch", "find_object"]


def test_finds_a_painted_box_among_others():
    image = Image.new("RGB", (120, 80), (150, 160, 170))
    draw = ImageDraw.Draw(image)
    draw.rectangle((10, 10, 49, 69), fill=catalog.COLOURS["green"])
    for y in range(12, 68, 8):
        draw.rectangle((10, y, 49, y + 3), fill=catalog.COLOURS["orange"])  # hoops
    draw.rectangle((60, 10, 109, 69), fill=catalog.COLOURS["navy"])
    found = perception.find_objects(image, catalog.COLOURS, ["green", "orange"])
    assert len(found) == 1
    assert found[0].box == (10, 10, 50, 70)
    assert perception.find_objects(image, catalog.COLOURS, ["red", "orange"]) == []


def test_unknown_colour_or_pattern_is_named():
    image = Image.new("RGB", (20, 20))
    with pytest.raises(ValueError, match="'mauve'"):
        perception.find_objects(image, catalog.COLOURS, ["mauve"])
    with pytest.raises(ValueError, match="'zigzag'"):
        perception.find_objects(image, catalog.COLOURS, ["red"], pattern="zigzag", patterns=render.pattern_drawers())
    finder = perception.ObjectFinder(palette=catalog.COLOURS)
    with pytest.raises(ValueError, match="names no colour"):
        finder.parse("a shiny thing")


def test_description_parsing_keeps_order_and_pattern():
    finder = perception.ObjectFinder(palette=catalog.COLOURS, patterns=render.pattern_drawers())
    assert finder.parse("Navy with WHITE stripes, navy trim") == (["navy", "white"], "stripes")
    assert finder.parse("maroon chevrons against a lime ground") == (["lime", "maroon"], "chevrons")
    assert finder.parse("a pink body covered in black dots") == (["pink", "black"], "dots")


def test_locates_world_targets_from_pixels(small_world):
    """On the world's pictures the top match for the target's colours and pattern is the target's box."""
    root, the_world, tasks = small_world
    finder = perception.ObjectFinder(palette=catalog.COLOURS, patterns=render.pattern_drawers())
    hits = total = 0
    for task in tasks:
        target = the_world.entities[task.ground_truth["target_id"]]
        look = f"{target.attributes.primary} with {target.attributes.secondary} {target.attributes.pattern}"
        for image in the_world.images.values():
            boxes = {o.entity_id: o.box for o in image.objects}
            if target.id not in boxes:
                continue
            found = finder.find(Image.open(root / image.file), look)
            total += 1
            hits += bool(found) and box_iou(found[0].box, boxes[target.id]) >= 0.5
    assert total >= 10
    assert hits / total >= 0.75, (hits, total)


def test_find_object_tool_crops_the_match_and_finder_agent_scores(small_world):
    root, the_world, tasks = small_world
    with env.make("offline", world=str(root), tools=TOOLS, prompt_style="compact") as tool_env:
        assert "find_object(description, img_ids?)" in tool_env.reset(tasks[0]).messages[0]["content"]
        state = tool_env.reset(tasks[0])
        state, _ = tool_env.step(state, agents.tool_call("find_object", {"description": "red"}, "x"))
        assert "run image_search first" in state.messages[-1]["content"]
        state, _ = tool_env.step(state, agents.tool_call("find_object", {"description": "shiny"}, "x"))
        assert "names no colour" in state.messages[-1]["content"]
        passed = 0
        from ranger_jax.env.sim import rewards
        for task in tasks:
            final = agents.run_episode(tool_env, task, FinderAgent())
            passed += rewards.score(the_world, task, final.answer, final.images).search_pass
    assert passed / len(tasks) >= 0.6, passed


def test_snippet_agent_uses_three_tools_and_passes_some(small_world):
    root, the_world, tasks = small_world
    from ranger_jax.env.sim import rewards
    passed = 0
    with env.make("offline", world=str(root), tools=["text_search", "image_search", "find_object"],
                  prompt_style="compact") as tool_env:
        for task in tasks:
            final = agents.run_episode(tool_env, task, SnippetAgent())
            assert final.num_tool_calls == 3 and final.termination == "answer"
            passed += rewards.score(the_world, task, final.answer, final.images).search_pass
    assert passed / len(tasks) >= 0.4, passed


def test_find_object_needs_a_backend_that_can_see():
    from ranger_jax.env import config as config_lib
    from ranger_jax.env import tool_env

    class Blind:
        async def aclose(self):
            return None

    with pytest.raises(ValueError, match="find_object"):
        tool_env.ToolEnv(Blind(), config_lib.EnvConfig(tools=tuple(TOOLS)))


@pytest.fixture(scope="module")
def small_world(tmp_path_factory):
    from ranger_jax.env.sim import build

    root = tmp_path_factory.mktemp("finder") / "world"
    build.build_world(root, num_tasks=8, seed=11, world_version=1)
    return root, world.load_world(root), world.load_tasks(root)


@pytest.fixture(scope="module")
def photo_world(tmp_path_factory):
    from ranger_jax.env.sim import build

    root = build.build_world(tmp_path_factory.mktemp("finder") / "photos", num_tasks=6, seed=11)
    return root, world.load_world(root), world.load_tasks(root)


def test_accuracy_report_on_a_world(small_world):
    root, the_world, _ = small_world
    finder = perception.ObjectFinder(palette=catalog.COLOURS, patterns=render.pattern_drawers())
    report = perception.accuracy_on_world(the_world, root, finder)
    assert report["images"] >= 10
    assert report["top_match_iou50"] >= 0.8 and report["crop_passes"] >= 0.8


def test_snippet_agent_can_search_the_request_verbatim(small_world):
    root, the_world, tasks = small_world
    with env.make("offline", world=str(root), tools=["text_search", "image_search", "find_object"],
                  prompt_style="compact", show_links=False) as tool_env:
        final = agents.run_episode(tool_env, tasks[0], SnippetAgent(query="request"))
    assert tasks[0].prompt.rstrip(".") in final.messages[2]["content"]
    assert "](" not in final.messages[3]["content"][0]["text"] if not isinstance(final.messages[3]["content"], str) \
        else "](" not in final.messages[3]["content"]
    with pytest.raises(ValueError, match="'names'"):
        SnippetAgent(query="names")


def _drawn_scene() -> Image.Image:
    """Two navy-and-white hooped panels, alike but for their trim (lime left, orange right), and a red one."""
    image = Image.new("RGB", (240, 120), (150, 140, 110))
    for x0, trim in ((10, "lime"), (110, "orange")):
        from ranger_jax.env.sim.world import Attributes, Entity

        entity = Entity(id="x", family="F", name="F", noun="kit", subcategory="team kits", domain="Sports",
                        edition="1", variant="Home", released="2026-01-01",
                        attributes=Attributes(primary="navy", secondary="white", pattern="hoops", emblem="F1",
                                              trim=trim))
        render.draw_entity(image, entity, "car", (x0, 40, x0 + 90, 90))
    ImageDraw.Draw(image).rectangle((210, 20, 235, 100), fill=catalog.COLOURS["red"])
    return image


def _photograph(image: Image.Image, gains: tuple[float, float, float], quality: int = 70) -> Image.Image:
    """`image` under per-channel gains, through a JPEG round trip (the independent reference for the light)."""
    import io

    import numpy as np

    lit = np.clip(np.rint(np.asarray(image, dtype=np.float64) * np.asarray(gains)), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(lit).save(buffer, "JPEG", quality=quality)
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def _swatches() -> Image.Image:
    """Every painted colour as a 30 x 30 patch on a muted ground."""
    image = Image.new("RGB", (8 * 40, 2 * 40 + 10), (120, 128, 120))
    draw = ImageDraw.Draw(image)
    for i, rgb in enumerate(catalog.COLOURS.values()):
        x, y = 5 + 40 * (i % 8), 5 + 40 * (i // 8)
        draw.rectangle((x, y, x + 29, y + 29), fill=rgb)
    return image


@pytest.mark.parametrize("gains", [(0.82, 0.8, 0.78), (1.0, 1.0, 1.0), (1.12, 1.08, 1.1)])
def test_the_light_of_a_photograph_is_estimated(gains):
    import numpy as np

    picture = _photograph(_swatches(), gains)
    pixels = np.asarray(picture, dtype=np.int16)
    assert perception.is_photograph(pixels) and not perception.is_photograph(np.asarray(_drawn_scene()))
    # within 5 %: at most about 12 levels on a bright colour, well inside PHOTO_TOLERANCE
    assert np.allclose(perception.estimate_light(pixels, catalog.COLOURS), gains, atol=0.05)


def test_a_trim_tells_look_alikes_apart_and_outlines_the_whole_object():
    finder = perception.ObjectFinder(palette=catalog.COLOURS, patterns=render.pattern_drawers(),
                                     trim_inset=render.trim_width)
    picture = _photograph(_drawn_scene(), (0.9, 0.88, 0.93))
    assert finder.parse_trim("navy with white hoops, orange trim") == "orange"
    assert finder.parse_trim("navy with a plain finish with white trim") is None  # a version-1 look, no third colour
    cars = {"lime": (10, 40, 100, 90), "orange": (110, 40, 200, 90)}
    for trim, car in cars.items():
        best = finder.find(picture, f"navy with white hoops, {trim} trim")[0]
        assert best.trim == trim and best.pattern == "hoops"
        x0, y0, x1, y1 = finder.crop_box(best, picture.width, picture.height)
        region = (x0 * picture.width, y0 * picture.height, x1 * picture.width, y1 * picture.height)
        for other, box in cars.items():  # the crop holds this car (roof included: not navy or white), not the other
            covered = world.box_area(world.box_intersection(box, region)) / world.box_area(box)
            assert covered >= 0.8 if other == trim else covered < 0.3, (trim, other, covered)


def test_locates_version_two_targets_from_photographs(photo_world):
    root, the_world, tasks = photo_world
    finder = perception.ObjectFinder(palette=catalog.COLOURS, patterns=render.pattern_drawers(),
                                     trim_inset=render.trim_width)
    hits = total = 0
    for task in tasks:
        for target_id in task.ground_truth["target_ids"]:
            look = the_world.entities[target_id].attributes
            for image in the_world.images.values():
                boxes = {o.entity_id: o.box for o in image.objects if o.visible >= 0.9}
                if target_id not in boxes:
                    continue
                found = finder.find(Image.open(root / image.file), f"{look.primary} with {look.secondary} "
                                                                  f"{look.pattern}, {look.trim} trim")
                total += 1
                hits += bool(found) and box_iou(found[0].box, boxes[target_id]) >= 0.5
    assert total >= 10
    assert hits / total >= 0.75, (hits, total)


def test_date_prompt_is_only_todays_date_and_the_tools_still_work(small_world):
    root, _, tasks = small_world
    with env.make("offline", world=str(root), tools=TOOLS, prompt_style="date") as tool_env:
        state = tool_env.reset(tasks[0])
        system = state.messages[0]["content"]
        assert system.startswith("Today's date: ") and "\n" not in system and "find_object" not in system
        state, _ = tool_env.step(state, agents.tool_call("find_object", {"description": "red"}, "x"))
        assert "run image_search first" in state.messages[-1]["content"]
    with pytest.raises(ValueError, match="'full', 'compact' or 'date'"):
        env.make("offline", world=str(root), tools=TOOLS, prompt_style="tiny")


def test_fast_pixel_kernels_equal_their_reference_formulas():
    """`_close`, `_distance` and `_colour_mask` are rewritten for speed; each must give exactly what the plain
    numpy / scipy formula gives, borders included."""
    rng = np.random.default_rng(3)
    for _ in range(60):
        h, w = (int(n) for n in rng.integers(3, 90, 2))
        mask = rng.random((h, w)) < rng.random()
        expected = ndimage.binary_closing(mask, structure=np.ones((5, 5), bool), iterations=1)
        np.testing.assert_array_equal(perception._close(mask, 5), expected)
        values = rng.uniform(0, 300, (h, w, 3)).astype(np.float32)
        rgb = tuple(int(c) for c in rng.integers(0, 256, 3))
        np.testing.assert_array_equal(perception._distance(perception._planes(values), rgb),
                                      np.abs(values - np.asarray(rgb, np.float32)).max(axis=-1))
        pixels = rng.integers(0, 256, (h, w, 3)).astype(np.int16)
        tolerance = int(rng.integers(0, 40))
        np.testing.assert_array_equal(perception._colour_mask(pixels, rgb, tolerance),
                                      np.all(np.abs(pixels - np.asarray(rgb, np.int16)) <= tolerance, axis=-1))
