"""The offline data pipeline end to end on fresh worlds: news → requests → exact confusion filter → expert
teacher → ground truth → splits, and what each output promises (the filter's effect on the naive agent, metadata,
exact ShareGPT export, loadable splits, SFT steps on the shards, resuming without calls)."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest

from ranger_jax import data as data_lib
from ranger_jax import env as env_lib
from ranger_jax.data import shards, sft_file
from ranger_jax.datagen import confusion, groundtruth, ledger, pipeline, records, splits, taxonomy
from ranger_jax.env.sim import agents, build, catalog
from ranger_jax.env.sim import world as world_lib
from ranger_jax.env.sim.detector import OracleDetector
from ranger_jax.processing import chat, load_tokenizer
from ranger_jax.rl import tiny_policy
from ranger_jax.rollout import episode

SEEDS = (31013, 31027)  # fresh: no other test or recipe builds these worlds
NUM_TASKS = 30
ENV_OPTIONS = {"prompt_style": "compact", "max_observation_chars": 2000, "max_page_chars": 1500}
MAX_TOKENS = 4096  # SFT cut-off of the test: longer teacher trajectories are dropped as too_long
EPISODE = episode.EpisodeConfig(max_new_tokens=1024, max_context_tokens=8192, vision=tiny_policy.VISION)


def _texts(state) -> list[str]:
    return [m["content"] if isinstance(m["content"], str) else "".join(p.get("text", "") for p in m["content"])
            for m in state.messages]


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    root = tmp_path_factory.mktemp("worlds")
    return [build.build_world(root / f"w{seed}", NUM_TASKS, seed) for seed in SEEDS]


@pytest.fixture(scope="module")
def tokenizer_dir(worlds, tmp_path_factory):
    """A compact tokenizer learned from expert episodes on the first world's own tasks (as sim-tiny learns one)."""
    texts = []
    with env_lib.make("savanna_sim", world=str(worlds[0]), **ENV_OPTIONS) as tool_env:
        expert = agents.ExpertAgent(OracleDetector(tool_env.backend.world))
        for task in world_lib.load_tasks(worlds[0])[:12]:
            texts += _texts(agents.run_episode(tool_env, task, expert))
    folder = tmp_path_factory.mktemp("tokenizer")
    tiny_policy.train_tokenizer(texts, folder, vocab_size=2048)
    return folder


def config(world, out, tokenizer_dir, **overrides) -> pipeline.RunConfig:
    options = dict(out=out, world=world, tokenizer=tokenizer_dir, num_days=21, env_options=ENV_OPTIONS,
                   episode=EPISODE, teacher_batch=24, quality=groundtruth.QualityRule(max_tokens=MAX_TOKENS),
                   split=splits.SplitConfig(benchmark_size=6, rl_fraction=0.25), progress=False)
    return pipeline.RunConfig(**{**options, **overrides})


@pytest.fixture(scope="module")
def full_run(worlds, tokenizer_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    report = pipeline.run(config(worlds[0], out, tokenizer_dir, categories=("Sports",), calls_per_category=1,
                                 prompts_per_call=3))
    return out, report


@pytest.fixture(scope="module")
def second_run(worlds, tokenizer_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("run2")
    return out, pipeline.run(config(worlds[1], out, tokenizer_dir), stages_to_run=("synthesize",))


def test_filter_keeps_prompts_the_naive_agent_fails(full_run, second_run):
    for _, report in (full_run, second_run):
        figures = report["figures"]
        kept, dropped = figures["naive_search_score_kept"], figures["naive_search_score_dropped"]
        assert figures["filter_kept_prompts"] >= 40 and figures["filter_dropped_prompts"] >= 5
        assert kept <= 0.5 * dropped, figures


def test_every_prompt_carries_its_provenance(full_run, worlds):
    out, _ = full_run
    the_world = world_lib.load_world(worlds[0])
    subcategories = {sc.name: sc.domain for sc in catalog.SUBCATEGORIES}
    prompts = [records.Prompt.from_record(r) for r in ledger.read_jsonl(out / "prompts.jsonl")]
    assert len(prompts) >= 40 and len({p.id for p in prompts}) == len(prompts)
    earliest = the_world.today - dt.timedelta(days=20)
    rule = confusion.CrowdRule()
    for p in prompts:
        page = the_world.pages[p.source_url]
        assert page.date == p.date and earliest.isoformat() <= p.date <= the_world.today.isoformat()
        assert p.source_headline == page.title and p.target in page.title or p.mode == "image"
        assert subcategories[p.subcategory] == p.domain and p.today == the_world.today.isoformat()
        assert p.keep_reason.startswith(("crowded", "image-oriented"))
        labels = tuple(p.evidence["labels"])
        assert rule.verdict(labels) == (True, "crowded") and len(labels) == p.evidence["results"] <= rule.top_k
    category = [records.Prompt.from_record(r) for r in ledger.read_jsonl(out / "category_prompts.jsonl")]
    assert category and all(p.category == "Sports" and p.keep_reason for p in category)


def test_report_counts_every_stage(full_run):
    out, report = full_run
    stages = report["stages"]
    for name in ("news", "headlines", "extract", "dedupe", "confusion", "extract_image", "category", "tasks",
                 "teacher", "groundtruth"):
        assert name in stages, name
    assert stages["confusion"]["dropped"].keys() <= {"too_easy", "not_crowded"}
    assert stages["groundtruth"]["dropped"].get("too_long", 0) >= 1  # the test's short cut-off bites
    assert "| confusion |" in (out / "report.md").read_text()
    accounting = json.loads((out / "accounting.json").read_text())
    news_queries = 21 * sum(len(s.meta_queries) for s in taxonomy.world_meta_queries())
    assert accounting["stages"]["news"]["world"]["requests"] == news_queries
    assert sum(1 for _ in open(out / "calls" / "world.jsonl")) == accounting["services"]["world"]["requests"]


def test_teacher_keeps_only_trajectories_that_pass_the_search_judge(full_run):
    out, _ = full_run
    book = ledger.Ledger(out / "stages" / "teacher.jsonl")
    kept = {t.task_id: t for p in shards.list_shards(out / "teacher" / "shards") for t in shards.read_shard(p)}
    assert set(kept) == {e.key for e in book.kept()} and len(kept) >= 30
    for traj in kept.values():
        assert traj.reward_breakdown["breakdown"]["search_pass"] is True
    assert all(e.reason != "search_pass" for e in book.entries() if e.status == "dropped")


def test_sharegpt_export_renders_exactly_the_shard_tokens(full_run, tokenizer_dir):
    out, _ = full_run
    data = sft_file.SftFile(sft_file.SftColumns.from_dataset_info(out / "splits/sft/sharegpt/dataset_info.json",
                                                                  "gen_sft"))
    trajectories = [t for p in shards.list_shards(out / "splits/sft/shards") for t in shards.read_shard(p)]
    assert len(data) == len(trajectories) >= 10
    renderer = chat.ChatRenderer(load_tokenizer(tokenizer_dir))
    for i, traj in enumerate(trajectories):
        example = data.example(i, renderer=renderer, vision=tiny_policy.VISION)
        np.testing.assert_array_equal(example["input_ids"], traj.token_ids)
        np.testing.assert_array_equal(example["loss_mask"][1:], traj.loss_mask[1:])
        arrays = traj.to_arrays()
        np.testing.assert_array_equal(example["image_grid_thw"], arrays["image_grid_thw"])


def test_splits_load_with_the_task_readers(full_run):
    out, _ = full_run
    summary = json.loads((out / "splits" / "splits.json").read_text())
    ids = {name: set(summary["ids"][name]) for name in splits.SPLITS}
    assert not (ids["benchmark"] & ids["rl"]) and not (ids["benchmark"] & ids["sft"]) and not (ids["rl"] & ids["sft"])
    assert len(ids["benchmark"]) == 6 and len(ids["rl"]) >= 5 and len(ids["sft"]) >= 10
    bench = data_lib.load_tasks(out / "splits/benchmark/KnowGen-Bench.json")
    assert {t.id for t in bench} == ids["benchmark"]
    assert all(t.metadata["category"] and t.metadata["source_headline"] is not None for t in bench)
    assert all((out / "splits/benchmark" / "images" / f"{t.id}.png").is_file() for t in bench)
    rl = data_lib.load_tasks(out / "splits/rl/rl_data.json")
    assert {t.id for t in rl} == ids["rl"] and all(t.ground_truth.endswith(".png") for t in rl)
    exact = data_lib.load_tasks(out / "splits/rl/world")
    assert {t.id for t in exact} == ids["rl"] and all(t.ground_truth["target_id"] for t in exact)
    sft_rows = data_lib.load_tasks(out / "splits/sft/sharegpt/dataset_info.json")
    assert len(sft_rows) == len(ids["sft"])
    with env_lib.make("savanna_sim", world=str(out / "splits/rl/world"), **ENV_OPTIONS) as tool_env:
        expert = agents.ExpertAgent(OracleDetector(tool_env.backend.world))
        state = agents.run_episode(tool_env, exact[0], expert)
        assert tool_env.score(state).breakdown["search_pass"]  # exact rewards work on the split's world


def test_sft_steps_on_the_shards(full_run, tokenizer_dir):
    from ranger_jax.rl import learner as learner_lib
    from ranger_jax.rl import learner_config, sft

    out, _ = full_run
    tokenizer = load_tokenizer(tokenizer_dir)
    dataset = sft.dataset_for(out / "splits/sft/shards", tokenizer=tokenizer, batch_size=2,
                              length_buckets=(MAX_TOKENS + 512,), vision=tiny_policy.VISION)
    size = tiny_policy.TinyPolicySize(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                      vocab_size=tokenizer.vocab_size, vision_depth=1, vision_hidden_size=16)
    model = tiny_policy.init_policy(tokenizer, size, seed=0)
    settings = learner_config.LearnerConfig(objective="sft", learning_rate=1e-2, schedule="constant",
                                            weight_decay=0.0, max_grad_norm=1.0)
    result = sft.train(learner_lib.Learner(model, settings), dataset, num_steps=2, progress=False)
    assert result.num_steps == 2 and np.isfinite(result.last["loss"]) and result.last["tokens"] > 0


def test_rerun_resumes_without_new_calls(full_run, worlds, tokenizer_dir):
    out, report = full_run
    before = json.loads((out / "accounting.json").read_text())
    plan = pipeline.plan(config(worlds[0], out, tokenizer_dir))
    assert plan["stages"]["news"] == {"world news searches": 0} and plan["stages"]["extract"] == {"template calls": 0}
    again = pipeline.run(config(worlds[0], out, tokenizer_dir, categories=("Sports",), calls_per_category=1,
                                prompts_per_call=3))
    assert again["accounting"]["services"] == before["services"]
    assert again["stages"]["teacher"]["num_kept"] == report["stages"]["teacher"]["num_kept"]


def test_dry_run_counts_the_news_searches(worlds, tmp_path, capsys):
    from ranger_jax.datagen import cli

    assert cli.main(["--out", str(tmp_path / "r"), "--world", str(worlds[1]), "--days", "3", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    searches = 3 * sum(len(s.meta_queries) for s in taxonomy.world_meta_queries())
    assert f"news: world news searches {searches}" in printed and not (tmp_path / "r" / "stages").exists()
