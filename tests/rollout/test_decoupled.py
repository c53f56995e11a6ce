"""The decoupled actor: rounds over shuffled tasks, one shard set per round, round metrics, stop conditions, and an
actor process that hot-reloads the versions a learner publishes while it runs."""

import asyncio
import collections
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from support.tiny_tokenizer import qwen3_tokenizer_dir

from ranger_jax.data import shards
from ranger_jax.env import registry
from ranger_jax.env.sim import savanna
from ranger_jax.models import qwen3_vl
from ranger_jax.rl import weights
from ranger_jax.rollout import actor, decoupled, episode, policy, runner, scoring, sequence

CONFIG = episode.EpisodeConfig(max_new_tokens=512, max_context_tokens=20_000,
                               vision=sequence.VisionSettings(min_pixels=4096, max_pixels=40_000))
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def expert(the_world, qwen_renderer):
    return policy.ScriptedPolicy(savanna.make_policy("expert", the_world), qwen_renderer.tokenizer, name="expert",
                                 policy_version=3)


def read_all(folder):
    return {p.name: list(shards.read_shard(p)) for p in shards.list_shards(folder)}


def hidden_files(folder):
    return [name for name in os.listdir(folder) if name.startswith(".")]


def test_rounds_write_one_shard_set_each_with_metrics(tmp_path, sim_env, tasks, the_world, qwen_renderer, expert):
    scorer = scoring.make_scorer(sim_env, world=the_world, generate_images=False)
    config = runner.RolloutConfig(group_size=2, concurrency=4, seed=5, run_id="a0", episode=CONFIG)
    out, metrics_path = tmp_path / "shards", tmp_path / "actor.jsonl"

    def run(max_rounds):
        rounds = decoupled.RoundsConfig(max_rounds=max_rounds, metrics_path=str(metrics_path))
        return asyncio.run(decoupled.arun_rounds(sim_env, expert, tasks[:3], renderer=qwen_renderer, out_dir=out,
                                                 config=config, rounds=rounds, scorer=scorer, prefix="a0",
                                                 records_per_shard=4))

    summary = run(2)
    assert (summary.num_rounds, summary.num_groups, summary.num_trajectories) == (2, 6, 12)
    assert summary.versions == (3, 3) and summary.stopped_by == "max_rounds"
    written = read_all(out)
    assert sorted(written) == [f"a0-r0000{r}-0000{s}.array_record" for r in (0, 1) for s in (0, 1)]
    assert [len(v) for _, v in sorted(written.items())] == [4, 2, 4, 2]
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    seeds = []
    for r, row in enumerate(rows):
        trajectories = written[f"a0-r0000{r}-00000.array_record"] + written[f"a0-r0000{r}-00001.array_record"]
        # group ids are <run_id>-r<round>/<index>/<task>; the round visits the tasks in numpy's permutation order
        order = np.random.default_rng([5, r]).permutation(3)
        by_index = {int(t.group_id.split("/")[1]): t.task_id for t in trajectories}
        assert all(t.group_id.startswith(f"a0-r0000{r}/") for t in trajectories)
        assert [by_index[i] for i in range(3)] == [tasks[i].id for i in order]
        assert {t.policy_version for t in trajectories} == {3}
        groups = collections.defaultdict(list)
        for t in trajectories:
            groups[t.group_id].append(t.reward)
        assert all(len(g) == 2 for g in groups.values())
        flat = [t.reward for t in trajectories]
        assert row["round"] == r and row["version"] == 3 and (row["groups"], row["episodes"]) == (3, 6)
        assert row["reward_mean"] == pytest.approx(np.mean(flat))
        assert row["zero_variance_share"] == pytest.approx(np.mean([max(g) == min(g) for g in groups.values()]))
        assert row["episodes_per_s"] > 0 and row["shards"] == 2 and row["stopped"] is False
        seeds.append(sorted(t.metadata["seed"] for t in trajectories))
    assert not set(seeds[0]) & set(seeds[1])  # each round samples with its own seeds

    assert run(1).num_rounds == 1  # a restarted actor continues the round numbering
    assert json.loads(metrics_path.read_text().splitlines()[-1])["round"] == 2
    assert sorted(read_all(out))[-2:] == ["a0-r00002-00000.array_record", "a0-r00002-00001.array_record"]


def test_stop_event_ends_a_round_with_complete_groups(tmp_path, sim_env, tasks, the_world, qwen_renderer, expert):
    scorer = scoring.make_scorer(sim_env, world=the_world, generate_images=False)
    config = runner.RolloutConfig(group_size=3, concurrency=2, seed=1, run_id="b", episode=CONFIG)
    out = tmp_path / "shards"

    async def run():
        stop = asyncio.Event()

        async def stop_after_first_shard():
            while not (out.is_dir() and shards.list_shards(out)):
                await asyncio.sleep(0.01)
            stop.set()

        stopper = asyncio.ensure_future(stop_after_first_shard())
        summary = await decoupled.arun_rounds(sim_env, expert, tasks, renderer=qwen_renderer, out_dir=out,
                                              config=config, scorer=scorer, stop=stop, records_per_shard=2)
        await stopper
        return summary

    summary = asyncio.run(run())
    assert summary.stopped_by == "signal" and summary.num_rounds == 1 and summary.num_groups < len(tasks)
    trajectories = [t for v in read_all(out).values() for t in v]
    assert len(trajectories) == summary.num_trajectories == 3 * summary.num_groups
    assert all(n == 3 for n in collections.Counter(t.group_id for t in trajectories).values())
    assert not hidden_files(out)


def test_stop_conditions_and_errors(tmp_path, sim_env, tasks, qwen_renderer, expert):
    stop_file = tmp_path / "STOP"
    stop_file.touch()
    rounds = decoupled.RoundsConfig(stop_file=str(stop_file))
    summary = asyncio.run(decoupled.arun_rounds(sim_env, expert, tasks, renderer=qwen_renderer, out_dir=tmp_path,
                                                rounds=rounds))
    assert (summary.num_rounds, summary.stopped_by, summary.shards) == (0, "stop_file", ())
    assert math.isnan(summary.reward_mean) and summary.to_dict()["reward_mean"] is None
    with pytest.raises(ValueError, match="the rounds would never end"):
        asyncio.run(decoupled.arun_rounds(sim_env, expert, tasks, renderer=qwen_renderer, out_dir=tmp_path))
    with pytest.raises(ValueError, match="policy 'expert' cannot load new weights; following a weights folder needs "
                                         "the jax policy"):
        asyncio.run(decoupled.arun_rounds(sim_env, expert, tasks, renderer=qwen_renderer, out_dir=tmp_path,
                                          rounds=decoupled.RoundsConfig(max_rounds=1, weights_dir=str(tmp_path))))
    with pytest.raises(ValueError, match="RoundsConfig.max_rounds must be a positive int or None; got 0"):
        decoupled.RoundsConfig(max_rounds=0)
    with pytest.raises(TimeoutError, match=r"no weights version was published in .* within 0.05 s"):
        decoupled.wait_for_version(tmp_path / "weights", poll_s=0.01, timeout_s=0.05)
    assert decoupled.wait_for_version(tmp_path / "weights", stop_file=stop_file, poll_s=0.01) is None


def test_cli_refuses_flags_that_need_rounds_or_a_model(world_dir, capsys):
    base = ["--env", "savanna_sim", "--world", str(world_dir), "--out", "/nonexistent"]
    with pytest.raises(SystemExit):
        actor.main([*base, "--policy", "expert", "--metrics", "m.jsonl"])
    assert "--metrics writes one line per round" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        actor.main([*base, "--policy", "expert", "--weights-dir", "w"])
    assert "--weights-dir needs --policy jax (policy 'expert' cannot load new weights)" in capsys.readouterr().err


def start_actor(args, log_path):
    command = [sys.executable, "-m", "ranger_jax.rollout.actor", *args, "--quiet"]
    with open(log_path, "wb") as log:
        return subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "JAX_PLATFORMS": "cpu"})


def wait_for(condition, process, what, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.poll() is None, f"the actor exited (rc {process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_sigterm_ends_the_actor_cleanly(tmp_path, world_dir):
    out, metrics_path, summary_path = tmp_path / "out", tmp_path / "m.jsonl", tmp_path / "summary.json"
    process = start_actor(["--env", "savanna_sim", "--world", str(world_dir), "--policy", "expert",
                           "--tokenizer", str(qwen3_tokenizer_dir()), "--out", str(out), "--max-pixels", "40000",
                           "--no-images", "--limit", "2", "--group-size", "2", "--concurrency", "2",
                           "--records-per-shard", "1", "--max-rounds", "1000", "--metrics", str(metrics_path),
                           "--summary", str(summary_path)], tmp_path / "actor.log")
    try:
        wait_for(lambda: metrics_path.exists() and metrics_path.read_text().count("\n") >= 1, process, "a round")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, (tmp_path / "actor.log").read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
    summary = json.loads(summary_path.read_text())
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    assert summary["stopped_by"] == "signal" and summary["num_rounds"] == len(rows) < 1000
    trajectories = [t for v in read_all(out).values() for t in v]
    assert len(trajectories) == summary["num_trajectories"] == sum(r["episodes"] for r in rows)
    assert all(n == 2 for n in collections.Counter(t.group_id for t in trajectories).values())
    assert not hidden_files(out)


def test_actor_follows_published_weights(tmp_path, world_dir, tiny_checkpoint):
    """An actor process waits for v1, samples with it, hot-reloads v2 published while it runs, and stops on STOP.

    v2 is v1 with the final norm zeroed: its logits are all 0, so every sampled token has log-prob -log(vocab);
    seeing that in the v2 trajectories proves the new weights were sampled with, not just the version stamped.
    """
    env_file = tmp_path / "env.toml"
    env_file.write_text(registry.env_files()["savanna_sim"].read_text()
                        .replace('tools = ["text_search", "image_search", "web_fetch", "crop_image"]',
                                 'tools = ["image_search"]').replace("max_turns = 9", "max_turns = 2"))
    folder, out, metrics_path = tmp_path / "weights", tmp_path / "out", tmp_path / "m.jsonl"
    process = start_actor(["--env", str(env_file), "--world", str(world_dir), "--policy", "jax",
                           "--weights-dir", str(folder), "--out", str(out), "--limit", "1", "--group-size", "2",
                           "--concurrency", "2", "--max-new-tokens", "8", "--max-context-tokens", "2048",
                           "--min-pixels", "1024", "--max-pixels", "16384", "--temperature", "1.0", "--top-p", "1.0",
                           "--no-images", "--poll-s", "0.1", "--metrics", str(metrics_path),
                           "--summary", str(tmp_path / "summary.json")], tmp_path / "actor.log")

    def versions():
        return {t.policy_version for v in read_all(out).values() for t in v} if out.is_dir() else set()

    try:
        model = qwen3_vl.load(tiny_checkpoint)
        time.sleep(1.0)  # the actor starts before anything is published: it waits
        weights.publish(model, folder, 1, tokenizer_dir=tiny_checkpoint)
        wait_for(lambda: 1 in versions(), process, "a shard sampled with version 1", timeout_s=90)
        norm = model.model.language_model.norm.weight
        norm.set_value(jnp.zeros_like(norm.get_value()))
        weights.publish(model, folder, 2, tokenizer_dir=tiny_checkpoint)
        wait_for(lambda: 2 in versions(), process, "a shard sampled with version 2")
        (folder / "STOP").touch()
        assert process.wait(timeout=60) == 0, (tmp_path / "actor.log").read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stopped_by"] == "stop_file" and summary["versions"] == sorted(summary["versions"])
    assert set(summary["versions"]) == {1, 2}
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    assert [r["version"] for r in rows] == summary["versions"] and [r["round"] for r in rows] == list(range(len(rows)))
    vocab = json.loads((tiny_checkpoint / "config.json").read_text())["text_config"]["vocab_size"]
    by_version = collections.defaultdict(list)
    for name, trajectories in read_all(out).items():
        round_index = int(name.split("-r")[1][:5])
        for t in trajectories:
            assert t.policy_version == rows[round_index]["version"] and t.metadata["policy_versions"]
            assert set(t.metadata["policy_versions"]) == {t.policy_version}
            by_version[t.policy_version].append(t.sampler_logprobs[t.loss_mask.astype(bool)])
    uniform = -math.log(vocab)
    v1, v2 = np.concatenate(by_version[1]), np.concatenate(by_version[2])
    assert v1.size and v2.size
    np.testing.assert_allclose(v2, uniform, atol=1e-5)
    assert np.abs(v1 - uniform).max() > 1e-3  # the random v1 is not uniform
    assert not hidden_files(out)
