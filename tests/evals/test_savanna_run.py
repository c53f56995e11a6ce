"""Savanna eval end to end against loopback judge and generator servers: the generator alone from the command line,
and a policy in the offline world (references with crops kept, search judged, fallbacks), each with its
hand-computed Table 1 row."""
import asyncio
import json

import pytest

from ranger_jax import env
from ranger_jax.clients import chat
from ranger_jax.clients import images as images_lib
from ranger_jax.data import trajectory as trajectory_lib
from ranger_jax.env.sim import build
from ranger_jax.evals import agent as agent_lib
from ranger_jax.evals import cli, report, runner, savanna, store
from ranger_jax.processing import ChatRenderer, load_tokenizer
from ranger_jax.rollout import episode, policy
from support.eval_services import FIXTURES, completion
from support.loopback import LoopbackServer, Reply
from support.tiny_tokenizer import qwen3_tokenizer_dir

ITEMS = FIXTURES / "savanna" / "items.jsonl"


def generation(tier, *satisfied):
    return json.dumps({"rationale": "Constraints: invented.", "identity_tier": tier,
                       "context": [{"criterion": f"c{i}", "satisfied": ok} for i, ok in enumerate(satisfied)]})


# s1 (Sports) passes; s2 (Entertainment) is only partial; s3 (Products, no criteria) passes; s4 (Culture) misses a
# criterion. Generation by domain: Ent 0, Spo 100, Fas –, Pro 100, Cul 0, average 50; graded (1 + .5 + 1 + .5)/4.
GENERATION = {"[s1]": generation("exact", True, True), "[s2]": generation("partial", True),
              "[s3]": generation("exact"), "[s4]": generation("exact", True, False)}


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
    return build.build_world(tmp_path_factory.mktemp("savanna") / "world", 2, 11)


def test_generator_alone_from_the_command_line(services, tmp_path):
    services.judge.replies["savanna_generation"] = GENERATION
    summary = cli.main("savanna", ["--bench", str(ITEMS), "--out", str(tmp_path / "run"), "--generator-url",
                                   services.url, "--judge-url", services.judge_url, "--judge-api-key-env", "",
                                   "--quiet", "--label", "Qwen-Image"])
    scores = summary["scores"]
    assert scores["search"] == dict.fromkeys((*savanna.DOMAINS, "Overall"))
    assert scores["generation"] == {"Entertainment": 0.0, "Sports": 100.0, "Fashion": None, "Products": 100.0,
                                    "Culture": 0.0, "Overall": 50.0}
    assert scores["generation_graded"]["Overall"] == pytest.approx(75.0)
    table = (tmp_path / "run" / "report.md").read_text()
    assert "| Qwen-Image | – | – | – | – | – | – | 0.0 | 100.0 | – | 100.0 | 0.0 | 50.0 |" in table
    # the judge got the criteria in order, the GT images first and the generated image last
    body = next(b for b in services.judge.bodies if "[s1]" in b["messages"][1]["content"][0]["text"])
    text = body["messages"][1]["content"][0]["text"]
    assert "Context criteria:\n- worn by a player\n- during a match" in text
    assert "Ardent Rovers 2031 away kit" in text and len(body["messages"][1]["content"]) == 4
    kinds = {(b.get("response_format") or {}).get("json_schema", {}).get("name") for b in services.judge.bodies}
    assert kinds == {"savanna_generation"}  # no policy: no search to judge


class CropAndAnswer:
    """Searches, crops the first result, then answers as the item's plan says."""

    PLANS = {"s1": "refs", "s2": "refs", "s3": "no_refs", "s4": "no_answer"}

    def act(self, state):
        if state.num_turns == 0:
            return env.format_tool_call("image_search", {"query": "photo"})
        if state.num_turns == 1:
            return env.format_tool_call("crop_image", {"img_id": "IMG_001", "bbox": [0.1, 0.2, 0.6, 0.7]})
        plan = self.PLANS[state.task.id]
        crop = next(img_id for img_id, record in state.images.items() if record.parent_id)
        if plan == "refs":
            return env.format_answer(f"{state.task.prompt}, as in the references",
                                     [{"img_id": crop, "note": "the target"}, "IMG_002"])
        if plan == "no_refs":
            return env.format_answer("a picture of it", [])
        return "I give up."


def test_policy_in_the_offline_world(services, world_dir, tmp_path):
    services.judge.replies["savanna_generation"] = GENERATION
    services.judge.replies["savanna_search"] = {
        "[s1]": json.dumps({"rationale": "Constraints: teal.", "passed": True, "matching_reference": "IMG_005"}),
        "[s2]": json.dumps({"rationale": "Constraints: mascot.", "passed": False, "matching_reference": ""})}
    items = savanna.load_items(ITEMS)
    renderer = ChatRenderer(load_tokenizer(qwen3_tokenizer_dir()))
    judge_client = chat.ChatClient(services.judge_url, model="judge", max_retries=0)
    bench = savanna.Savanna(judge_client)
    run_store = store.RunStore(tmp_path / "run")
    settings = run_store.start({"benchmark": "savanna", "label": "scripted"})
    with env.make("savanna_sim", world=str(world_dir)) as tool_env:
        scripted = policy.ScriptedPolicy(CropAndAnswer(), renderer.tokenizer, name="crop-and-answer")
        agent = agent_lib.Agent(tool_env, scripted, renderer, episode=episode.EpisodeConfig(
            sampling=policy.SamplingParams(temperature=0.0, top_p=1.0)))
        generator = images_lib.SGLangImageGenerator(services.url, max_retries=0)
        run = runner.Runner(bench, run_store, generator=generator, agent=agent, config=runner.RunConfig(concurrency=2))

        async def go():
            try:
                return await run.arun(items)
            finally:
                await generator.aclose()
                await bench.aclose()

        records = asyncio.run(go())
    summary = report.write_reports(tmp_path / "run", bench, items, records, settings)["scores"]
    # search: s1 passes, s2 fails, s3 has no reference (fails without a judge call), s4 no answer
    assert summary["search"] == {"Entertainment": 0.0, "Sports": 100.0, "Fashion": None, "Products": 0.0,
                                 "Culture": 0.0, "Overall": 25.0}
    assert summary["generation"]["Overall"] == 50.0
    searched = [b for b in services.judge.bodies if (b.get("response_format") or {}).get("json_schema", {})
                .get("name") == "savanna_search"]
    assert len(searched) == 2
    s1 = records["s1"]
    assert s1["generation"]["source"] == "answer" and s1["generation"]["references"] == ["IMG_005.png",
                                                                                         "IMG_002.jpg"]
    assert ("[s1] The new away kit the invented club Ardent Rovers unveiled yesterday, worn in a match., as in the "
            "references", 2) in services.generator.calls
    assert [records[i]["generation"]["source"] for i in ("s3", "s4")] == ["fallback", "fallback"]
    assert records["s4"]["agent"]["gen_prompt"] is None and records["s4"]["scores"]["search_pass"] is False
    crop = s1["agent"]["references"][0]
    item_dir = tmp_path / "run" / "items" / "s1"
    assert crop["crop"]["box"] == pytest.approx([0.1 * crop["crop"]["root_width"], 0.2 * crop["crop"]["root_height"],
                                                 0.6 * crop["crop"]["root_width"], 0.7 * crop["crop"]["root_height"]],
                                                abs=1)
    assert (item_dir / crop["file"]).is_file() and (item_dir / crop["crop"]["root_file"]).is_file()
    trajectory = trajectory_lib.Trajectory.from_bytes((item_dir / "trajectory.rjt").read_bytes())
    assert trajectory.answer.reference_images[0].img_id == crop["img_id"] and trajectory.reward == 1.0
    gallery = (tmp_path / "run" / "gallery.html").read_text()
    assert "items/s1/refs/IMG_005.png" in gallery and 'class="box"' in gallery
    assert f"{crop['crop']['root_id']}: IMG_005 is cut from the box" in gallery


def test_scripted_policy_from_the_command_line(services, world_dir, tmp_path):
    services.judge.replies["savanna_generation"] = GENERATION
    summary = cli.main("savanna", ["--bench", str(ITEMS), "--out", str(tmp_path / "run"), "--limit", "2",
                                   "--policy", "naive", "--env", "savanna_sim", "--world", str(world_dir),
                                   "--generator-url", services.url, "--judge-url", services.judge_url,
                                   "--judge-api-key-env", "", "--quiet"])
    records = store.RunStore(tmp_path / "run").records()
    assert [records[i]["agent"]["policy"] for i in ("s1", "s2")] == ["naive", "naive"]
    assert summary["settings"]["policy"]["kind"] == "naive" and summary["num_finished"] == 2
    assert summary["scores"]["search"]["Overall"] is not None  # judged (or failed for lack of references)


def harness_chat(req):
    """A frontier model with tool calling: one image search, then an answer citing the first image."""
    body = req.json()
    if not any(m["role"] == "tool" for m in body["messages"]):
        call = {"id": "call_0", "type": "function",
                "function": {"name": "image_search", "arguments": json.dumps({"query": "photo"})}}
        message = {"role": "assistant", "content": "", "tool_calls": [call]}
        return Reply.json({"id": "h", "object": "chat.completion", "created": 0, "model": "frontier",
                           "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})
    return Reply.json(completion(env.format_answer("the kit, as in the reference", ["IMG_001"])))


def test_tool_calling_chat_model_from_the_command_line(services, world_dir, tmp_path):
    services.judge.replies["savanna_generation"] = GENERATION
    services.judge.replies["savanna_search"] = {
        "[s1]": json.dumps({"rationale": "Constraints: teal.", "passed": True, "matching_reference": "IMG_001"})}
    with LoopbackServer() as frontier:
        frontier.route("POST", "/v1/chat/completions", harness_chat)
        frontier.route("GET", "/v1/models", lambda req: Reply.json({"object": "list", "data": []}))
        summary = cli.main("savanna", ["--bench", str(ITEMS), "--out", str(tmp_path / "run"), "--limit", "1",
                                       "--policy", "harness", "--chat-url", f"{frontier.url}/v1", "--chat-model",
                                       "frontier", "--policy-api-key-env", "", "--env", "savanna_sim", "--world",
                                       str(world_dir), "--generator-url", services.url, "--judge-url",
                                       services.judge_url, "--judge-api-key-env", "", "--quiet"])
        assert frontier.count("POST", "/v1/chat/completions") == 2
    record = store.RunStore(tmp_path / "run").records()["s1"]
    assert record["agent"]["policy"] == "harness:frontier" and record["agent"]["num_tool_calls"] == 1
    assert [ref["img_id"] for ref in record["agent"]["references"]] == ["IMG_001"]
    assert record["generation"]["source"] == "answer" and summary["scores"]["search"]["Sports"] == 100.0
    assert summary["label"] == "harness:frontier + sglang"
