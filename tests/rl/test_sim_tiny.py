"""The sim-tiny main job end to end at a micro size: every stage runs and every promised output exists."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import runpy
import shutil
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from support.scripted_learner import ScriptedLearner

from ranger_jax import cpu_affinity, process_pool
from ranger_jax.data import shards, shared_prefix
from ranger_jax.models import qwen3_vl
from ranger_jax.rl import diagnostics, metrics, sim_tiny, tiny_policy
from ranger_jax.rollout import trained_env

REPO = Path(__file__).resolve().parents[2]
MICRO = sim_tiny.SimTinyConfig(
    sft_worlds=1, tasks_per_world=4, grpo_tasks=4, eval_tasks=4, sft_steps=2, sft_batch=4, grpo_steps=2,
    copy_warmup_steps=2, first_turn_steps=2, first_turn_max_steps=3, copy_rehearsal=True, branch_turns=(0, 1),
    sft_target_loss=1e-6, sft_extension_steps=1, sft_max_extra_steps=2,
    grpo_tasks_per_step=2, group_size=2, grpo_learner_rows=2, actor_concurrency=1, max_new_tokens=24,
    progress=False,
    teacher_min_reward=0.0, grpo_augment=True,
    advantages="prefix-tree", grpo_frozen=("embed_tokens", "mlp"), greedy_member=True, draw_below=1.0, max_draws=0,
    size=tiny_policy.TinyPolicySize(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=512,
                                    vision_depth=1, vision_hidden_size=16))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim_tiny")
    return out, sim_tiny.run(dataclasses.replace(MICRO, compilation_cache_dir=str(out / "jax_cache")), out)


def test_summary_has_every_score(run):
    out, summary = run
    on_disk = json.loads((out / "summary.json").read_text())
    for who in ("naive", "teacher", "expert", "sft", "grpo"):
        for what in ("search_score", "reward"):
            assert 0.0 <= on_disk[f"{who}_{what}"] <= 1.0
    assert on_disk["num_eval_tasks"] == 4 and on_disk["wall_seconds"] > 0
    assert on_disk["compilation_cache"] == str(out / "jax_cache")  # where programs came from, for reading the wall
    assert on_disk["expert_search_score"] == 1.0
    assert on_disk["eval_world_seed"] not in on_disk["train_world_seeds"]
    assert on_disk["world_version"] == 1
    assert on_disk["pre_sft"]["copy_warmup"]["repeat_loss"] > 0 and on_disk["config"]["sft_augment"] is True
    assert on_disk["pre_sft"]["sft_shapes_precompiled"] >= 1  # compiled in a thread during the stages before SFT
    first = on_disk["pre_sft"]["first_turns"]
    assert first["loss"] > 0 and first["steps"] == 3 and first["copy_learned"] is False  # extended to the cap
    assert first["recent_loss"] > MICRO.first_turn_target_loss
    # the first attempt's copy was not learned: both stages again from seed + 1000, whose first turns were extended
    attempts = on_disk["pre_sft"]["attempts"]
    assert [(a["seed"], a["steps"]) for a in attempts] == [(MICRO.seed, 2), (MICRO.seed + 1000, 3)]
    assert attempts[-1]["recent_loss"] == first["recent_loss"]
    assert on_disk["grpo_minus_sft_reward"]["num_tasks"] == 4
    # SFT above its target went on one step at a time, resumed with a stretched schedule, up to its cap
    assert on_disk["sft"]["steps"] == 4 and on_disk["sft"]["recent_loss"] > MICRO.sft_target_loss
    rows = [json.loads(line) for line in (out / "metrics" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "sft/loss" in r] == [1, 2, 3, 4]
    # each update's two batches (one group each): one whose group's rewards were all equal is left out, never both
    for row in (r for r in rows if "grpo/loss" in r):
        assert row["grpo/skipped_batches"] in (0, 1)
        assert row["grpo/skipped_batches"] == 0 or row["grpo/zero_variance_share"] > 0
    for folder in (out / "worlds").iterdir():  # the first world generation, as the three-call teacher needs
        assert json.loads((folder / "world.json").read_text()).get("world_version", 1) == 1


def test_outputs_exist(run, every_program_cacheable):
    out, _ = run
    assert (out / "curves.png").read_bytes().startswith(b"\x89PNG")
    assert "<html" in (out / "viewer.html").read_text().lower()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "ranger_env.json"):
        assert (out / "policy" / name).is_file()
    recorded = trained_env.read(out / "policy")
    assert recorded.env["tools"] == list(sim_tiny.TOOLS) and recorded.episode["max_new_tokens"] == 24
    assert recorded.world == {"world_version": sim_tiny.SimTinyConfig().world_version}  # what evals compare with
    assert any((out / "jax_cache").iterdir())  # the actor process compiled into the run's compilation cache
    before = sorted(p.name for p in (out / "jax_cache").iterdir())
    jax.jit(lambda x: jnp.sin(x) * 5.25 - 0.5)(jnp.ones((3, 11))).block_until_ready()  # a program new to the run
    assert sorted(p.name for p in (out / "jax_cache").iterdir()) == before  # the run closed its cache on return


def test_grpo_ran_decoupled_with_versions_and_staleness(run):
    out, summary = run
    grpo = summary["grpo"]
    # each step's two groups ran as two learner batches (grpo_learner_rows) that made one update
    assert grpo["num_steps"] == 2 and grpo["final_version"] == 2 and grpo["episodes"] == 8
    assert all(int(k) >= 0 for k in grpo["staleness"]) and sum(grpo["staleness"].values()) == grpo["episodes"]
    records = _records(out / "grpo_shards")
    assert {t.policy_version for t in records} <= {0, 1, 2} and 0 in {t.policy_version for t in records}
    assert {t.metadata["sample_from_turn"] for t in records} <= {0, 1}  # the groups' branching turns
    assert {t.metadata["sample_turns"] for t in records} == {1}  # one sampled turn each (the default)
    for t in records:
        assert sum(turn["sampled"] for turn in t.metadata["turns"]) <= 1
    by_group = {}
    for t in records:  # each group's first member played its sampled turn greedily (`greedy_member`)
        by_group.setdefault(t.group_id, {})[t.sample_index] = t.metadata["greedy_member"]
    full = [members for members in by_group.values() if len(members) == 2]
    assert full and all(members == {0: True, 1: False} for members in full)
    assert sim_tiny.SimTinyConfig().greedy_member is False
    with pytest.raises(ValueError, match="greedy_member must be a bool"):
        dataclasses.replace(MICRO, greedy_member="yes")
    assert sim_tiny.SimTinyConfig().branch_turns == (2, 3) and sim_tiny.SimTinyConfig().sample_turns == 1
    with pytest.raises(ValueError, match="SimTinyConfig.sample_turns must be None or an int >= 1"):
        dataclasses.replace(MICRO, sample_turns=0)
    with pytest.raises(ValueError, match="branch_turns must be a non-empty tuple of ints >= 0"):
        dataclasses.replace(MICRO, branch_turns=(-1,))
    # the learner ran the groups as shared-prefix batches, their words permuted per group
    assert summary["config"]["shared_prefix"] is True and summary["config"]["grpo_augment"] is True
    assert sim_tiny.SimTinyConfig().grpo_augment is False  # measured not to help (docs/sim_tiny.md)
    with pytest.raises(ValueError, match="shared_prefix needs sample_turns=1"):
        dataclasses.replace(MICRO, sample_turns=None)
    assert dataclasses.replace(MICRO, sample_turns=None, shared_prefix=False).sample_turns is None
    assert (out / "weights" / "latest").read_text().strip() == "2"
    # every published version is a complete policy folder: evaluations run it with the settings it was trained in
    assert (out / "weights" / "v000002" / "ranger_env.json").read_bytes() == \
        (out / "policy" / "ranger_env.json").read_bytes()
    # the two actors ran the two rounds the two steps took, a group each, and stopped (`--max-rounds`), none sampled
    # for nothing
    assert sorted(p.name.rsplit("-", 1)[0] for p in shards.list_shards(out / "grpo_shards")) == [
        "actor0-r00000", "actor0-r00001", "actor1-r00000", "actor1-r00001"]
    for part in (0, 1):
        rounds = [json.loads(line) for line in (out / "metrics" / f"actor{part}.jsonl").read_text().splitlines()]
        assert [(r["round"], r["groups"]) for r in rounds] == [(0, 1), (1, 1)]
    assert (out / "weights" / "STOP").exists()
    # GRPO left the frozen parameters (`grpo_frozen`) as SFT made them
    sft_model = qwen3_vl.load(out / "sft_policy")
    assert sim_tiny.grpo_learner(MICRO, sft_model).config.frozen == ("embed_tokens", "mlp")
    sft, final = _params(sft_model), _params(qwen3_vl.load(out / "policy"))
    frozen = [k for k in sft if "embed_tokens" in k or ".mlp." in k]
    assert frozen and all(np.array_equal(sft[k], final[k]) for k in frozen)


def _records(folder):
    """Every trajectory of the shards in `folder`, shard by shard."""
    return [t for path in shards.list_shards(folder) for t in shards.read_shard(path)]


def _params(model):
    state = nnx.state(model, nnx.Param)
    return {jax.tree_util.keystr(p, simple=True, separator="."): np.asarray(v)
            for p, v in jax.tree_util.tree_leaves_with_path(state)}


def _actor_flags(config, tmp_path, part=0):
    """GRPO actor `part`'s command of `config` as {flag: value}."""
    command = sim_tiny.actor_command(config, env_file=tmp_path / "env.toml", grpo_world=tmp_path / "w",
                                     weights_dir=tmp_path / "weights", shards_dir=tmp_path / "shards",
                                     metrics_path=tmp_path / "m.jsonl", part=part)
    return {command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")}


def test_grpo_sampling_settings_reach_the_actor_and_rollouts(tmp_path):
    config = dataclasses.replace(MICRO, temperature=0.8, top_p=0.9, top_k=3, draw_below=0.7, max_draws=2,
                                 greedy_member=False)
    flags = _actor_flags(config, tmp_path)
    assert (flags["--temperature"], flags["--top-p"], flags["--top-k"]) == ("0.8", "0.9", "3")
    assert (flags["--draw-below"], flags["--max-draws"]) == ("0.7", "2")
    sampled = sim_tiny.rollout_config(config, group_size=2).episode.sampling
    assert (sampled.temperature, sampled.top_p, sampled.top_k, sampled.draw_below, sampled.max_draws) == \
        (0.8, 0.9, 3, 0.7, 2)
    greedy = sim_tiny.rollout_config(config, greedy=True).episode.sampling
    assert (greedy.temperature, greedy.top_p, greedy.top_k, greedy.limits_draws) == (0.0, 1.0, -1, False)
    assert "--greedy-member" in sim_tiny.actor_command(
        dataclasses.replace(config, greedy_member=True), env_file=tmp_path / "env.toml", grpo_world=tmp_path / "w",
        weights_dir=tmp_path / "weights", shards_dir=tmp_path / "shards", metrics_path=tmp_path / "m.jsonl")
    with pytest.raises(ValueError, match="draw_below must be in"):
        dataclasses.replace(MICRO, draw_below=0.0)
    with pytest.raises(ValueError, match="top_p"):
        dataclasses.replace(MICRO, top_p=1.5)
    with pytest.raises(ValueError, match="top_k"):
        dataclasses.replace(MICRO, top_k=0)
    with pytest.raises(ValueError, match=r"SimTinyConfig.advantages must be 'group' or 'prefix-tree'; got 'tree'"):
        dataclasses.replace(MICRO, advantages="tree")
    assert dataclasses.replace(MICRO, grpo_frozen=["mlp"]).grpo_frozen == ("mlp",)  # as read back from JSON
    with pytest.raises(ValueError, match=r"SimTinyConfig.grpo_frozen must be a sequence of parameter path names"):
        dataclasses.replace(MICRO, grpo_frozen="mlp")


def test_large_steps_run_through_the_actor_in_batches_of_its_concurrency(tmp_path):
    config = sim_tiny.configure(grpo_schedule="large-batch", overrides={"seed": 4})
    assert (config.grpo_tasks, config.grpo_tasks_per_step, config.group_size, config.grpo_steps) == (720, 60, 4, 12)
    assert config.grpo_learning_rate == 2e-4 and config.seed == 4 and config.actor_concurrency == 32
    flags = _actor_flags(config, tmp_path)
    # a step's 240 episodes run 32 at a time, 16 in each of two actor processes that split the round's groups,
    # each part one shard, trained as one batch
    assert (flags["--tasks-per-round"], flags["--group-size"]) == ("60", "4")
    assert (flags["--concurrency"], flags["--records-per-shard"]) == ("16", "240")
    assert (flags["--prefix"], flags["--part"]) == ("actor0", "0/2")
    second = _actor_flags(config, tmp_path, part=1)
    assert (second["--prefix"], second["--part"], second["--concurrency"]) == ("actor1", "1/2", "16")
    assert sim_tiny.grpo_rows(config) == 240 and sim_tiny.actor_rows(config) == 32
    alone = dataclasses.replace(config, actor_processes=1)
    assert sim_tiny.rows_per_actor(alone) == 32 and _actor_flags(alone, tmp_path)["--part"] == "0/1"
    assert sim_tiny.rows_per_actor(dataclasses.replace(config, actor_concurrency=3, actor_processes=4)) == 1
    with pytest.raises(ValueError, match="actor_processes must be a positive int"):
        dataclasses.replace(config, actor_processes=0)
    assert sim_tiny.actor_rows(dataclasses.replace(config, actor_concurrency=500)) == 240
    small = sim_tiny.configure(grpo_schedule="small-steps")
    assert sim_tiny.actor_rows(small) == sim_tiny.grpo_rows(small) == 32
    assert (config.draw_below, config.max_draws, config.grpo_frozen) == (1.0, 0, ())  # as measured: every token
    with pytest.raises(ValueError, match="actor_concurrency must be a positive int"):
        dataclasses.replace(config, actor_concurrency=0)
    known = "default, long, find-object-turn, short, groups-of-4, three-steps, small-steps, large-batch, decision-batch"
    with pytest.raises(ValueError, match=f"unknown GRPO schedule 'huge'; known: {known}"):
        sim_tiny.configure(grpo_schedule="huge")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pinning needs os.sched_setaffinity")
def test_two_or_more_actors_each_run_on_their_own_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_affinity, "usable_cpus", lambda: [0, 1, 2, 3])
    config = sim_tiny.configure()  # two actors
    assert [_actor_flags(config, tmp_path, part=i)["--cpus"] for i in range(2)] == ["0,1", "2,3"]
    three = dataclasses.replace(config, actor_processes=3)
    assert [sim_tiny.actor_cpus(three, i) for i in range(3)] == [[0, 1], [2], [3]]
    monkeypatch.setattr(cpu_affinity, "usable_cpus", lambda: [0, 1])
    assert [_actor_flags(config, tmp_path, part=i)["--cpus"] for i in range(2)] == ["0", "1"]
    for unpinned in (dataclasses.replace(config, pin_actors=False), dataclasses.replace(config, actor_processes=1)):
        assert "--cpus" not in _actor_flags(unpinned, tmp_path) and sim_tiny.actor_cpus(unpinned, 0) is None


def test_actors_with_fewer_rows_than_a_group_are_warned_about_not_refused():
    config = sim_tiny.configure()  # 32 rows over 2 actors, groups of 8
    assert sim_tiny.actor_rows_warning(config) is None
    assert sim_tiny.actor_rows_warning(dataclasses.replace(config, actor_processes=4)) is None  # 8 rows: one group
    crowded = dataclasses.replace(config, actor_processes=5)  # 6 rows each
    message = sim_tiny.actor_rows_warning(crowded)
    assert message is not None and "each of the 5 GRPO actor process(es) runs 6 row(s)" in message
    assert "a group of 8" in message and "actor_concurrency to at least 40" in message
    assert sim_tiny.actor_rows_warning(dataclasses.replace(crowded, branch_turns=(0,))) is None  # no trunk to share


def test_grpo_groups_branch_at_the_find_object_turn_or_the_answer_and_older_schedules_keep_turn_2():
    # half the groups branch at the find_object turn, half at the answer (the answer's JSON is trained too); every
    # schedule measured before keeps the find_object turn alone, so its documented figures still describe it
    for name in sim_tiny.GRPO_SCHEDULES:
        expected = (2, 3) if name in ("default", "long") else (2,)
        assert sim_tiny.configure(grpo_schedule=name).branch_turns == expected, name
    before = sim_tiny.configure(grpo_schedule="find-object-turn")
    assert before == dataclasses.replace(sim_tiny.configure(), branch_turns=(2,))
    # the actor is told both turns
    command = sim_tiny.actor_command(sim_tiny.configure(), env_file=Path("env.toml"), grpo_world=Path("w"),
                                     weights_dir=Path("weights"), shards_dir=Path("shards"),
                                     metrics_path=Path("actor0.jsonl"))
    assert command[command.index("--branch-turns") + 1] == "2,3"


def test_a_grpo_step_above_the_learner_batch_runs_in_batches_of_whole_groups():
    # the default's (and "long"'s and "find-object-turn"'s) 960-episode steps run as 4 learner batches, every other
    # named schedule's step as one, as measured; a larger step spans batches of whole groups
    for name in sim_tiny.GRPO_SCHEDULES:
        config = sim_tiny.configure(grpo_schedule=name)
        batches = -(-config.grpo_tasks_per_step // sim_tiny.learner_groups(config))
        assert batches == (4 if name in ("default", "long", "find-object-turn") else 1), name
    long = sim_tiny.configure(grpo_schedule="long")  # 8 steps of 960 episodes, each task of its world once
    assert (long.grpo_steps, long.grpo_tasks_per_step, long.group_size, long.grpo_tasks) == (8, 120, 8, 960)
    assert long == sim_tiny.configure()
    big = dataclasses.replace(sim_tiny.configure(grpo_schedule="short"), grpo_tasks_per_step=120)
    assert sim_tiny.learner_groups(big) == 30 and sim_tiny.grpo_rows(big) == 960
    assert sim_tiny.learner_groups(dataclasses.replace(big, grpo_learner_rows=100)) == 12
    assert sim_tiny.learner_groups(dataclasses.replace(big, grpo_learner_rows=3)) == 1  # at least one group
    with pytest.raises(ValueError, match="grpo_learner_rows must be a positive int; got 0"):
        dataclasses.replace(big, grpo_learner_rows=0)


def test_grpo_learner_batches_come_in_few_shapes():
    # the step compiles once per shape: coarse pixel and image steps, prefixes from 1,152 tokens, and a round's few
    # leftover groups in a batch of 8 or 16 groups (the suffix rows scaled alike)
    tokenizer = types.SimpleNamespace(pad_id=0, image_pad_id=6)
    spec = sim_tiny.grpo_batch_spec(sim_tiny.configure(), tokenizer)
    assert (spec.prefix_rows, spec.batch_size, spec.prefix_row_buckets) == (30, 240, (8, 16))
    assert (spec.patch_step, spec.image_step, spec.length_buckets[0]) == (1024, 64, 1152)
    assert spec.max_row_length >= 2048
    assert shared_prefix.batch_spec_for(spec, 2, 16).batch_size == 64
    assert shared_prefix.batch_spec_for(spec, 9, 72).batch_size == 128
    assert shared_prefix.batch_spec_for(spec, 17, 136) is spec
    assert shared_prefix.batch_spec_for(spec, 8, 70).prefix_rows == 16  # 8 groups but more rows than 64
    few = sim_tiny.grpo_batch_spec(dataclasses.replace(sim_tiny.configure(), grpo_learner_rows=96), tokenizer)
    assert (few.prefix_rows, few.prefix_row_buckets) == (12, (8,))  # only the buckets below the batch's groups
    plain = sim_tiny.grpo_batch_spec(dataclasses.replace(sim_tiny.configure(), shared_prefix=False), tokenizer)
    assert plain.prefix_rows == 0 and plain.patch_step == 256  # rows without shared prefixes: the SFT shapes


def test_default_grpo_draws_uncertain_tokens_in_large_steps_and_trains_attention_alone(tmp_path):
    default = sim_tiny.configure()
    flags = _actor_flags(default, tmp_path)
    assert (flags["--draw-below"], flags["--max-draws"], flags["--records-per-shard"]) == ("0.9", "2", "960")
    # two actor processes of 16 rows each split every round (`--part`)
    assert (flags["--concurrency"], flags["--part"], flags["--max-rounds"]) == ("16", "0/2", "8")
    assert (default.grpo_steps, default.grpo_tasks, default.grpo_learning_rate) == (8, 960, 3e-4)
    assert default.grpo_frozen == ("embed_tokens", "mlp", "visual")  # the learner trains attention alone
    assert (flags["--tasks-per-round"], flags["--group-size"]) == ("120", "8")  # a step's 960 episodes: 120 groups
    assert flags["--sample-turns"] == "1"

    def command(config):
        return sim_tiny.actor_command(config, env_file=tmp_path / "env.toml", grpo_world=tmp_path / "w",
                                      weights_dir=tmp_path / "weights", shards_dir=tmp_path / "shards",
                                      metrics_path=tmp_path / "m.jsonl")

    assert "--share-continuations" in command(default)  # the offline world answers a history alike every time
    assert "--share-continuations" not in command(dataclasses.replace(default, share_continuations=False))
    assert "--share-continuations" not in command(dataclasses.replace(default, sample_turns=None,
                                                                      shared_prefix=False))
    assert sim_tiny.grpo_rows(default) == 960
    short = sim_tiny.configure(grpo_schedule="short")  # the default before: 4 steps of 30 groups of 8
    assert (short.grpo_steps, short.grpo_tasks_per_step, short.grpo_tasks, short.group_size) == (4, 30, 240, 8)
    assert sim_tiny.grpo_rows(short) == 240 and _actor_flags(short, tmp_path)["--max-rounds"] == "4"
    fours = sim_tiny.configure(grpo_schedule="groups-of-4")  # the default before groups of 8: 60 groups of 4
    assert (fours.grpo_tasks_per_step, fours.group_size, fours.grpo_steps, fours.draw_below) == (60, 4, 4, 0.9)
    assert sim_tiny.grpo_rows(fours) == 240 and fours.grpo_frozen == default.grpo_frozen
    three = sim_tiny.configure(grpo_schedule="three-steps")
    assert _actor_flags(three, tmp_path)["--max-rounds"] == "3" and three.grpo_frozen == default.grpo_frozen
    assert (three.grpo_tasks_per_step, three.group_size) == (60, 4)
    every = sim_tiny.configure(grpo_schedule="decision-batch")  # four steps of groups of 4, every parameter trained
    assert (every.grpo_steps, every.grpo_frozen, every.draw_below, every.group_size) == (4, (), 0.9, 4)
    small = sim_tiny.configure(grpo_schedule="small-steps")
    assert (small.group_size, small.grpo_steps, small.draw_below, small.max_draws, small.grpo_frozen) == \
        (8, 6, 1.0, 0, ())


@pytest.mark.parametrize("stop, learned_at, steps, learned", [
    (None, 100, 700, True), (None, 745, 800, True), (None, 1030, 1100, True), (None, None, 1400, False),
    # stopped once the 50 last steps' mean is at or below `first_turn_stop_loss`: the 50th step of loss 0.01
    (0.02, 100, 149, True), (0.02, 745, 794, True), (0.02, 1030, 1079, True), (0.02, None, 1400, False),
    (0.005, 100, 700, True)])  # never that low: the stage's steps
def test_first_turns_go_on_until_the_copy_is_learned(stop, learned_at, steps, learned, capsys):
    config = dataclasses.replace(MICRO, first_turn_steps=700, first_turn_max_steps=1400, first_turn_target_loss=0.05,
                                 first_turn_stop_loss=stop)
    learner = ScriptedLearner(lambda s: 0.01 if learned_at is not None and s >= learned_at else 1.2)
    result = sim_tiny.train_first_turns(config, learner, iter(lambda: {}, None), metrics=None)
    assert (result["steps"], result["copy_learned"], learner.step_count) == (steps, learned, steps)
    assert result["recent_loss"] == pytest.approx(0.01 if learned else 1.2)
    err = capsys.readouterr().err
    assert ("training to step 800" in err) == (steps > 700)
    assert ("warning: first turns end at mean loss 1.200 after 1400 steps" in err) == (not learned)
    unextended = sim_tiny.train_first_turns(config, ScriptedLearner(lambda s: 1.2), iter(lambda: {}, None),
                                            metrics=None, extend=False)
    assert (unextended["steps"], unextended["copy_learned"]) == (700, False) and not capsys.readouterr().err
    with pytest.raises(ValueError, match="pre_sft_attempts must be at least 1; got 0"):
        dataclasses.replace(config, pre_sft_attempts=0)
    with pytest.raises(ValueError, match=r"first_turn_max_steps \(600\) must be at least first_turn_steps \(700\)"):
        dataclasses.replace(config, first_turn_max_steps=600)
    with pytest.raises(ValueError, match="first_turn_target_loss must be a number > 0; got 0"):
        dataclasses.replace(config, first_turn_target_loss=0)
    for bad in (0, 0.06, True, "0.02"):
        with pytest.raises(ValueError, match=r"first_turn_stop_loss must be None or a number in \(0, "
                                             r"first_turn_target_loss=0.05\]; got"):
            dataclasses.replace(config, first_turn_stop_loss=bad)


@pytest.mark.parametrize("loss, steps, learned", [
    (lambda s: 0.15 if s < 760 else 0.01, 800, True),  # made the jump, short of the target: goes on
    (lambda s: 0.15, 1400, False),  # never reaches it: goes on to the cap, and the caller starts again
    (lambda s: 0.15 if s < 760 else 0.5, 800, False),  # loses the jump: stops, and the caller starts again
    (lambda s: 1.2, 700, False)])  # no jump: stops at once
def test_an_attempt_that_made_the_jump_goes_on_instead_of_starting_again(loss, steps, learned, capsys):
    config = dataclasses.replace(MICRO, first_turn_steps=700, first_turn_max_steps=1400, first_turn_target_loss=0.1,
                                 first_turn_stop_loss=None, first_turn_jump_loss=0.2)
    learner = ScriptedLearner(loss)
    result = sim_tiny.train_first_turns(config, learner, iter(lambda: {}, None), metrics=None,
                                        extend_below=config.first_turn_jump_loss)
    assert (result["steps"], result["copy_learned"], learner.step_count) == (steps, learned, steps)
    err = capsys.readouterr().err
    assert ("0.150 over the last steps is above 0.1 (at or below 0.2: the copy is used, short of the target); "
            "training to step 800") in err if steps > 700 else not err
    assert "warning" not in err  # an attempt that may start again does not warn
    for bad in (0.1, 0.05, True, "0.2"):
        with pytest.raises(ValueError, match=r"first_turn_jump_loss must be None or a number above "
                                             r"first_turn_target_loss=0.1; got"):
            dataclasses.replace(config, first_turn_jump_loss=bad)
    assert dataclasses.replace(config, first_turn_jump_loss=None).first_turn_jump_loss is None


@pytest.mark.parametrize("jump, ends, calls", [
    # the first attempt may go on past its steps once it has made the jump, and here it reaches the target
    (0.2, [0.05], [(1, True, 0.2)]),
    # it did not make the jump: the second, last attempt extends without a bound
    (0.2, [0.5, 0.04], [(1, True, 0.2), (1001, True, None)]),
    (None, [0.15, 0.04], [(1, False, None), (1001, True, None)])])  # no jump rule: the first starts again
def test_pre_sft_lets_only_an_attempt_that_may_start_again_stop_at_the_jump_loss(run, jump, ends, calls,
                                                                                monkeypatch):
    out, _ = run
    config = dataclasses.replace(MICRO, seed=1, copy_warmup_steps=0, first_turn_target_loss=0.1,
                                 first_turn_jump_loss=jump, pre_sft_attempts=2)
    seen, outcomes = [], iter(ends)

    def first_turns(config, learner, batches, metrics, *, extend, extend_below, log_prefix):
        seen.append((batches.seed, extend, extend_below))
        loss = next(outcomes)
        return {"loss": loss, "steps": 7, "recent_loss": loss, "copy_learned": loss <= config.first_turn_target_loss}

    from ranger_jax.processing import tokenizer as tokenizer_lib

    monkeypatch.setattr(sim_tiny, "train_first_turns", first_turns)
    tokenizer = tokenizer_lib.load_tokenizer(out / "tokenizer")
    _, stages = sim_tiny.pre_sft(config, tokenizer, shards.TrajectorySource(out / "sft_data"), None, None)
    assert seen == calls
    assert [a["recent_loss"] for a in stages["attempts"]] == ends
    assert [a["seed"] for a in stages["attempts"]] == [seed for seed, _, _ in calls]


def test_sft_goes_on_while_above_its_target_on_a_grid_of_extensions():
    config = dataclasses.replace(MICRO, sft_steps=300, sft_target_loss=0.05, sft_extension_steps=300,
                                 sft_max_extra_steps=900)
    assert sim_tiny.next_sft_steps(config, 300, 0.03) is None  # reached: the runs that converge are unchanged
    assert sim_tiny.next_sft_steps(config, 300, 0.31) == 600
    assert sim_tiny.next_sft_steps(config, 600, 0.10) == 900
    assert sim_tiny.next_sft_steps(config, 900, 0.06) == 1200
    assert sim_tiny.next_sft_steps(config, 1200, 0.06) is None  # the cap
    assert sim_tiny.next_sft_steps(config, 450, 0.01) == 600  # killed inside an extension: its end, whatever the loss
    assert sim_tiny.next_sft_steps(config, 300, None) is None  # no loss known (a checkpoint without them)
    assert sim_tiny.next_sft_steps(dataclasses.replace(config, sft_max_extra_steps=400), 600, 0.1) == 700
    assert sim_tiny.next_sft_steps(dataclasses.replace(config, sft_extension_steps=0), 300, 0.3) is None
    with pytest.raises(ValueError, match="sft_target_loss must be a number > 0; got -1"):
        dataclasses.replace(config, sft_target_loss=-1)
    with pytest.raises(ValueError, match="sft_max_extra_steps must be an int >= 0; got 1.5"):
        dataclasses.replace(config, sft_max_extra_steps=1.5)


def test_the_compilation_cache_is_the_shared_folder_unless_the_config_names_one(tmp_path, monkeypatch):
    from ranger_jax import compilation_cache

    monkeypatch.setenv(compilation_cache.DEFAULT_DIR_VAR, str(tmp_path / "shared"))
    assert sim_tiny.compilation_cache_folder(sim_tiny.SimTinyConfig()) == tmp_path / "shared"
    named = sim_tiny.configure(overrides=sim_tiny.config_overrides([f"compilation_cache_dir={tmp_path / 'mine'}"]))
    assert sim_tiny.compilation_cache_folder(named) == tmp_path / "mine"
    assert sim_tiny.compilation_cache_folder(dataclasses.replace(named, compilation_cache=False)) is None
    for bad in ("", "  ", 3):
        with pytest.raises(ValueError, match="compilation_cache_dir must be None .the shared default. or a folder"):
            sim_tiny.SimTinyConfig(compilation_cache_dir=bad)


def test_config_overrides_are_typed_by_the_field():
    overrides = sim_tiny.config_overrides(["grpo_learning_rate=2e-4", "group_size=4", "branch_turns=[1, 2]",
                                           "sample_turns=null", "shared_prefix=false", "teacher_query=names",
                                           "grpo_tasks_per_step = 3", 'size={"hidden_size": 64}', "top_p=1"])
    assert overrides == {"grpo_learning_rate": 2e-4, "group_size": 4, "branch_turns": (1, 2), "sample_turns": None,
                         "shared_prefix": False, "teacher_query": "names", "grpo_tasks_per_step": 3,
                         "size": dataclasses.replace(sim_tiny.SimTinyConfig().size, hidden_size=64), "top_p": 1.0}
    assert isinstance(overrides["top_p"], float)
    config = sim_tiny.configure(overrides=overrides)
    assert config.branch_turns == (1, 2) and config.size.hidden_size == 64
    for pair, message in (("sft_steps", "--set needs KEY=VALUE; got 'sft_steps'"),
                          ("sft_stepz=3", "SimTinyConfig has no field 'sft_stepz'; fields: .*sft_steps"),
                          ("sft_steps=1.5", r"--set sft_steps=1.5: expected int like 300"),
                          ("blind=1", "--set blind=1: expected bool like False"),
                          ("branch_turns=2", r"--set branch_turns=2: expected tuple like \(2, 3\)"),
                          ("size={\"width\": 3}", "--set size: .*width"),
                          ("grpo_steps=null", f"expected int like {sim_tiny.SimTinyConfig().grpo_steps}")):
        with pytest.raises(ValueError, match=message):
            sim_tiny.config_overrides([pair])
    with pytest.raises(ValueError, match="top_p"):  # the config's own checks still apply
        sim_tiny.configure(overrides=sim_tiny.config_overrides(["top_p=1.5"]))


def test_blind_config_blanks_the_teacher_tokens(tmp_path):
    config = sim_tiny.SimTinyConfig(blind=True, sft_worlds=1, tasks_per_world=2, progress=False,
                                    size=MICRO.size, teacher_min_reward=0.0)
    worlds = sim_tiny.build_worlds(config, tmp_path / "worlds")
    tokenizer = sim_tiny.train_tokenizer(config, worlds["sft"], tmp_path / "tok")
    stats = sim_tiny.record_teacher(config, worlds["sft"], tokenizer, tmp_path / "data")
    assert stats["teacher_kept"] == stats["teacher_episodes"] == 2
    record = next(shards.read_shard(shards.list_shards(tmp_path / "data")[0]))
    text = tokenizer.decode(list(record.token_ids))
    assert "search result for" not in text and not record.images  # the policy never saw what tools returned
    assert "<tool_call>" in text


def _files(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_worker_processes_build_and_record_what_one_process_does(tmp_path):
    config = sim_tiny.SimTinyConfig(sft_worlds=3, tasks_per_world=2, grpo_tasks=3, eval_tasks=2, progress=False,
                                    size=MICRO.size, teacher_min_reward=0.5)
    made = {}
    for workers in (1, 2):
        root, run_config = tmp_path / f"workers{workers}", dataclasses.replace(config, workers=workers)
        with process_pool.JobPool(workers) as pool:
            # with two workers as the run does it: the GRPO world on one of them while the other goes on
            worlds = sim_tiny.build_worlds(run_config, root / "worlds", pool=pool, grpo_in_background=workers == 2)
            scripted = pool.submit(sim_tiny.scripted_scores, run_config, worlds["eval"])
            tokenizer = sim_tiny.train_tokenizer(run_config, worlds["sft"], root / "tok", pool=pool)
            stats = sim_tiny.record_teacher(run_config, worlds["sft"], tokenizer, root / "data", pool=pool)
            if workers == 2:
                assert worlds["grpo_job"].result() is None
        made[workers] = (_files(root / "worlds"), _files(root / "tok"), stats, _records(root / "data"),
                         scripted.result())
    (worlds_one, tok_one, stats_one, records_one, scripted_one), (worlds_two, tok_two, stats_two, records_two,
                                                                  scripted_two) = made[1], made[2]
    placeless = [{name: {k: v for k, v in summary.items() if k != "world"} for name, summary in scores[0].items()}
                 for scores in (scripted_one, scripted_two)]  # each summary names the folder of its world
    assert placeless[0] == placeless[1] and scripted_one[1] == scripted_two[1]
    assert scripted_one[0]["expert"]["num_tasks"] == 2
    assert any(name.startswith("grpo-") for name in worlds_two)
    assert worlds_one == worlds_two and len(worlds_one) > 5  # byte for byte
    assert tok_one == tok_two
    assert stats_one == stats_two and stats_one["teacher_episodes"] == 6
    assert len(records_one) == stats_one["teacher_kept"] > 0
    assert [t.without_timings() for t in records_one] == [t.without_timings() for t in records_two]
    with pytest.raises(ValueError, match="workers must be an int >= 0"):
        sim_tiny.SimTinyConfig(workers=-2)
    assert sim_tiny.stage_workers(config) == 1  # 11 tasks: not worth starting processes for, by default
    assert sim_tiny.stage_workers(sim_tiny.SimTinyConfig(workers=3)) == 3


def test_sft_steps_load_the_programs_compiled_ahead(run, tmp_path):
    from ranger_jax import compilation_cache
    from ranger_jax.processing import tokenizer as tokenizer_lib

    out, _ = run
    config = dataclasses.replace(MICRO, copy_rehearsal=False, sft_steps=5)  # a schedule no other test compiles
    tokenizer = tokenizer_lib.load_tokenizer(out / "tokenizer")
    source = shards.TrajectorySource(out / "sft_data")
    batches = iter(sim_tiny.sft_dataset(config, tokenizer, source, sim_tiny.sft_augmentation(tokenizer, source)))
    batches = [next(batches) for _ in range(config.sft_steps)]
    shapes = {tuple(sorted((k, np.shape(v)) for k, v in b.items())) for b in batches}
    cache = tmp_path / "cache"

    def programs():
        return sorted(p.name for p in cache.iterdir() if p.name.startswith("jit_train_step"))

    with compilation_cache.enabled(cache):
        assert sim_tiny.precompile_sft_steps(config, tokenizer, source) == len(shapes) >= 1
        ahead = programs()
        assert len(ahead) == len(shapes)
        learner = sim_tiny.sft_learner(config, tiny_policy.init_policy(tokenizer, config.size, seed=3), tmp_path / "c")
        for batch in batches:  # the permuted batches, as SFT trains them: the same shapes
            learner.step(batch)
        learner.close()
        assert programs() == ahead  # every step loaded its program: none was compiled again
    with pytest.raises(ValueError, match="persistent compilation cache"):
        sim_tiny.precompile_sft_steps(config, tokenizer, source)


def test_a_rerun_reuses_its_worlds_and_refuses_a_folder_holding_other_ones(tmp_path):
    config = sim_tiny.SimTinyConfig(sft_worlds=1, tasks_per_world=1, grpo_tasks=2, eval_tasks=1, progress=False,
                                    size=MICRO.size)
    worlds = sim_tiny.build_worlds(config, tmp_path / "worlds")
    built = {p: p.stat().st_mtime_ns for p in (tmp_path / "worlds").rglob("world.json")}
    assert sim_tiny.build_worlds(config, tmp_path / "worlds") == worlds  # reused, not rebuilt
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "worlds").rglob("world.json")} == built
    for change, named in (({"grpo_tasks": 3}, "num_tasks 2 (wanted 3)"),
                          ({"eval_tasks": 2}, "num_tasks 1 (wanted 2)"),
                          ({"world_version": 2}, "world_version 1 (wanted 2)")):
        with pytest.raises(ValueError, match=re.escape(named) + ".*new output folder"):
            sim_tiny.build_worlds(dataclasses.replace(config, **change), tmp_path / "worlds")
    (tmp_path / "worlds" / f"grpo-{config.grpo_seed()}" / "world.json").write_text(
        json.dumps({**json.loads((worlds["grpo"] / "world.json").read_text()), "seed": 7}))
    with pytest.raises(ValueError, match=r"grpo-500 holds another world than this run's: seed 7 \(wanted 500\)"):
        sim_tiny.build_worlds(config, tmp_path / "worlds")


def test_a_rerun_starts_grpo_again_without_the_earlier_attempts_rounds(run, tmp_path, capsys):
    # a rerun of a run folder resumes SFT (nothing left to do) and starts GRPO again from the SFT policy: the first
    # attempt's actor metrics and shards would otherwise pass for this attempt's rounds
    first_out, first = run
    out = tmp_path / "again"
    shutil.copytree(first_out, out)
    summary = sim_tiny.run(MICRO, out)
    assert "removing the earlier attempt's" in capsys.readouterr().err
    assert summary["sft_reward"] == first["sft_reward"]
    assert summary["grpo"]["num_steps"] == 2
    assert summary["grpo"]["final_version"] == first["grpo"]["final_version"]
    names = sorted(p.name for p in shards.list_shards(out / "grpo_shards"))
    assert names == sorted(p.name for p in shards.list_shards(first_out / "grpo_shards"))  # rounds 0 and 1 again
    for path in (out / "metrics").glob("actor*.jsonl"):
        assert [json.loads(line)["round"] for line in path.read_text().splitlines()] == [0, 1]
    played = [sorted((t.group_id, t.policy_version, round(t.reward, 6)) for t in _records(folder / "grpo_shards"))
              for folder in (out, first_out)]
    assert played[0] == played[1]
    # metrics.jsonl holds each stage's steps once: the earlier attempt's GRPO rows gave way to this one's
    stage_steps = [collections.Counter((min(k for k in row if k not in ("step", "time")).split("/")[0], row["step"])
                                       for row in metrics.read_jsonl(folder / "metrics" / "metrics.jsonl"))
                   for folder in (out, first_out)]
    assert stage_steps[0] == stage_steps[1] and max(stage_steps[0].values()) == 1
    assert any(stage == "grpo" for stage, _ in stage_steps[0])


def _loop_from_the_run_rounds(run, folder, learner, *, steps, every):
    """The GRPO loop of the micro run over a copy of that run's rounds (no actors: the rounds are there)."""
    from ranger_jax.data import filters
    from ranger_jax.processing import tokenizer as tokenizer_lib
    from ranger_jax.rl import grpo_loop

    out, _ = run
    if not (folder / "grpo_shards").exists():
        shutil.copytree(out / "grpo_shards", folder / "grpo_shards")
        shutil.copytree(out / "metrics", folder / "actors", ignore=shutil.ignore_patterns("metrics.jsonl", "events*"))
    tokenizer = tokenizer_lib.load_tokenizer(out / "tokenizer")
    with metrics.MetricsWriter(folder / "metrics") as writer:
        return grpo_loop.run(
            learner, shards_dir=folder / "grpo_shards", weights_dir=folder / "weights",
            spec=sim_tiny.grpo_batch_spec(MICRO, tokenizer),
            config=grpo_loop.GrpoLoopConfig(num_steps=steps, max_staleness=MICRO.max_staleness,
                                            advantages=MICRO.advantages, one_update_per_round=True, split_rounds=True,
                                            checkpoint_every=every, data_timeout_s=5.0),
            vision=tiny_policy.VISION, filter_config=filters.FilterConfig(trim_untrained_tail=True),
            actor_metrics={f"actor{p}": folder / "actors" / f"actor{p}.jsonl" for p in range(MICRO.actor_processes)},
            metrics=writer, progress=False)


def test_a_grpo_loop_resumes_from_its_checkpoint_to_the_parameters_of_an_uninterrupted_loop(run, tmp_path):
    from ranger_jax.rl import learner as learner_lib
    from ranger_jax.rl import weights

    out, _ = run
    settings = sim_tiny.grpo_learner(MICRO, qwen3_vl.load(out / "sft_policy")).config

    def learner(folder=None):
        return learner_lib.Learner(qwen3_vl.load(out / "sft_policy"), settings,
                                   checkpoint_dir=None if folder is None else folder / "checkpoints")

    whole = learner()
    whole_result = _loop_from_the_run_rounds(run, tmp_path / "whole", whole, steps=2, every=None)
    killed = learner(tmp_path / "resumed")
    _loop_from_the_run_rounds(run, tmp_path / "resumed", killed, steps=1, every=1)
    killed.close()
    # the killed attempt had published a later version before it stopped: a resumed loop withdraws it
    weights.publish(killed.params_model(), tmp_path / "resumed" / "weights", killed.step_count + 5)
    resumed = learner(tmp_path / "resumed")
    result = _loop_from_the_run_rounds(run, tmp_path / "resumed", resumed, steps=2, every=1)
    resumed.close()
    assert result.resumed_rounds == 1 and whole_result.resumed_rounds == 0
    # the counts go on from those saved with the checkpoint: round 1's, then round 2's again
    assert (result.episodes, result.staleness, result.dropped) == \
        (whole_result.episodes, whole_result.staleness, whole_result.dropped)
    assert result.episodes > 0 and result.wall_s > 0
    assert result.final_version == whole_result.final_version == whole.step_count == resumed.step_count
    for a, b in zip(jax.tree_util.tree_leaves(whole.state.params), jax.tree_util.tree_leaves(resumed.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # round 1's update, exactly
    assert weights.list_versions(tmp_path / "resumed" / "weights")[-1] == result.final_version
    rows = metrics.read_jsonl(tmp_path / "resumed" / "metrics" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [r["step"] for r in
                                          metrics.read_jsonl(tmp_path / "whole" / "metrics" / "metrics.jsonl")]
    done = learner(tmp_path / "resumed")  # a finished loop run again resumes with nothing left to do
    again = _loop_from_the_run_rounds(run, tmp_path / "resumed", done, steps=2, every=1)
    assert again.resumed_rounds == 2 and done.step_count == resumed.step_count
    assert again.episodes == result.episodes  # nothing played: the totals saved with the last checkpoint
    with pytest.raises(ValueError, match="checkpoint_every needs a learner with a checkpoint_dir"):
        _loop_from_the_run_rounds(run, tmp_path / "x", learner(), steps=1, every=1)
    other = learner(tmp_path / "other")
    other.save(force=True)  # a checkpoint without the loop's place in the rounds (e.g. an SFT learner's folder)
    other.close()
    with pytest.raises(ValueError, match="the checkpoint of step 0 in .*other/checkpoints was not saved by a GRPO"):
        _loop_from_the_run_rounds(run, tmp_path / "other", learner(tmp_path / "other"), steps=1, every=1)


def test_rows_of_a_withdrawn_version_leave_the_rounds_reward_spread_and_staleness(run, tmp_path):
    """A learner at version 0 reading a round whose second actor's rows say version 7 (as after a resume withdrew
    the versions of an earlier attempt): those rows are dropped and left out of the round's metrics."""
    out, _ = run
    folder = tmp_path / "loop"
    shutil.copytree(out / "grpo_shards", folder / "grpo_shards")
    shutil.copytree(out / "metrics", folder / "actors", ignore=shutil.ignore_patterns("metrics.jsonl", "events*"))
    first = sorted((folder / "grpo_shards").glob("actor*-r00000-*.array_record"))
    withdrawn = [p for p in first if p.name.startswith("actor1-")]
    assert withdrawn and len(withdrawn) < len(first)
    for path in withdrawn:
        rows = list(shards.TrajectorySource(path))
        shards.write_shard(path, [dataclasses.replace(r, policy_version=7) for r in rows], overwrite=True)
    kept = [r for p in first if p not in withdrawn for r in shards.TrajectorySource(p)]
    learner = sim_tiny.grpo_learner(MICRO, qwen3_vl.load(out / "sft_policy"))
    result = _loop_from_the_run_rounds(run, folder, learner, steps=1, every=None)
    played = sum(len(shards.TrajectorySource(p)) for p in first)
    assert result.episodes == played  # episodes/s counts what the actors played
    assert result.dropped["dropped"] == {"newer": played - len(kept)}
    assert result.staleness == {0: len(kept)}
    [row] = metrics.read_jsonl(folder / "metrics" / "metrics.jsonl")
    assert row["grpo/reward_mean"] == pytest.approx(np.mean([r.reward for r in kept]))
    groups = {}
    for r in kept:
        groups.setdefault(r.group_id, []).append(r.reward)
    assert row["grpo/zero_variance_share"] == pytest.approx(np.mean([np.ptp(v) < 1e-6 for v in groups.values()]))


def test_sft_recipe_trains_and_resumes_from_the_run_outputs(run, tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    out, _ = run
    path = Path(__file__).resolve().parents[2] / "recipes" / "sft_ranger.py"
    spec = importlib.util.spec_from_file_location("sft_ranger", path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    common = ["--checkpoint", str(out / "sft_policy"), "--data", str(out / "sft_data"), "--out", str(tmp_path),
              "--batch", "4", "--max-length", "3072", "--max-pixels", str(tiny_policy.MAX_PIXELS)]
    assert recipe.main(common + ["--steps", "2"]) == 0
    assert recipe.main(common + ["--steps", "3"]) == 0  # resumes at step 2
    assert "3 steps" in capsys.readouterr().out
    assert (tmp_path / "policy" / "config.json").is_file() and (tmp_path / "policy" / "tokenizer.json").is_file()


def test_teacher_rejection_keeps_only_good_episodes(run, tmp_path):
    import dataclasses

    from ranger_jax.processing import tokenizer as tokenizer_lib

    out, _ = run
    recorded = _records(out / "sft_data")
    everything = sorted(t.reward for t in recorded)
    assert len(everything) == 4  # MICRO keeps every teacher episode
    # written in task order, whichever episode finished first: a seed repeats its SFT data
    assert [t.group_id for t in recorded] == sorted(t.group_id for t in recorded)
    worlds = sim_tiny.build_worlds(MICRO, out / "worlds")
    tokenizer = tokenizer_lib.load_tokenizer(out / "tokenizer")
    if everything[0] == everything[-1]:
        with pytest.raises(RuntimeError, match="nothing to train on"):
            sim_tiny.record_teacher(dataclasses.replace(MICRO, teacher_min_reward=everything[-1] + 0.1),
                                    worlds["sft"], tokenizer, tmp_path / "none")
        return
    threshold = (everything[0] + everything[-1]) / 2
    stats = sim_tiny.record_teacher(dataclasses.replace(MICRO, teacher_min_reward=threshold), worlds["sft"],
                                    tokenizer, tmp_path / "kept")
    kept = [t.reward for t in _records(tmp_path / "kept")]
    assert stats["teacher_episodes"] == 4 and stats["teacher_kept"] == len(kept) == sum(r >= threshold
                                                                                        for r in everything)
    assert all(r >= threshold for r in kept)


def test_blind_micro_run_survives_rounds_with_nothing_to_train(tmp_path):
    # blind, the micro policy's groups all score alike: the filters keep no row, and such a round is skipped. The
    # GRPO rollouts sample as the default does (decision sampling, no greedy member, attention alone trained)
    default = sim_tiny.SimTinyConfig()
    config = dataclasses.replace(MICRO, blind=True, first_turn_steps=1, copy_warmup_steps=1, greedy_member=False,
                                 draw_below=default.draw_below, max_draws=default.max_draws,
                                 grpo_frozen=default.grpo_frozen)
    summary = sim_tiny.run(config, tmp_path)
    grpo = summary["grpo"]
    assert grpo["num_steps"] == 2 and grpo["final_version"] + grpo["skipped_rounds"] == 2
    assert summary["blind"] is True and 0.0 <= summary["grpo_reward"] <= 1.0
    records = _records(tmp_path / "grpo_shards")
    drawn = [int(t.loss_mask.sum()) for t in records]  # only drawn tokens are trained, at most two a sampled turn
    assert max(drawn) <= default.max_draws and sum(drawn) > 0


def test_gradient_agreement_of_the_sft_policy_on_the_grpo_groups(run, tmp_path, monkeypatch, capsys):
    out, summary = run
    result = diagnostics.measure_policy(str(out / "sft_policy"), str(out / "grpo_shards"), batch_size=1,
                                        max_batches=4)
    # the actor ran the run's two rounds of one group of 2: four episodes, one a batch
    assert result.num_batches == 4 and result.batch_rows == 1
    rewards = {}
    for t in _records(out / "grpo_shards"):
        rewards.setdefault(t.group_id, set()).add(round(t.reward, 6))
    if all(len(r) == 1 for r in rewards.values()):  # no group with reward variance: no advantage, no gradient
        assert result.mean_gradient_norm == 0 and result.noise_norm_sq == 0
    else:
        assert result.mean_gradient_norm > 0
        # log-probs at the rollouts' temperature: another distribution, other gradients
        tempered = diagnostics.measure_policy(str(out / "sft_policy"), str(out / "grpo_shards"), batch_size=1,
                                              max_batches=4, temperature=0.5)
        assert tempered.mean_gradient_norm != pytest.approx(result.mean_gradient_norm, rel=1e-3)
    assert -1 <= result.half_cosine <= 1 and -1 <= result.mean_pairwise_cosine <= 1
    report = tmp_path / "agreement.json"
    monkeypatch.setattr(sys, "argv", ["gradient_agreement.py", "--policy", str(out / "sft_policy"), "--shards",
                                      str(out / "grpo_shards"), "--batch-size", "1", "--max-batches", "4",
                                      "--json", str(report)])
    runpy.run_path(str(REPO / "evals" / "gradient_agreement.py"), run_name="__main__")
    written = json.loads(report.read_text())
    assert written["half_cosine"] == pytest.approx(result.half_cosine, abs=1e-6)
    assert "noise_scale" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["gradient_agreement.py", "--policy", str(out / "sft_policy"), "--shards",
                                      str(tmp_path / "none")])
    with pytest.raises(SystemExit, match="gradient_agreement: "):
        runpy.run_path(str(REPO / "evals" / "gradient_agreement.py"), run_name="__main__")
