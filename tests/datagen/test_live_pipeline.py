"""The live data pipeline end to end against loopback servers that speak the real formats: Serper (`/news`,
`/images`), an image host, an OpenAI-compatible chat server playing the request writer, the VLM judge and the teacher
model, and Gen-Searcher's `/generate` image service. The production clients run; only base URLs differ."""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support.fixtures import load as load_fixture
from support.loopback import LoopbackServer, Reply
from support.tiny_tokenizer import write_tiny_tokenizer

from ranger_jax import data as data_lib
from ranger_jax.datagen import calls, ledger, pipeline, services, splits
from ranger_jax.rollout import episode, sequence

DAY = dt.date(2026, 3, 2)
WINDOW = "cdr:1,cd_min:3/2/2026,cd_max:3/2/2026"
KEY_ENV = "DATAGEN_TEST_SERPER_KEY"
KIT_REQUEST = "Generate an image of the new Zorvan FC Home kit worn by a player celebrating a goal."
POSTER_REQUEST = "Create a picture of the new Lumen Saga key visual as a mural on a rainy street."
BAG_REQUEST = "Make a picture of the face-shaped bag carried at the Lumen Saga premiere, on a cafe table."
USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}


def png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def completion(content: str = "", tool_calls=None, model: str = "m") -> dict:
    body = load_fixture("openai_chat_judge_response")  # the real response shape; only the message changes
    message = {"role": "assistant", "content": content, "reasoning_content": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body["choices"][0].update(message=message, finish_reason="tool_calls" if tool_calls else "stop")
    return {**body, "model": model, "usage": USAGE}


class Web:
    """The loopback web: Serper, image host, chat models, generator (one server, several routes)."""

    def __init__(self, server: LoopbackServer):
        self.server, base = server, server.url
        news = load_fixture("serper_news_response")
        self.headlines = {
            "team kit design unveiling": {**news["news"][0], "title": "Zorvan FC unveils its 2026 Home kit",
                                          "link": f"{base}/news/kit", "imageUrl": f"{base}/img/0.png"},
            "championship trophy presentation": {**news["news"][1], "title": "League results round-up",
                                                 "link": f"{base}/news/results", "imageUrl": f"{base}/img/1.png"},
            "anime key visual release": {**news["news"][0], "title": "Lumen Saga reveals its new key visual",
                                         "link": f"{base}/news/visual", "imageUrl": f"{base}/img/2.png"},
        }
        server.route("POST", "/news", self.news)
        server.route("POST", "/images", self.images)
        for i in range(6):
            server.route("GET", f"/img/{i}.png",
                         lambda r, i=i: Reply(body=png(i), headers={"Content-Type": "image/png"}))
        server.route("POST", "/v1/chat/completions", self.chat)
        server.route("POST", "/generate", self.generate)
        self.judged_images: list[int] = []

    def news(self, request):
        body = request.json()
        assert request.headers["X-API-KEY"] == "serper-secret" and body["tbs"] == WINDOW
        row = self.headlines.get(body["q"])
        return Reply.json({"searchParameters": {**body, "type": "news"}, "news": [row] if row else [], "credits": 1})

    def images(self, request):
        body, base = request.json(), self.server.url
        rows = load_fixture("serper_images_response")["images"]
        hits = [{**rows[i % 2], "imageUrl": f"{base}/img/{i}.png", "link": f"{base}/page/{i}", "position": i + 1}
                for i in range(5)]
        return Reply.json({"searchParameters": {**body, "type": "images"}, "images": hits, "credits": 1})

    def chat(self, request):
        body = request.json()
        schema = (body.get("response_format") or {}).get("json_schema", {}).get("name")
        text = json.dumps(body["messages"])
        if body["model"] == "teacher":
            if not any(m["role"] == "tool" for m in body["messages"]):
                call = {"id": "c1", "type": "function",
                        "function": {"name": "image_search", "arguments": json.dumps({"query": "Zorvan FC Home"})}}
                return Reply.json(completion(tool_calls=[call], model="teacher"))
            answer = {"gen_prompt": "The new Zorvan FC Home kit, as in the first reference image.",
                      "reference_images": [{"img_id": "IMG_001", "note": "the kit"}]}
            return Reply.json(completion(f"<answer>{json.dumps(answer)}</answer>", model="teacher"))
        if schema == "news_request":
            if "results round-up" in text:
                reply = {"relevant": False, "target": "", "request": "", "reason": "no object to show"}
            elif "Zorvan" in text:
                reply = {"relevant": True, "target": "Zorvan FC 2026 Home kit", "request": KIT_REQUEST, "reason": "kit"}
            else:
                reply = {"relevant": True, "target": "Lumen Saga key visual", "request": POSTER_REQUEST,
                         "reason": "key visual"}
        elif schema == "news_image_request":
            assert "image_url" in text  # the news photo is shown
            reply = {"found": True, "target": "face-shaped bag at the Lumen Saga premiere", "request": BAG_REQUEST,
                     "reason": "a distinctive bag"}
        elif schema == "confusion":
            images = sum(1 for part in body["messages"][1]["content"] if part["type"] == "image_url")
            self.judged_images.append(images)
            crowded = "Lumen Saga key visual" not in text
            labels = ["target"] + ["confusable" if crowded else "target"] * (images - 1)
            reply = {"rationale": "r", "labels": [{"index": i + 1, "label": label} for i, label in enumerate(labels)]}
        elif schema == "savanna_search":
            reply = {"rationale": "Constraints: the kit.", "passed": True, "matching_reference": "IMG_001"}
        elif schema == "sample_quality":
            reply = {"rationale": "fine", "needs_search": 1, "correctness": 1, "faithfulness": 1, "aesthetics": 0.5,
                     "text_rendering": None, "safety": 1, "consistent_search": True}
        elif schema == "category_prompts":
            reply = {"prompts": [{"prompt": "Show the stadium that replaced the ground where Zorvan FC won its first "
                                            "title, at dusk.", "answer": "Zorvan Arena",
                                 "hops": ["first title", "move"]}]}
        else:
            return Reply.json({"object": "error", "message": f"unexpected schema {schema}", "type": "Bad Request",
                               "param": None, "code": 400}, status=400)
        return Reply.json(completion(json.dumps(reply), model=body["model"]))

    def generate(self, request):
        body = request.json()
        assert body["image_urls"] and all(u.startswith("data:image/png;base64,") for u in body["image_urls"])
        assert body["seed"] == 0 and body["num_inference_steps"] == 40
        return Reply.json({"success": True, "image": base64.b64encode(png(9)).decode()})


@pytest.fixture(scope="module")
def web():
    with LoopbackServer() as server:
        yield Web(server)


def run_config(web: Web, out: Path, tokenizer: Path) -> pipeline.RunConfig:
    url = web.server.url
    specs = services.parse_services({
        "llm": {"url": f"{url}/v1", "model": "writer", "max_concurrency": 2,
                "price": {"per_million_input_tokens": 2.0, "per_million_output_tokens": 8.0}},
        "judge": {"url": f"{url}/v1", "model": "judge"},
        "teacher": {"url": f"{url}/v1", "model": "teacher"},
        "serper": {"url": url, "api_key_env": KEY_ENV, "max_retries": 2, "price": {"per_request": 0.001}},
        "generator": {"url": [url], "kind": "gen_searcher", "max_concurrency": 2},
    })
    return pipeline.RunConfig(
        out=out, services=specs, allow_hosts=(web.server.netloc,), end=DAY, num_days=1,
        subcategories=("General Sports", "Anime"), categories=("Sports",), calls_per_category=1, prompts_per_call=1,
        env_options={"serper_base_url": url, "serper_api_key_env": KEY_ENV, "allow_hosts": [web.server.netloc],
                     "cache_dir": str(out / "web_cache"), "min_image_bytes": 0},
        tokenizer=tokenizer, teacher_policy="harness",
        episode=episode.EpisodeConfig(max_new_tokens=2048, max_context_tokens=30000,
                                      vision=sequence.VisionSettings(min_pixels=1024, max_pixels=4096)),
        split=splits.SplitConfig(benchmark_size=1, rl_fraction=0.5), progress=False)


@pytest.fixture(scope="module")
def live_run(web, tmp_path_factory):
    out = tmp_path_factory.mktemp("live")
    tokenizer = tmp_path_factory.mktemp("tok")
    write_tiny_tokenizer(tokenizer, vocab_size=512)
    patch = pytest.MonkeyPatch()
    patch.setenv(KEY_ENV, "serper-secret")
    web.server.fail_next("POST", "/news", Reply(status=429, headers={"Retry-After": "0"}))
    try:
        report = pipeline.run(run_config(web, out, tokenizer))
        requests_after_first = len(web.server.requests)
        again = pipeline.run(run_config(web, out, tokenizer))
        yield out, report, again, requests_after_first, tokenizer
    finally:
        patch.undo()


def test_every_stage_ran_against_the_services(live_run):
    out, report, _, _, _ = live_run
    stages = report["stages"]
    assert stages["news"]["kept"] == {"headlines": 3} and stages["news"]["dropped"] == {"no_headlines": 3}
    assert stages["extract"]["kept"] == {"written": 2} and stages["extract"]["dropped"] == {"off_topic": 1}
    assert stages["confusion"]["kept"] == {"crowded": 1} and stages["confusion"]["dropped"] == {"too_easy": 1}
    assert stages["extract_image"]["kept"] == {"written": 1} and stages["confusion_image"]["kept"] == {"crowded": 1}
    assert stages["category"]["kept"] == {"written": 1}
    assert stages["teacher"]["kept"] == {"search_pass": 3}
    assert stages["groundtruth"]["kept"] == {"passed": 3}
    assert report["figures"]["split_benchmark"] == 1 and report["figures"]["split_rl"] + \
        report["figures"]["split_sft"] == 2
    prompts = {p["prompt"]: p for p in ledger.read_jsonl(out / "prompts.jsonl")}
    assert set(prompts) == {KIT_REQUEST, BAG_REQUEST}
    kit = prompts[KIT_REQUEST]
    assert kit["date"] == "2026-03-02" and kit["subcategory"] == "General Sports" and kit["domain"] == "Sports"
    assert kit["source_headline"] == "Zorvan FC unveils its 2026 Home kit" and kit["source_url"].endswith("/news/kit")
    assert kit["keep_reason"].startswith("crowded: 4 confusable vs 1 clean target")
    assert prompts[BAG_REQUEST]["mode"] == "image" and prompts[BAG_REQUEST]["keep_reason"].startswith("image-oriented")


def test_requests_speak_the_wire_formats(live_run, web):
    assert all(r.json()["tbs"] == WINDOW for r in web.server.requests if r.path == "/news")
    chats = [r.json() for r in web.server.requests if r.path == "/v1/chat/completions"]
    writer = [c for c in chats if c["model"] == "writer"]
    assert writer and all(c["response_format"]["type"] == "json_schema" for c in writer)
    assert web.judged_images and set(web.judged_images) == {5}  # the 5 downloaded results, through the URL guard
    teacher = [c for c in chats if c["model"] == "teacher"]
    assert teacher and all(c["tools"] for c in teacher)
    assert web.server.count("POST", "/generate") == 3


def test_retries_resume_and_accounting(live_run, web):
    out, report, again, first_requests, _ = live_run
    assert len(web.server.requests) == first_requests  # the rerun made no request at all
    assert again["stages"]["teacher"] == report["stages"]["teacher"]
    usage = report["accounting"]
    news_calls = usage["stages"]["news"]["serper"]
    assert news_calls["requests"] == 6 and news_calls["failed"] == 0  # the 429 was retried inside the client
    assert web.server.count("POST", "/news") == 7
    llm = usage["services"]["llm"]
    assert llm["prompt_tokens"] == 100 * llm["requests"] and llm["completion_tokens"] == 20 * llm["requests"]
    assert llm["cost_usd"] == pytest.approx(llm["requests"] * (100 * 2e-6 + 20 * 8e-6))
    serper = usage["services"]["serper"]
    assert serper["cost_usd"] == pytest.approx(serper["requests"] * 0.001)
    assert usage["stages"]["teacher"]["serper"]["requests"] == 3  # the teacher's own image searches count too
    assert usage["stages"]["teacher"]["web"]["requests"] >= 3
    logged = (out / "calls" / "judge.jsonl").read_text()
    assert "sha256:" in logged and "base64," not in logged  # images are logged by digest, never as pixels
    assert sum(1 for _ in open(out / "calls" / "generator.jsonl")) == 3


def test_outputs_load_as_datasets(live_run):
    out, _, _, _, _ = live_run
    bench = data_lib.load_tasks(out / "splits/benchmark/KnowGen-Bench.json")
    rl = data_lib.load_tasks(out / "splits/rl/rl_data.json")
    assert len(bench) == 1 and Path(bench[0].ground_truth).is_file() and bench[0].metadata["category"]
    assert all(Path(t.ground_truth).is_file() and t.metadata["today"] == "2026-03-02" for t in rl)
    summary = json.loads((out / "splits/splits.json").read_text())
    if summary["sizes"]["sft"]:
        rows = data_lib.load_tasks(out / "splits/sft/sharegpt/dataset_info.json")
        assert len(rows) == summary["sizes"]["sft"]


def test_dry_run_plans_live_calls(web, tmp_path, capsys):
    from ranger_jax.datagen import cli

    toml = tmp_path / "services.toml"
    toml.write_text(f'[serper]\nurl = "{web.server.url}"\napi_key_env = "{KEY_ENV}"\n'
                    f'[llm]\nurl = "{web.server.url}/v1"\nmodel = "writer"\n')
    before = len(web.server.requests)
    assert cli.main(["--out", str(tmp_path / "run"), "--services", str(toml), "--end", "2026-03-02", "--days", "2",
                     "--subcategories", "Anime", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "news: serper news searches 4" in printed and "extract: llm calls at most 40" in printed
    assert "judge calls at most 40" in printed and len(web.server.requests) == before


def test_calls_are_counted_per_stage_without_a_run_folder():
    recorder = calls.Recorder(None)
    recorder.record(stage="s", service="llm", endpoint="e", request={}, usage={"prompt_tokens": 3})
    assert recorder.usage()["stages"]["s"]["llm"]["prompt_tokens"] == 3 and recorder.save() is None
