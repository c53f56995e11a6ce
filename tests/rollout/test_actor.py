"""The actor: shards written atomically (round trip, killed mid-shard), the CLI, policy construction."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.tiny_tokenizer import qwen3_tokenizer_dir

from ranger_jax.data import shards, trajectory
from ranger_jax.env.sim import savanna
from ranger_jax.rollout import actor, episode, harness, policy, runner, sampler_policy, scoring, sequence
from ranger_jax.rollout import sglang_policy

CONFIG = episode.EpisodeConfig(max_new_tokens=512, max_context_tokens=20_000,
                               vision=sequence.VisionSettings(min_pixels=4096, max_pixels=40_000))
REPO = Path(__file__).resolve().parents[2]


def test_actor_shards_round_trip(tmp_path, sim_env, tasks, the_world, qwen_renderer):
    expert = policy.ScriptedPolicy(savanna.make_policy("expert", the_world), qwen_renderer.tokenizer, name="expert")
    scorer = scoring.make_scorer(sim_env, world=the_world)
    config = runner.RolloutConfig(group_size=2, concurrency=3, seed=2, run_id="a0", episode=CONFIG)
    summary = actor.run_actor(sim_env, expert, tasks[:3], renderer=qwen_renderer, out_dir=tmp_path, config=config,
                              scorer=scorer, prefix="actor0", records_per_shard=4)
    assert summary.num_trajectories == 6 and summary.num_groups == 3 and summary.terminations == {"answer": 6}
    assert [Path(p).name for p in summary.shards] == ["actor0-00000.array_record", "actor0-00001.array_record"]
    assert summary.episodes_per_s > 0 and summary.reward_mean > 0.5
    read = [t for path in shards.list_shards(tmp_path) for t in shards.read_shard(path)]
    assert [len(list(shards.read_shard(p))) for p in summary.shards] == [4, 2]
    fresh = {(t.group_id, t.sample_index): t for g in runner.run(sim_env, expert, tasks[:3], renderer=qwen_renderer,
                                                                 config=config, scorer=scorer)
             for t in g.trajectories}
    assert sorted(fresh) == sorted((t.group_id, t.sample_index) for t in read)
    for traj in read:
        same = fresh[(traj.group_id, traj.sample_index)]
        np.testing.assert_array_equal(traj.token_ids, same.token_ids)
        assert (traj.images, traj.messages, traj.answer, traj.reward, traj.generated_image) == \
            (same.images, same.messages, same.answer, same.reward, same.generated_image)
        assert trajectory.Trajectory.from_bytes(same.to_bytes()) == same  # every recorded field survives
    arrays = shards.TrajectorySource(tmp_path, as_arrays=True)[0]
    assert arrays["image_grid_thw"].shape[1] == 3 and arrays["images"]


def cli_args(world_dir, out, *extra):
    return ["--env", "savanna_sim", "--world", str(world_dir), "--policy", "expert",
            "--tokenizer", str(qwen3_tokenizer_dir()), "--out", str(out), "--max-pixels", "40000", "--quiet", *extra]


def test_actor_cli(tmp_path, world_dir, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    summary = actor.main(cli_args(world_dir, tmp_path / "out", "--limit", "2", "--group-size", "2",
                                  "--summary", str(tmp_path / "summary.json"), "--no-images",
                                  "--branch-turns", "1,2", "--sample-turns", "1"))
    assert summary.num_trajectories == 4
    branched = [t for path in summary.shards for t in shards.read_shard(path)]
    assert {t.metadata["sample_from_turn"] for t in branched} <= {1, 2}
    assert {t.metadata["sample_turns"] for t in branched} == {1}
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["num_groups"] == 2 and written["policy"] == "expert"
    assert json.loads(capsys.readouterr().out)["shards"] == written["shards"]
    assert all(t.generated_image is None and t.generation_error is None
               for t in shards.read_shard(written["shards"][0]))
    for flags, message in [
        (("--branch-turns", "1,x"), "--branch-turns must be comma-separated ints; got '1,x'"),
        (("--sample-turns", "0"), "--sample-turns must be >= 1; got 0"),
        (("--chunk-tokens", "-1"), "--chunk-tokens must be >= 0 (0 = whole turns); got -1"),
        (("--greedy-member",), "--greedy-member needs --group-size >= 2"),
        (("--share-continuations",), "--share-continuations needs --sample-turns"),
        (("--draw-below", "0.5"), "--draw-below/--max-draws need --policy jax (got --policy expert)"),
        (("--max-draws", "-1"), "max_draws must be an int >= 0 (0 = no limit); got -1"),
        (("--cpus", "x"), "--cpus: --cpus must be comma-separated CPU ids (ints >= 0, e.g. 0 or 0,1); got 'x'"),
        (("--cpus", "100000"), "--cpus: cannot pin to CPU(s) [100000]: this process may run on ["),
    ]:
        with pytest.raises(SystemExit):
            actor.main(cli_args(world_dir, tmp_path / "bad", *flags))
        assert message in capsys.readouterr().err, flags


def test_killed_actor_leaves_no_readable_partial_shard(tmp_path, world_dir):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "ranger_jax.rollout.actor",
               *cli_args(world_dir, out, "--group-size", "16", "--records-per-shard", "3", "--concurrency", "2")]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "JAX_PLATFORMS": "cpu"})
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and shards.list_shards(out)):
            assert process.poll() is None and time.monotonic() < deadline, "the actor ended before its first shard"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)  # mid-run: later shards are open or not started
        assert process.wait(timeout=30) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
    published = shards.list_shards(out)
    assert published and all(len(list(shards.read_shard(p))) == 3 for p in published)  # complete shards only
    assert len(published) < 4 * 16 // 3  # killed before the run ended
    leftovers = shards.remove_stale_temporaries(out, older_than_s=0)
    assert all(p.name.startswith(".") for p in leftovers)
    assert shards.list_shards(out) == published


def test_build_policy(tiny_checkpoint, tiny_renderer, the_world, sim_env):
    options = actor.PolicyOptions(tokenizer=tiny_renderer.tokenizer, env=sim_env, world=the_world,
                                  checkpoint=str(tiny_checkpoint), num_rows=2, sglang_url="http://127.0.0.1:1",
                                  chat_url="http://127.0.0.1:1/v1", chat_model="m", policy_version=4)
    built = {name: actor.build_policy(name, options) for name in actor.POLICIES}
    assert isinstance(built["jax"], sampler_policy.SamplerPolicy) and built["jax"].num_rows == 2
    assert built["jax"].chunk_tokens == sampler_policy.DEFAULT_CHUNK_TOKENS
    assert actor.build_policy("jax", dataclasses.replace(options, chunk_tokens=None)).chunk_tokens is None
    assert isinstance(built["sglang"], sglang_policy.SGLangPolicy) and built["sglang"].policy_version == 4
    assert isinstance(built["harness"], harness.HarnessPolicy) and built["harness"].tools == sim_env.tool_schemas()
    assert built["expert"].name == "expert" and built["naive"].agent.__class__.__name__ == "NaiveAgent"
    with pytest.raises(ValueError, match="unknown policy 'gpt'; known policies"):
        actor.build_policy("gpt", options)
    with pytest.raises(ValueError, match="policy 'sglang' needs --sglang-url"):
        actor.build_policy("sglang", actor.PolicyOptions(tokenizer=tiny_renderer.tokenizer))
    with pytest.raises(ValueError, match="policy 'harness' needs --chat-url, --chat-model"):
        actor.build_policy("harness", actor.PolicyOptions(tokenizer=tiny_renderer.tokenizer))


