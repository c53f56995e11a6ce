"""Savanna-style evaluation of a checkpoint through the JAX sampler (greedy, or sampled as GRPO rollouts sample),
with the env settings it carries (`ranger_env.json`), of agents by name, object or callable, and the paired
comparison of two evaluations."""

import dataclasses
import json
import os
import re
import runpy
import shutil
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from ranger_jax import env
from ranger_jax.data import shards
from ranger_jax.env.sim import build, world
from ranger_jax.rollout import episode, eval_world, evaluate, policy, sequence, trained_env

REPO = Path(__file__).resolve().parents[2]
TRAINED = trained_env.TrainedEnv(
    env={"tools": ["image_search"], "prompt_style": "compact", "max_turns": 2, "max_answer_refs": 3},
    rewards={"kind": "sim", "text_coef": 0.5}, image={"min_pixels": 1024, "max_pixels": 16_384},
    episode={"max_new_tokens": 12, "max_context_tokens": 1024})
SUMMARY_KEYS = {"policy", "world", "seed", "num_tasks", "search_score", "search_score_by_domain", "crop_iou_mean",
                "text_score_mean", "reward_mean", "tool_calls_mean", "terminations", "episodes", "settings"}


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny random policy with the settings it was "trained" with."""
    path = shutil.copytree(tiny_checkpoint, tmp_path_factory.mktemp("eval") / "policy")
    trained_env.write(path, TRAINED)
    return path


def test_checkpoint_eval_uses_its_settings_and_is_deterministic(checkpoint, world_dir, tmp_path, monkeypatch):
    first = evaluate.evaluate(world_dir, str(checkpoint), limit=2, concurrency=2)
    assert SUMMARY_KEYS <= set(first) and first["num_tasks"] == 2 and first["policy"] == str(checkpoint)
    assert first["settings"] == {"env": {"tools": ["image_search"], "prompt_style": "compact", "max_turns": 2,
                                         "max_answer_refs": 3},
                                 "rewards": {"kind": "sim", "text_coef": 0.5},
                                 "image": {"min_pixels": 1024, "max_pixels": 16_384},
                                 "episode": {"max_new_tokens": 12, "max_context_tokens": 1024}}
    assert first["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "draw_below": 1.0, "max_draws": 0,
                                 "samples_per_task": 1, "branch_turns": [0], "sample_turns": None, "seed": 0,
                                 "concurrency": 2}
    assert first["reward_per_task"] == [row["reward"] for row in first["episodes"]]
    assert first["search_score"] == first["reward_mean"] == 0.0  # a random policy never answers
    for row in first["episodes"]:
        assert row["termination"] in ("repeated_response", "no_answer") and row["zero_reason"] is not None
        assert row["num_turns"] <= 3 and row["last_response"]
    out = tmp_path / "second.json"  # the second run goes through the command line, compiling into a cache
    saved = jax.config.jax_compilation_cache_dir
    monkeypatch.setattr(sys, "argv", ["savanna_sim.py", "--world", str(world_dir), "--policy", str(checkpoint),
                                      "--json", str(out), "--limit", "2", "--concurrency", "2",
                                      "--compilation-cache", str(tmp_path / "cache")])
    runpy.run_path(str(REPO / "evals" / "savanna_sim.py"), run_name="__main__")
    second = json.loads(out.read_text())
    assert second == json.loads(json.dumps(first))  # greedy: the same turns, rows and summary
    assert any(p.name.startswith("jit_") for p in (tmp_path / "cache").iterdir())
    assert jax.config.jax_compilation_cache_dir == saved  # the command's cache is closed again


def test_env_option_replaces_the_recorded_settings(checkpoint, world_dir):
    result = evaluate.evaluate_checkpoint(world_dir, checkpoint, env_name="savanna_sim", limit=2,
                                          max_context_tokens=64)  # not even the system prompt fits
    assert result["settings"]["env"]["tools"] == ["text_search", "image_search", "web_fetch", "crop_image"]
    assert result["settings"]["env"]["prompt_style"] == "full" and result["settings"]["episode"] == {
        "max_new_tokens": 12, "max_context_tokens": 64}
    assert result["terminations"] == {"context_exceeded": 2} and result["reward_mean"] == 0.0


def test_agents_by_name_and_errors(world_dir, the_world, checkpoint):
    by_name = evaluate.evaluate(world_dir, "expert", limit=2)
    assert by_name["search_score"] == 1.0 and by_name["policy"] == "expert"
    with pytest.raises(ValueError, match=r"policy 'nope' is neither a built-in agent \['caption', 'expert', "
                                         r"'finder', 'naive', 'pixel_expert', 'snippet'\] nor a checkpoint folder"):
        evaluate.evaluate(world_dir, "nope")
    with pytest.raises(FileNotFoundError, match="is not a checkpoint folder"):
        evaluate.evaluate_checkpoint(world_dir, world_dir)
    with pytest.raises(ValueError, match="limit must be a positive number of tasks"):
        evaluate.evaluate_checkpoint(world_dir, checkpoint, limit=0)


def test_eval_says_when_the_world_is_not_the_generation_the_policy_trained_in(checkpoint, world_dir, the_world,
                                                                              tmp_path, monkeypatch, capsys):
    assert evaluate.evaluate(world_dir, str(checkpoint), limit=1)["world_mismatch"] is None  # the file does not say
    other = 1 if the_world.version != 1 else 2
    for trained_version, mismatch in ((the_world.version, False), (other, True)):
        policy_dir = shutil.copytree(checkpoint, tmp_path / f"v{trained_version}")
        trained_env.write(policy_dir, dataclasses.replace(TRAINED, world={"world_version": trained_version}))
        out = tmp_path / f"v{trained_version}.json"
        monkeypatch.setattr(sys, "argv", ["savanna_sim.py", "--world", str(world_dir), "--policy", str(policy_dir),
                                          "--json", str(out), "--limit", "1"])
        runpy.run_path(str(REPO / "evals" / "savanna_sim.py"), run_name="__main__")
        result, printed = json.loads(out.read_text()), capsys.readouterr().out
        assert result["world_version"] == the_world.version
        if mismatch:
            expected = (f"the policy trained in offline worlds of version {other}; this world is version "
                        f"{the_world.version} (build one with `python -m ranger_jax.env.sim.build ... --world-version "
                        f"{other}`")
            assert result["world_mismatch"].startswith(expected) and f"note: {expected}" in printed
        else:
            assert result["world_mismatch"] is None and "note:" not in printed


def test_trained_env_file_round_trip_and_errors(tmp_path, world_dir):
    assert trained_env.read(tmp_path) is None
    with env.make("savanna_sim", world=str(world_dir), image_store=str(tmp_path / "store")) as tool_env:
        config = episode.EpisodeConfig(max_new_tokens=64, max_context_tokens=4096,
                                       vision=sequence.VisionSettings(min_pixels=4096, max_pixels=40_000),
                                       sampling=policy.SamplingParams())
        recorded = trained_env.TrainedEnv.from_run(tool_env, config)
    assert "image_store" not in recorded.env and recorded.env["tools"] == list(tool_env.config.tools)
    assert recorded.rewards == dict(tool_env.rewards) and recorded.image == {"min_pixels": 4096, "max_pixels": 40_000}
    trained_env.write(tmp_path, recorded)
    assert trained_env.read(tmp_path) == recorded
    vision = recorded.vision(patch_size=14, merge_size=2, temporal_patch_size=2)
    assert (vision.min_pixels, vision.max_pixels, vision.patch_size) == (4096, 40_000, 14)
    path = tmp_path / trained_env.FILE_NAME
    for data, match in [
        ([], "must hold a JSON object"),
        ({"envs": {}}, r"unknown tables \['envs'\]"),
        ({"env": {"max_turn": 3}}, "unknown key 'max_turn' in 'env'"),
        ({"env": {"prompt_style": "tiny"}}, "prompt_style must be 'full', 'compact' or 'date'"),
        ({"rewards": {"max_references": 4}}, "reward key 'max_references' is gone"),
        ({"image": {"max_pixel": 5}}, "unknown key 'max_pixel'"),
        ({"image": {"min_pixels": 0}}, "'min_pixels' must be a positive integer"),
        ({"image": {"min_pixels": 9000, "max_pixels": 4000}}, r"min_pixels \(9000\) > max_pixels \(4000\)"),
        ({"episode": {"max_new_tokens": 1.5}}, "'max_new_tokens' must be a positive integer"),
        ({"world": {"version": 1}}, r"'world': unknown key 'version'; known keys: \['world_version'\]"),
        ({"world": {"world_version": 0}}, "'world_version' must be a positive integer"),
    ]:
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match=match):
            trained_env.read(tmp_path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        trained_env.read(tmp_path)


def _assistant_turns(trajectory) -> list[str]:
    return [str(m["content"]) for m in trajectory.messages if m["role"] == "assistant"]


def test_sampled_eval_draws_only_the_branch_turns_seeded_like_an_actor(checkpoint, world_dir, tmp_path):
    sampled = dict(sampling=policy.SamplingParams(temperature=1.0, top_p=1.0), samples_per_task=3,
                   branch_turns=(1,), sample_turns=1, seed=5, limit=2)
    greedy = evaluate.evaluate_checkpoint(world_dir, checkpoint, limit=2, concurrency=2,
                                          trajectories_out=tmp_path / "greedy.array_record")
    first = evaluate.evaluate_checkpoint(world_dir, checkpoint, concurrency=2,
                                         trajectories_out=tmp_path / "sampled.array_record", **sampled)
    assert first["num_tasks"] == 2 and len(first["episodes"]) == 6 and len(first["reward_per_task"]) == 2
    assert sum(first["num_tasks_by_domain"].values()) == 2
    assert [row["task_id"] for row in first["episodes"]] == [row["task_id"] for row in greedy["episodes"]
                                                            for _ in range(3)]
    assert first["sampling"] == {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "draw_below": 1.0, "max_draws": 0,
                                 "samples_per_task": 3, "branch_turns": [1], "sample_turns": 1, "seed": 5,
                                 "concurrency": 2}
    # the same seed gives the same episodes whatever the number in flight; another seed other samples
    again = evaluate.evaluate_checkpoint(world_dir, checkpoint, concurrency=3, **sampled)
    assert again["episodes"] == first["episodes"]
    other = evaluate.evaluate_checkpoint(world_dir, checkpoint, concurrency=2, **{**sampled, "seed": 6})
    assert [r["last_response"] for r in other["episodes"]] != [r["last_response"] for r in first["episodes"]]
    # turn 0 is the greedy turn every sample shares; turn 1 is drawn (the random policy's samples differ)
    greedy_turns = {t.task_id: _assistant_turns(t) for t in shards.read_shard(tmp_path / "greedy.array_record")}
    by_task: dict[str, list[list[str]]] = {}
    for t in shards.read_shard(tmp_path / "sampled.array_record"):
        by_task.setdefault(t.task_id, []).append(_assistant_turns(t))
    assert sorted(by_task) == sorted(greedy_turns)
    for task_id, samples in by_task.items():
        assert len(samples) == 3 and all(turns[0] == greedy_turns[task_id][0] for turns in samples)
        assert len({turns[1] for turns in samples if len(turns) > 1}) > 1


def test_sampled_eval_errors(checkpoint, world_dir):
    warm = policy.SamplingParams(temperature=1.0)
    for options, match in [
        ({"samples_per_task": 0, "sampling": warm}, "samples_per_task must be an int >= 1; got 0"),
        ({"samples_per_task": 4}, r"samples_per_task=4 with greedy sampling \(temperature 0\) plays one episode"),
        ({"branch_turns": (2,)}, r"branch_turns=\(2,\) / sample_turns=None choose which turns are sampled"),
        ({"sampling": warm, "branch_turns": (-1,)}, "evaluate.branch_turns must be a non-empty tuple"),
        ({"sampling": warm, "sample_turns": 0}, "evaluate.sample_turns must be None or an int >= 1; got 0"),
        ({"sampling": {"temperature": 1.0}}, "sampling must be a rollout.policy.SamplingParams"),
    ]:
        with pytest.raises(ValueError, match=match):
            evaluate.evaluate_checkpoint(world_dir, checkpoint, **options)


def test_paired_difference_and_compare():
    before, after = [0.0, 0.5, 1.0, 0.2], [0.5, 0.5, 1.0, 0.6]
    got = evaluate.paired_difference(before, after)
    d = np.array(after) - np.array(before)
    assert got["num_tasks"] == 4 and got["mean"] == pytest.approx(d.mean())
    assert got["se_paired"] == pytest.approx(d.std(ddof=1) / 2)
    assert got["se_unpaired"] == pytest.approx(np.sqrt(np.var(before, ddof=1) / 4 + np.var(after, ddof=1) / 4))
    with pytest.raises(ValueError, match="equal-length"):
        evaluate.paired_difference([0.1, 0.2], [0.1])

    def result(policy_name, rewards_by_task, world="w", seed=1):
        rows = [{"task_id": t, "reward": r} for t, rewards in rewards_by_task.items() for r in rewards]
        return {"policy": policy_name, "world": world, "seed": seed, "episodes": rows, "sampling": {"seed": 7}}

    # per-task means over samples are what is paired
    base = result("sft", {"a": [0.0, 1.0], "b": [0.5, 0.5], "c": [0.2, 0.0]})
    new = result("grpo", {"a": [1.0, 1.0], "b": [0.5, 0.5], "c": [0.0, 0.0]})
    assert evaluate.task_rewards(base) == {"a": 0.5, "b": 0.5, "c": 0.1}
    got = evaluate.compare(base, new)
    assert got["reward_difference"] == evaluate.paired_difference([0.5, 0.5, 0.1], [1.0, 0.5, 0.0])
    assert (got["tasks_better"], got["tasks_worse"], got["tasks_equal"]) == (1, 1, 1)
    assert (got["baseline"], got["policy"]) == ("sft", "grpo")
    with pytest.raises(ValueError, match=r"different worlds: w \(seed 1\) and w \(seed 2\)"):
        evaluate.compare(base, result("x", {"a": [0.0]}, seed=2))
    with pytest.raises(ValueError, match=r"different tasks \(3 and 2; not in both: \['c'\]\)"):
        evaluate.compare(base, result("x", {"a": [0.0], "b": [0.0]}))
    with pytest.raises(ValueError, match="in a different order"):
        evaluate.compare(base, result("x", {"b": [0.0], "a": [0.0], "c": [0.0]}))
    with pytest.raises(ValueError, match="'x' has no episode rows"):
        evaluate.task_rewards({"policy": "x", "episodes": []})


def _cli(monkeypatch, *args):
    monkeypatch.setattr(sys, "argv", ["savanna_sim.py", *args])
    runpy.run_path(str(REPO / "evals" / "savanna_sim.py"), run_name="__main__")


def test_sampled_eval_and_comparison_from_the_command_line(checkpoint, world_dir, tmp_path, monkeypatch, capsys):
    common = ["--world", str(world_dir), "--policy", str(checkpoint), "--limit", "2", "--concurrency", "2"]
    sampled = ["--temperature", "1", "--samples", "2", "--branch-turns", "1", "--sample-turns", "1", "--seed", "3"]
    _cli(monkeypatch, *common, "--json", str(tmp_path / "greedy.json"))
    _cli(monkeypatch, *common, *sampled, "--json", str(tmp_path / "sampled.json"),
         "--baseline", str(tmp_path / "greedy.json"))
    assert "reward - baseline (" in capsys.readouterr().out
    got = json.loads((tmp_path / "sampled.json").read_text())
    direct = evaluate.evaluate_checkpoint(world_dir, checkpoint, limit=2, concurrency=2, samples_per_task=2,
                                          sampling=policy.SamplingParams(temperature=1.0, top_p=1.0),
                                          branch_turns=(1,), sample_turns=1, seed=3)
    assert got["episodes"] == json.loads(json.dumps(direct["episodes"])) and got["sampling"] == direct["sampling"]
    greedy = json.loads((tmp_path / "greedy.json").read_text())
    _cli(monkeypatch, *common, "--processes", "2", "--json", str(tmp_path / "split.json"))
    assert json.loads((tmp_path / "split.json").read_text()) == greedy  # two processes: the same evaluation
    assert got["comparison"] == json.loads(json.dumps(evaluate.compare(greedy, direct)))
    for args, match in [
        (["--policy", "expert", "--temperature", "1"], r"--temperature only apply to checkpoints; 'expert' is a"),
        (["--policy", "naive", "--processes", "2"], r"--processes only apply to checkpoints; 'naive' is a"),
        ([*common[2:], "--processes", "0"], "processes must be an int >= 1; got 0"),
        ([*common[2:], "--temperature", "1", "--branch-turns", "two"], "--branch-turns must be comma-separated"),
        ([*common[2:], "--temperature", "-1"], "--temperature/.*: temperature must be a number >= 0; got -1"),
        ([*common[2:], "--temperature", "1", "--draw-below", "1.5"], r"draw_below must be in \(0, 1\].*got 1.5"),
        ([*common[2:], "--temperature", "1", "--max-draws", "-2"], "max_draws must be an int >= 0.*got -2"),
        ([*common[2:], "--samples", "3"], r"samples_per_task=3 with greedy sampling"),
        ([*common[2:], "--baseline", str(tmp_path / "missing.json")], "--baseline .*missing.json"),
    ]:
        with pytest.raises(SystemExit):
            _cli(monkeypatch, "--world", str(world_dir), "--json", str(tmp_path / "x.json"), *args)
        assert re.search(match, capsys.readouterr().err), (args, match)


def test_ensure_world_builds_the_policys_generation_once_and_names_another_world(checkpoint, tmp_path):
    policy_dir = shutil.copytree(checkpoint, tmp_path / "policy")
    trained_env.write(policy_dir, dataclasses.replace(TRAINED, world={"world_version": 1}))
    assert eval_world.trained_world_version(policy_dir) == 1
    assert eval_world.trained_world_version(checkpoint) is None and eval_world.trained_world_version("expert") is None
    path, built = eval_world.ensure_world(tmp_path / "w", seed=11, num_tasks=2, policy=policy_dir)
    meta = world.read_meta(path)
    assert built and (meta["seed"], meta["num_tasks"], meta.get("world_version", 1)) == (11, 2, 1)
    before = (path / world.WORLD_FILE).stat().st_mtime_ns
    assert eval_world.ensure_world(path, seed=11, num_tasks=2, policy=policy_dir) == (path, False)
    assert (path / world.WORLD_FILE).stat().st_mtime_ns == before  # the same world is not built again
    with pytest.raises(ValueError, match=r"another world: seed 11 \(wanted 12\), num_tasks 2 \(wanted 3\)"):
        eval_world.ensure_world(path, seed=12, num_tasks=3, policy=policy_dir)
    with pytest.raises(ValueError, match=r"world_version 1 \(wanted 2\)"):
        eval_world.ensure_world(path, seed=11, num_tasks=2, world_version=2)
    # nothing pins the generation (a scripted agent): the world of that seed and size is taken, whatever its generation
    assert build.DEFAULT_WORLD_VERSION != 1
    assert eval_world.ensure_world(path, seed=11, num_tasks=2, policy="naive") == (path, False)
    with pytest.raises(ValueError, match=r"another world: seed 11 \(wanted 12\); pick"):
        eval_world.ensure_world(path, seed=12, num_tasks=2, policy="naive")
    with pytest.raises(ValueError, match="world_version 2 is not the generation .* trained in \\(1\\)"):
        eval_world.ensure_world(tmp_path / "w2", seed=11, num_tasks=2, policy=policy_dir, world_version=2)
    assert not (tmp_path / "w2").exists()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="holds other files"):
        eval_world.ensure_world(tmp_path / "other", seed=1, num_tasks=2)


def test_build_world_version_from_the_command_line(checkpoint, tmp_path, monkeypatch, capsys):
    world_dir = tmp_path / "w"
    common = ["--world", str(world_dir), "--policy", "naive", "--build-seed", "5", "--build-tasks", "2"]
    _cli(monkeypatch, *common, "--build-world-version", "1", "--json", str(tmp_path / "a.json"))
    assert f"built {world_dir}: seed 5, 2 tasks, world version 1" in capsys.readouterr().out
    assert world.read_meta(world_dir).get("world_version", 1) == 1
    _cli(monkeypatch, *common, "--json", str(tmp_path / "b.json"))  # a scripted agent takes the world that is there
    assert json.loads((tmp_path / "b.json").read_text())["num_tasks"] == 2
    policy_dir = shutil.copytree(checkpoint, tmp_path / "policy")
    trained_env.write(policy_dir, dataclasses.replace(TRAINED, world={"world_version": 1}))
    for args, match in [
        (["--world", str(tmp_path / "w2"), "--policy", "naive", "--build-world-version", "1"],
         "--build-world-version only applies with --build-seed"),
        (["--world", str(tmp_path / "w3"), "--policy", str(policy_dir), "--build-seed", "5", "--build-world-version",
          "2"], r"--world/--build-seed: world_version 2 is not the generation .* trained in \(1\)"),
    ]:
        with pytest.raises(SystemExit):
            _cli(monkeypatch, *args, "--json", str(tmp_path / "c.json"))
        assert re.search(match, capsys.readouterr().err), (args, match)
    assert not (tmp_path / "w2").exists() and not (tmp_path / "w3").exists()


def test_build_seed_from_the_command_line(checkpoint, tmp_path, monkeypatch, capsys):
    policy_dir = shutil.copytree(checkpoint, tmp_path / "policy")
    trained_env.write(policy_dir, dataclasses.replace(TRAINED, world={"world_version": 1}))
    common = ["--world", str(tmp_path / "w"), "--policy", str(policy_dir), "--limit", "1"]
    _cli(monkeypatch, *common, "--build-seed", "5", "--build-tasks", "2", "--json", str(tmp_path / "a.json"))
    result, printed = json.loads((tmp_path / "a.json").read_text()), capsys.readouterr().out
    assert f"built {tmp_path / 'w'}: seed 5, 2 tasks, world version 1" in printed
    assert result["seed"] == 5 and result["world_version"] == 1 and result["world_mismatch"] is None
    for args, match in [(["--build-seed", "6", "--build-tasks", "2"], r"--world/--build-seed: .* seed 5 \(wanted 6\)"),
                        (["--build-seed", "5", "--build-tasks", "0"], r"--build-tasks must be in 1\.\.\d+; got 0")]:
        with pytest.raises(SystemExit):
            _cli(monkeypatch, *common, *args, "--json", str(tmp_path / "b.json"))
        assert re.search(match, capsys.readouterr().err), (args, match)


def test_processes_split_the_tasks_and_play_the_same_episodes(checkpoint, world_dir, tmp_path):
    """An evaluation over two worker processes (each the tasks of its part, half the rows) gives the summary, rows and
    trajectories of one process, greedy and sampled; the parts' shards are merged into one and removed."""
    for options in ({}, dict(sampling=policy.SamplingParams(temperature=1.0), samples_per_task=2, branch_turns=(1,),
                             sample_turns=1, seed=3)):
        one = evaluate.evaluate_checkpoint(world_dir, checkpoint, limit=3, concurrency=4,
                                           trajectories_out=tmp_path / "one.array_record", **options)
        two = evaluate.evaluate_checkpoint(world_dir, checkpoint, limit=3, concurrency=4, processes=2,
                                           trajectories_out=tmp_path / "two.array_record", **options)
        assert two == one and len(one["episodes"]) == 3 * (2 if options else 1)
        by_rid = {t.metadata["rid"]: t for t in shards.read_shard(tmp_path / "one.array_record")}
        split = list(shards.read_shard(tmp_path / "two.array_record"))
        assert sorted(t.metadata["rid"] for t in split) == sorted(by_rid)
        for t in split:
            assert t.token_ids.tolist() == by_rid[t.metadata["rid"]].token_ids.tolist()
            assert t.reward == by_rid[t.metadata["rid"]].reward
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.array_record", "two.array_record"]
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match=f"processes must be an int >= 1; got {bad!r}"):
            evaluate.evaluate_checkpoint(world_dir, checkpoint, limit=1, processes=bad)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pinning needs os.sched_setaffinity")
def test_split_evaluation_gives_each_worker_its_share_of_the_cores(checkpoint, world_dir, monkeypatch):
    """With `pin_cpus` (the default) worker i gets `cpu_affinity.split_cpus`'s share i; without, every core. (The
    pinned workers themselves run in `test_processes_split_the_tasks_and_play_the_same_episodes`.)"""
    from ranger_jax import cpu_affinity, process_pool

    handed = []

    def stop_before_running(fn, jobs, **_):
        handed.append([job[-1] for job in jobs])
        raise RuntimeError("stopped before running")

    monkeypatch.setattr(process_pool, "run_jobs", stop_before_running)
    monkeypatch.setattr(cpu_affinity, "usable_cpus", lambda: [0, 1, 2])
    for options in ({}, {"pin_cpus": False}, {"processes": 3}):
        with pytest.raises(RuntimeError, match="stopped before running"):
            evaluate.evaluate_checkpoint(world_dir, checkpoint, limit=2, **{"processes": 2, **options})
    assert handed == [[[0, 1], [2]], [None, None], [[0], [1], [2]]]
