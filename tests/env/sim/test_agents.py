"""Scripted agents through the real ToolEnv on fresh worlds: version 1 (expert >= 90 %, naive <= 40 %) and
version 2 (the oracle expert, the pixel-only expert, naive and one-pass baselines)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import re
import runpy
import sys
from pathlib import Path

import pytest

from ranger_jax import env
from ranger_jax.env.backends.offline import OfflineBackend
from ranger_jax.env.sim import agents, load_tasks, load_world, pages, prose, rewards, savanna
from ranger_jax.env.sim.detector import OracleDetector

REPO = Path(__file__).resolve().parents[3]
_TURN = re.compile(r"^(<think>[^<]+</think>\n)?(<tool_call>\n\{.*\}\n</tool_call>|<answer>\{.*\}</answer>)$", re.DOTALL)


@pytest.fixture(scope="module")
def results(hard_world):
    return {policy: savanna.evaluate(hard_world, policy) for policy in ("expert", "naive")}


@pytest.fixture(scope="module")
def expert_episodes(hard_world):
    """Expert episodes on tasks stripped of their ground truth, scored with the real tasks."""
    the_world, tasks = load_world(hard_world), load_tasks(hard_world)
    expert = agents.ExpertAgent(OracleDetector(the_world))
    out = []
    with env.make("offline", world=str(hard_world)) as tool_env:
        for task in tasks:
            blind = dataclasses.replace(task, ground_truth=None)
            state = agents.run_episode(tool_env, blind, expert)
            out.append((task, state, rewards.score(the_world, task, state.answer, state.images)))
    return out


def test_hardness_acceptance(results):
    expert, naive = results["expert"], results["naive"]
    assert expert["num_tasks"] == naive["num_tasks"] == 32
    assert expert["search_score"] >= 0.9, expert
    assert naive["search_score"] <= 0.4, naive
    assert set(expert["search_score_by_domain"]) == {"Culture", "Entertainment", "Fashion", "Products", "Sports"}
    assert len(expert["search_score_by_subcategory"]) == 16
    assert expert["crop_iou_mean"] > naive["crop_iou_mean"] and expert["text_score_mean"] > naive["text_score_mean"]
    assert expert["terminations"] == {"answer": 32}
    assert len(expert["episodes"]) == 32 and {"search_pass", "crop_iou", "reason"} <= set(expert["episodes"][0])


def test_siblings_outrank_the_target_for_natural_queries(hard_world):
    backend, tasks = OfflineBackend(hard_world), load_tasks(hard_world)

    async def first_results():
        return [await backend.image_search(t.prompt, top_k=5) for t in tasks]

    sibling_first = target_absent = 0
    for task, hits in zip(tasks, asyncio.run(first_results())):
        truth = task.ground_truth
        shown = [{o.entity_id for o in backend.world.images[h.image_url].objects} for h in hits]
        sibling_first += truth["target_id"] not in shown[0] and bool(shown[0] & set(truth["sibling_ids"]))
        target_absent += not any(truth["target_id"] in ids for ids in shown)
    assert sibling_first >= 0.6 * len(tasks)
    assert target_absent >= 0.5 * len(tasks)


def test_expert_never_needs_the_ground_truth(expert_episodes):
    passed = [score.search_pass for _, _, score in expert_episodes]
    assert sum(passed) >= 0.9 * len(passed)


def test_expert_trajectories_are_protocol_turns(expert_episodes):
    for task, state, score in expert_episodes:
        said = [m["content"] for m in state.messages if m["role"] == "assistant"]
        assert all(_TURN.match(text) for text in said), said
        names = [json.loads(re.search(r"\{.*\}", t, re.DOTALL).group(0))["name"] for t in said if "<tool_call>" in t]
        assert names[0] == "text_search" and "image_search" in names and "crop_image" in names
        assert len(names) <= 8 and state.termination == "answer"
        if score.search_pass:
            crop = state.images[state.answer.reference_images[0].img_id]
            assert crop.parent_id is not None and crop.root_box is not None
            assert score.text_score == 1.0 and score.crop_iou > 0.95


def test_naive_answers_with_the_first_image(hard_world):
    task = load_tasks(hard_world)[0]
    with env.make("offline", world=str(hard_world)) as tool_env:
        state = agents.run_episode(tool_env, task, agents.NaiveAgent())
    calls = [m["content"] for m in state.messages if m["role"] == "assistant"]
    assert '"query": ' + json.dumps(task.prompt) in calls[0]
    assert [r.img_id for r in state.answer.reference_images] == ["IMG_001"]
    assert state.answer.gen_prompt == task.prompt


def test_detector_reports_looks_not_identities(hard_world):
    the_world, task = load_world(hard_world), load_tasks(hard_world)[0]
    truth = task.ground_truth
    image = the_world.images[truth["image_url"]]
    detector = OracleDetector(the_world)
    whole = env.ImageRecord("IMG_001", "/x", "0" * 64, image.width, image.height, url=image.url, root_url=image.url)
    found = detector.detect(whole)
    assert len(found) == len(image.objects)
    assert not {f.name for f in dataclasses.fields(found[0])} & {"entity_id", "name", "edition", "released"}
    x0, y0, x1, y1 = truth["bbox"]
    crop = dataclasses.replace(whole, img_id="IMG_002", url=None, width=int(x1 - x0) + 10,
                               height=int(y1 - y0) + 10, root_box=(x0 - 5, y0 - 5, x1 + 5, y1 + 5))
    inside = [d for d in detector.detect(crop) if d.visible_fraction == 1.0]
    assert [d.attributes.as_dict() for d in inside] == [dict(zip(("primary", "secondary", "pattern", "emblem"),
                                                                truth["key_attributes"]))]
    assert inside[0].attributes == the_world.entities[truth["target_id"]].attributes
    assert inside[0].box == (5.0, 5.0, x1 - x0 + 5, y1 - y0 + 5)
    foreign = dataclasses.replace(whole, url="https://web.example/a.png", root_url="https://web.example/a.png")
    assert detector.detect(foreign) == []


def test_fact_sheets_read_back_as_the_entity_attributes(small_world):
    the_world = load_world(small_world)
    entities = sorted(the_world.entities.values(), key=lambda e: e.id)[:4]
    for entity in entities:
        facts = prose.read_facts(pages.fact_sheet(entity), entity.family, entity.noun)
        assert {f.field: f.value for f in facts} == {"released": entity.released, **entity.attributes.as_dict()}
        assert {f.name for f in facts} == {pages.full_name(entity)} and not any(f.hedged for f in facts)


def test_request_reading():
    prompt = "Create a photo of the latest Zurgrel Max smartphone in the Midnight version held in a hand."
    assert agents.subject_query(prompt) == "Zurgrel Max Midnight"
    assert agents.subject_query("Show the Lake FC 2026 Home kit.") == "Lake FC 2026 Home"
    assert agents.wants_recent(prompt) and agents.wants_recent("the kit revealed this week")
    assert not agents.wants_recent("Show the Lake FC 2026 Home kit in the renewed stadium.")


def test_unknown_policy_is_named(small_world):
    with pytest.raises(ValueError, match=r"unknown policy 'oracle'; known policies: \['caption', 'expert', 'finder', "
                                         r"'naive', 'pixel_expert', 'snippet'\]"):
        savanna.evaluate(small_world, "oracle")
    with pytest.raises(TypeError, match=r"an agent is a built-in name .* got int"):
        savanna.evaluate(small_world, 42)
    for limit in (0, -1, 1.5):
        with pytest.raises(ValueError, match=f"limit must be a positive number of tasks or None; got {limit}"):
            savanna.evaluate(small_world, "naive", limit=limit)
    assert savanna.evaluate(small_world, "naive", limit=2)["num_tasks"] == 2


def test_any_agent_can_be_evaluated(small_world):
    """A built-in name, an object with act, and a bare act callable give the same rows (reward = env.score)."""
    expert = agents.ExpertAgent(OracleDetector(load_world(small_world)))
    by_name = savanna.evaluate(small_world, "expert", limit=3)
    by_object = savanna.evaluate(small_world, expert, limit=3)
    by_callable = savanna.evaluate(small_world, expert.act, limit=3)
    assert by_name["episodes"] == by_object["episodes"] == by_callable["episodes"]
    assert (by_name["policy"], by_object["policy"], by_callable["policy"]) == ("expert", "ExpertAgent", "act")
    assert {"search_pass", "reward", "reason", "zero_reason", "last_response"} <= set(by_name["episodes"][0])
    finder = savanna.evaluate(small_world, "finder", limit=3)  # its env gets find_object, the tool it needs
    assert finder["search_score"] > 0 and finder["terminations"] == {"answer": 3}


def test_eval_script_writes_json(small_world, tmp_path, monkeypatch, capsys):
    out = tmp_path / "expert.json"
    monkeypatch.setattr(sys, "argv", ["savanna_sim.py", "--world", str(small_world), "--policy", "expert",
                                      "--json", str(out)])
    runpy.run_path(str(REPO / "evals" / "savanna_sim.py"), run_name="__main__")
    result = json.loads(out.read_text())
    assert result["num_tasks"] == 6 and 0.0 <= result["search_score"] <= 1.0
    assert set(result["search_score_by_domain"]) == set(result["num_tasks_by_domain"])
    assert "search_score" in capsys.readouterr().out


def test_expert_reads_the_launch_article_even_when_the_variant_is_a_launch_word(hard_world):
    # "Official" is the variant's name here, not a sign of an official launch article
    prompt = "Show the Quorktres Series Official match ball that was revealed a few weeks ago on the centre circle."
    results = ("<tool_response>\n--- search result for [Quorktres Series Official] ---\n"
               "1. [Fans react to the Quorktres Series 2025 Official match ball](https://a.sim/news/fans) "
               "(2025-02-19)\n"
               "We went to the penalty spot to see it up close.\n"
               "2. [Quorktres Series reveals 2025 Official and Final match balls](https://b.sim/news/reveals) "
               "(2025-02-07)\nQuorktres Series today revealed its 2025 match balls.\n"
               "--- end of search result ---\n</tool_response>")
    task = env.Task("q", prompt)
    said = agents.tool_call("text_search", {"queries": ["Quorktres Series Official"]}, "search")
    state = env.EnvState(task=task, messages=({"role": "system", "content": "s"}, {"role": "user", "content": prompt},
                                              {"role": "assistant", "content": said},
                                              {"role": "user", "content": results}),
                         images=env.FrozenDict(), image_keys=env.FrozenDict(), next_image_index=1,
                         today=dt.date(2025, 3, 1), num_turns=1, num_tool_calls=1)
    turn = agents.ExpertAgent(OracleDetector(load_world(hard_world))).act(state)
    assert '"url": ["https://b.sim/news/reveals", "https://a.sim/news/fans"]' in turn  # the launch article first


@pytest.fixture(scope="module")
def v2_results(v2_world):
    return {policy: savanna.evaluate(v2_world, policy) for policy in ("expert", "naive", "caption", "snippet")}


def test_version_two_acceptance(v2_results, v2_world):
    """The oracle expert solves the web-like world; naive and one-pass strategies mostly fail."""
    expert = v2_results["expert"]
    assert expert["num_tasks"] == 12 and expert["search_score"] >= 0.9, expert["search_score"]
    assert expert["terminations"] == {"answer": 12} and expert["text_score_mean"] >= 0.9
    for baseline in ("naive", "caption", "snippet"):
        assert v2_results[baseline]["search_score"] <= 0.2, (baseline, v2_results[baseline]["search_score"])
    kinds = {t.id: t.metadata["request_kind"] for t in load_tasks(v2_world)}
    solved = {kinds[e["task_id"]] for e in expert["episodes"] if e["search_pass"]}
    assert solved == {"direct", "indirect", "two_subjects"}


def test_pixel_expert_solves_tasks_from_observations(v2_world):
    """The expert that perceives only through find_object (no annotations) still solves most tasks."""
    result = savanna.evaluate(v2_world, "pixel_expert", limit=5)
    assert result["search_score"] >= 0.6, [e["search_reason"] for e in result["episodes"]]
    assert result["terminations"] == {"answer": 5}


def test_version_two_expert_never_needs_the_ground_truth(v2_world):
    the_world, tasks = load_world(v2_world), load_tasks(v2_world)
    expert = agents.ExpertAgent(OracleDetector(the_world))
    passed = 0
    with env.make("offline", world=str(v2_world)) as tool_env:
        for task in tasks[:6]:
            state = agents.run_episode(tool_env, dataclasses.replace(task, ground_truth=None), expert)
            said = [m["content"] for m in state.messages if m["role"] == "assistant"]
            assert all(_TURN.match(text) for text in said), said
            passed += rewards.score(the_world, task, state.answer, state.images).search_pass
    assert passed >= 5
