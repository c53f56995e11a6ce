"""Live pieces on their own against loopback servers: the LLM category writer and QA conversion, the SGLang images
API as the ground-truth generator, and the VLM confusion judge's answer checking."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json

import numpy as np
import pytest
from PIL import Image
from support.fixtures import load as load_fixture
from support.loopback import LoopbackServer, Reply

from ranger_jax.datagen import calls, categories, confusion, ledger, records, services, stages

TODAY = dt.date(2026, 3, 2)


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def completion(content: str) -> dict:
    body = load_fixture("openai_chat_judge_response")
    body["choices"][0]["message"]["content"] = content
    return body


@pytest.fixture()
def server():
    with LoopbackServer() as srv:
        yield srv


def chat_specs(server, **extra):
    return services.parse_services({"llm": {"url": f"{server.url}/v1", "model": "writer"},
                                    "judge": {"url": f"{server.url}/v1", "model": "judge"}, **extra})


def test_category_prompts_and_qa_conversion_from_an_llm(server, tmp_path):
    bodies = []

    def chat(request):
        body = request.json()
        bodies.append(body)
        schema = body["response_format"]["json_schema"]["name"]
        text = body["messages"][1]["content"][0]["text"]
        if schema == "category_prompts":
            batch = text.split("Batch: ")[1].split("\n")[0]
            return Reply.json(completion(json.dumps({"prompts": [
                {"prompt": f"Show the observatory that replaced the one where comet {batch} was found.",
                 "answer": f"Observatory {batch}", "hops": ["comet", "replacement"]}]})))
        usable = "capital" in text
        return Reply.json(completion(json.dumps({"usable": usable, "reason": "r", "prompt":
                                                 "Depict the square where the treaty was signed." if usable else ""})))

    server.route("POST", "/v1/chat/completions", chat)
    recorder = calls.Recorder(tmp_path)
    run = services.Services(chat_specs(server), recorder)
    writer = categories.LLMCategoryWriter(run.chat("llm", "category"), today=TODAY, qa_client=run.chat("llm", "qa"))
    config = categories.CategoryConfig(today=TODAY, categories=("Astronomy",), calls_per_category=2,
                                       prompts_per_call=1)
    questions = [{"id": "q1", "question": "In which capital was the treaty signed?", "answer": "Vienna"},
                 {"id": "q2", "question": "How many moons?", "answer": "2"}]
    report = stages.Report(tmp_path / "report.json")
    kept = asyncio.run(categories.synthesize(tmp_path, config, writer, report, questions=questions,
                                             progress=False))
    asyncio.run(run.aclose())
    assert sorted(p.mode for p in kept) == ["category", "category", "qa"]
    assert report.stages["qa"]["dropped"] == {"unusable_question": 1}
    qa = next(p for p in kept if p.mode == "qa")
    assert qa.target == "Vienna" and "Vienna" not in qa.prompt and qa.category == "news"
    assert {b["messages"][1]["content"][0]["text"].split("\n")[1] for b in bodies
            if b["response_format"]["json_schema"]["name"] == "category_prompts"} == {"Batch: 1", "Batch: 2"}
    assert [records.Prompt.from_record(r).id for r in ledger.read_jsonl(tmp_path / "category_prompts.jsonl")] == \
        [p.id for p in kept]
    assert recorder.usage()["stages"]["qa"]["llm"]["requests"] == 2


def test_sglang_images_api_as_the_ground_truth_generator(server, tmp_path):
    forms = []

    def edits(request):
        forms.append(request.body)
        return Reply.json(load_fixture("sglang_images_generations_response"))

    server.route("POST", "/v1/images/edits", edits)
    recorder = calls.Recorder(tmp_path)
    specs = services.parse_services({"generator": {"url": server.url, "kind": "sglang", "max_retries": 1}})
    run = services.Services(specs, recorder)
    server.fail_next("POST", "/v1/images/edits", Reply(status=503))
    result = asyncio.run(run.generator("groundtruth").agenerate("the kit on a hanger", [png(1), png(2)], seed=0))
    assert result.ok and result.image.startswith(b"\x89PNG") and len(forms) == 1
    assert forms[0].count(b'name="url"') == 2 and b"data:image/png;base64," in forms[0]
    row = json.loads((tmp_path / "calls" / "generator.jsonl").read_text())
    assert row["stage"] == "groundtruth" and row["response"]["image"].startswith("sha256:")
    assert server.count("POST", "/v1/images/edits") == 2  # the 503 was retried by the generator's policy


def test_confusion_judge_answers_are_checked_and_retried(server, tmp_path):
    replies = iter([{"rationale": "r", "labels": [{"index": 1, "label": "target"}]},  # one label for two images
                    {"rationale": "r", "labels": [{"index": 1, "label": "confusable"},
                                                  {"index": 2, "label": "confusable"}]}])
    server.route("POST", "/v1/chat/completions", lambda r: Reply.json(completion(json.dumps(next(replies)))))
    server.route("POST", "/images", lambda r: Reply.json({"images": [
        {"title": "a", "imageUrl": f"{server.url}/img/{i}.png", "link": f"{server.url}/p"} for i in range(3)]}))
    server.route("GET", "/img/0.png", lambda r: Reply(body=png(0), headers={"Content-Type": "image/png"}))
    server.route("GET", "/img/1.png", lambda r: Reply(body=png(1), headers={"Content-Type": "image/png"}))
    server.route("GET", "/img/2.png", lambda r: Reply(status=404))
    patch = pytest.MonkeyPatch()
    patch.setenv("DATAGEN_K", "k")
    try:
        specs = chat_specs(server, serper={"url": server.url, "api_key_env": "DATAGEN_K"})
        run = services.Services(specs, calls.Recorder(tmp_path), allow_hosts=(server.netloc,))
        judge = confusion.JudgeConfusion(run.serper("confusion"), run.fetcher("confusion").image,
                                         run.chat("judge", "confusion"), confusion.CrowdRule(top_k=3, min_confusable=2))
        prompt = records.Prompt(id="p", prompt="Show the new X kit.", target="X kit", mode="text", date="d", today="d")
        kept, reason, evidence = asyncio.run(judge.judge(prompt, stage="confusion"))
        asyncio.run(run.aclose())
    finally:
        patch.undo()
    assert (kept, reason) == (True, "crowded")
    assert evidence["labels"] == ["confusable", "confusable", "unavailable"] and evidence["unavailable"] == 1
    assert server.count("POST", "/v1/chat/completions") == 2  # the incomplete labelling was asked again
