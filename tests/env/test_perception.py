"""The pixel-only object finder and the find_object tool, checked against the world's own annotations."""

from __future__ import annotations

import pytest
from PIL import Image, ImageDraw

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
    build.build_world(root, num_tasks=8, seed=11)
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
