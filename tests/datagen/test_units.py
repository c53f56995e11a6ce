"""The data pipeline's building blocks: ledgers that survive a kill, the call log and its accounting, the
near-duplicate filter against brute force, the crowding rule, the one-day news window, service specs and the CLI."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import itertools
import json

import pytest
from support.recorded import record, tiny_renderer

from ranger_jax.datagen import calls, confusion, dedupe, ledger, news, records, services, stages


def test_ledger_resumes_and_drops_a_torn_last_line(tmp_path):
    path = tmp_path / "stages" / "s.jsonl"
    book = ledger.Ledger(path)
    book.add("a", "kept", "ok", {"x": 1})
    book.add("b", "dropped", "too_easy")
    with open(path, "ab") as f:
        f.write(b'{"key": "c", "status": "ke')  # a kill in the middle of a line
    again = ledger.Ledger(path)
    assert [e.key for e in again.entries()] == ["a", "b"] and again.get("a").record == {"x": 1}
    assert path.read_bytes().endswith(b"\n")  # the torn line is gone before anything is appended
    again.add("c", "kept", "ok")
    assert [e.key for e in ledger.Ledger(path).entries()] == ["a", "b", "c"]
    assert again.counts() == {"kept": {"ok": 2}, "dropped": {"too_easy": 1}}
    with pytest.raises(ValueError, match="status must be one of"):
        again.add("d", "maybe", "?")


def test_run_stage_skips_finished_items_and_retries_failures_next_time(tmp_path):
    book = ledger.Ledger(tmp_path / "s.jsonl")
    seen = []

    async def work(n):
        seen.append(n)
        if n == 3:
            raise stages.RETRYABLE_FAILURES[1]("service down")
        return ("kept" if n % 2 else "dropped"), "odd" if n % 2 else "even", {"n": n}

    items = [(str(n), n) for n in range(5)]
    first = asyncio.run(stages.run_stage("s", book, items, work, concurrency=2, progress=False))
    assert (first.finished, first.failed, first.skipped) == (4, 1, 0) and "service down" in first.errors[0]
    seen.clear()
    second = asyncio.run(stages.run_stage("s", book, items + [("0", 0)], work, progress=False))
    assert seen == [3] and (second.skipped, second.failed) == (4, 1)  # only the failed item runs again

    async def bug(n):
        raise KeyError("a bug is no service failure")

    with pytest.raises(KeyError):
        asyncio.run(stages.run_stage("s", ledger.Ledger(tmp_path / "t.jsonl"), items, bug, progress=False))


def test_call_log_replaces_images_by_digest_and_prices_calls(tmp_path):
    recorder = calls.Recorder(tmp_path, {"llm": calls.Price(per_million_input_tokens=2.0,
                                                            per_million_output_tokens=8.0),
                                         "serper": calls.Price(per_request=0.001)})
    image = "data:image/png;base64," + "A" * 600
    recorder.record(stage="extract", service="llm", endpoint="u", request={"messages": [image, "text"]},
                    response={"content": "ok"}, usage={"prompt_tokens": 1000, "completion_tokens": 250})
    recorder.record(stage="news", service="serper", endpoint="n", request={"q": "x"}, error="HTTP 429")
    recorder.record(stage="news", service="serper", endpoint="n", request={"q": "y"}, response=[b"\x89PNG"])
    row = json.loads((tmp_path / "calls" / "llm.jsonl").read_text().splitlines()[0])
    assert row["request"]["messages"][0].startswith("sha256:") and row["request"]["messages"][1] == "text"
    usage = recorder.usage()
    assert usage["stages"]["extract"]["llm"]["cost_usd"] == pytest.approx(1000 * 2e-6 + 250 * 8e-6)
    assert usage["stages"]["news"]["serper"] == {"requests": 2, "failed": 1, "prompt_tokens": 0,
                                                 "completion_tokens": 0, "cost_usd": pytest.approx(0.002)}
    assert usage["total_cost_usd"] == pytest.approx(0.004 + 0.002)
    recorder.save()
    resumed = calls.Recorder(tmp_path, {})
    assert resumed.usage()["services"]["serper"]["requests"] == 2  # totals cover reruns too
    with pytest.raises(ValueError, match="per_request"):
        calls.Price(per_request=-1)


def _brute_force(texts, threshold):
    sets = [dedupe.shingles(t) for t in texts]
    pairs = set()
    for i, j in itertools.combinations(range(len(texts)), 2):
        inter, union = len(sets[i] & sets[j]), len(sets[i] | sets[j])
        if union and inter / union >= threshold:
            pairs.add((i, j))
    return pairs


def test_near_duplicates_match_brute_force():
    base = ["Generate an image of the new Zorvan FC Home kit worn by a player celebrating a goal.",
            "Create a photo of the Quorn League 2025 Official match ball on the centre circle before a match.",
            "Show the new Brelda Max Coral smartphone held in a hand on a sunny day.",
            "Make a picture of the Tilne Festival 2026 Lineup festival poster pasted on brick in the old town."]
    variants = [b.replace("new ", "just-released ") for b in base] + [b.replace(".", " at night.") for b in base]
    texts = base + variants + [b.upper() for b in base[:2]]
    expected = _brute_force(texts, 0.7)
    deduper = dedupe.Deduper(0.7)
    kept = []
    for i, text in enumerate(texts):
        duplicate = deduper.offer(str(i), text)
        if duplicate is None:
            kept.append(i)
        else:  # flagged only against a kept text it really is that close to
            assert (int(duplicate[1]), i) in expected and duplicate[0] == "near_duplicate"
    assert all(not any((a, b) in expected for b in kept if b > a) for a in kept)  # nothing close was kept twice
    assert dedupe.Deduper(0.7).offer("x", "short", target="The Zorvan FC kit") is None
    targets = dedupe.Deduper()
    targets.offer("a", "one request", target="Zorvan FC 2026 Home kit")
    assert targets.offer("b", "a different request entirely", target="zorvan fc 2026 home KIT") == ("duplicate_target",
                                                                                                  "a")
    with pytest.raises(ValueError, match="threshold"):
        dedupe.Deduper(0)


@pytest.mark.parametrize("labels,verdict", [
    (("confusable",) * 3 + ("other",) * 7, (True, "crowded")),
    (("confusable",) * 4 + ("target",) * 2, (True, "crowded")),
    (("confusable",) * 3 + ("target",) * 2, (False, "too_easy")),
    (("confusable",) * 2 + ("other",) * 8, (False, "not_crowded")),
    (("unavailable",) * 10, (False, "not_crowded")),
    ((), (False, "not_crowded")),
])
def test_crowd_rule(labels, verdict):
    assert confusion.CrowdRule().verdict(labels) == verdict


def test_crowd_rule_checks_its_fields():
    with pytest.raises(ValueError, match="min_confusable"):
        confusion.CrowdRule(top_k=5, min_confusable=6)
    with pytest.raises(ValueError, match="top_k"):
        confusion.CrowdRule(top_k=25)


def test_one_day_window_and_news_days():
    assert news.day_window(dt.date(2026, 3, 2)) == "cdr:1,cd_min:3/2/2026,cd_max:3/2/2026"
    assert news.news_days(dt.date(2026, 3, 2), 3) == [dt.date(2026, 3, 2), dt.date(2026, 3, 1), dt.date(2026, 2, 28)]
    with pytest.raises(ValueError, match="num_days"):
        news.news_days(dt.date(2026, 3, 2), 0)
    names = [("Zorvan FC 2026 Home kit", "e1"), ("Zorvan FC 2025 Home kit", "e2")]
    assert news.named_releases("Zorvan FC 2026 Home kit vs Zorvan FC 2025 Home kit: what changed", names) == \
        ("e1", "e2")


def test_service_specs_name_what_is_wrong(tmp_path):
    specs = services.parse_services({"llm": {"url": "http://127.0.0.1:1/v1", "model": "m", "api_key_env": "K",
                                             "price": {"per_million_input_tokens": 1.0}},
                                     "generator": {"url": ["http://a:1", "http://b:1"], "kind": "gen_searcher"}})
    assert specs["generator"].url == ("http://a:1", "http://b:1") and specs["llm"].price.per_million_input_tokens == 1
    assert specs["llm"].key({"K": "secret"}) == "secret"
    with pytest.raises(ValueError, match=r"\$K is not set"):
        specs["llm"].key({})
    for tables, match in [({"ocr": {"url": "http://x"}}, "unknown service"),
                          ({"llm": {"url": "http://x"}}, "needs a model"),
                          ({"llm": {"url": "ftp://x", "model": "m"}}, "http"),
                          ({"judge": {"url": "http://x", "model": "m", "temperature": 0}}, "unknown keys"),
                          ({"generator": {"url": "http://x", "kind": "dalle"}}, "kind must be"),
                          ({"serper": {"url": "http://x", "max_concurrency": 0}}, "max_concurrency")]:
        with pytest.raises(ValueError, match=match):
            services.parse_services(tables)
    with pytest.raises(FileNotFoundError, match="services file"):
        services.load_services(tmp_path / "none.toml")
    run = services.Services(specs, calls.Recorder(None))
    with pytest.raises(ValueError, match=r"needs the \[judge\] service"):
        run.chat("judge", "confusion")


def test_prompt_records_round_trip_and_check_their_fields():
    prompt = records.Prompt(id="p1", prompt="Show the new X kit.", target="X kit", mode="text", date="2026-01-02",
                            today="2026-01-05", evidence={"results": 10})
    assert records.Prompt.from_record(json.loads(json.dumps(prompt.to_record()))) == prompt
    assert prompt.meta()["date"] == "2026-01-02"
    with pytest.raises(ValueError, match="mode must be one of"):
        records.Prompt(id="p2", prompt="x", target="x", mode="rumour", date="d", today="d")
    with pytest.raises(ValueError, match="unknown instructions"):
        records.instructions("nope")


def test_cli_rejects_unknown_stages_and_categories(tmp_path, capsys):
    from ranger_jax.datagen import cli

    with pytest.raises(SystemExit):
        cli.main(["teach", "--out", str(tmp_path), "--world", str(tmp_path)])
    assert "unknown stages ['teach']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--out", str(tmp_path), "--world", str(tmp_path), "--categories", "Cooking"])
    assert "unknown categories ['Cooking']" in capsys.readouterr().err


def test_errors_name_what_is_wrong(tmp_path):
    from ranger_jax.datagen import categories, groundtruth, pipeline, sft_export, splits, synthesis, teacher
    from ranger_jax.datagen import world_tasks
    from ranger_jax.env.backends import offline
    from ranger_jax.env.sim import build

    checks = [
        (lambda: teacher.TeacherConfig(batch_size=0), "batch_size must be a positive int"),
        (lambda: splits.SplitConfig(rl_fraction=1.5), "rl_fraction must be in"),
        (lambda: synthesis.NewsConfig(end=dt.date(2026, 1, 1), headlines_per_query=50), "headlines_per_query"),
        (lambda: groundtruth.QualityRule(minimum={"beauty": 1.0}), "unknown perspectives"),
        (lambda: categories.CategoryConfig(today=dt.date(2026, 1, 1), calls_per_category=0), "calls_per_category"),
        (lambda: pipeline.run(pipeline.RunConfig(out=tmp_path / "r"), stages_to_run=("teach",)), "unknown stages"),
    ]
    for call, match in checks:
        with pytest.raises(ValueError, match=match):
            call()
    with pytest.raises(ValueError, match="needs the policy model's tokenizer"):
        pipeline.run(pipeline.RunConfig(out=tmp_path / "r2", world=build.build_world(tmp_path / "w", 2, 5)),
                     stages_to_run=("teacher",))
    backend = offline.OfflineBackend(tmp_path / "w")
    prompt = records.Prompt(id="p", prompt="Show it.", target="it", mode="text", date="d", today="d", target_id="e9")
    with pytest.raises(ValueError, match="target_id 'e9'"):
        asyncio.run(confusion.ExactConfusion(backend, calls.Recorder(None)).judge(prompt, stage="s"))
    with pytest.raises(ValueError, match="target_id 'e9'"):
        world_tasks.task_row(backend.world, prompt)
    (tmp_path / "view").mkdir()
    (tmp_path / "view" / "pages.jsonl").write_text("")
    with pytest.raises(FileExistsError, match="is not a link"):
        world_tasks.write_world_view(tmp_path / "w", tmp_path / "view", [])
    traj, _ = record(tiny_renderer(tmp_path / "tok"), seed=0)
    traj = dataclasses.replace(traj, messages=({"role": "user", "content": [{"type": "image", "img_id": "IMG_9"}]},))
    with pytest.raises(ValueError, match=r"shows images \['IMG_9'\] it does not hold"):
        sft_export.sharegpt_row(traj, {})
