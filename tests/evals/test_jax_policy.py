"""A ranger_jax checkpoint as the policy of an eval (`--policy jax`): the tiny random Qwen3-VL runs its episode in
the offline world through the JAX sampler, the trajectory is kept, and an answer it never gives falls back to the
prompt alone."""
from ranger_jax.data import trajectory as trajectory_lib
from ranger_jax.env.sim import build
from ranger_jax.evals import cli, store
from ranger_jax.rollout import actor
from support.eval_services import FIXTURES
from support.tiny_tokenizer import write_tiny_tokenizer


def test_checkpoint_policy_episode(services, tmp_path):
    write_tiny_tokenizer(tmp_path / "tokenizer", vocab_size=512)
    checkpoint = actor.write_tiny_checkpoint(tmp_path / "ckpt", tmp_path / "tokenizer", seed=3)
    world = build.build_world(tmp_path / "world", 2, 11)
    summary = cli.main("savanna", ["--bench", str(FIXTURES / "savanna" / "items.jsonl"), "--out", str(tmp_path / "run"),
                                   "--limit", "1", "--policy", "jax", "--checkpoint", str(checkpoint), "--env",
                                   "savanna_sim", "--world", str(world), "--max-context-tokens", "4096",
                                   "--max-new-tokens", "16", "--generator-url", services.url, "--judge-url",
                                   services.judge_url, "--judge-api-key-env", "", "--quiet"])
    record = store.RunStore(tmp_path / "run").records()["s1"]
    assert record["agent"]["policy"] == "jax" and record["agent"]["num_turns"] >= 1
    assert record["agent"]["gen_prompt"] is None and record["generation"]["source"] == "fallback"
    trajectory = trajectory_lib.Trajectory.from_bytes((tmp_path / "run" / "items" / "s1" / "trajectory.rjt")
                                                      .read_bytes())
    assert trajectory.metadata["rl_trainable"] and trajectory.loss_mask.sum() > 0
    assert summary["settings"]["policy"]["name"] == "jax:ckpt" and summary["scores"]["search"]["Sports"] == 0.0
