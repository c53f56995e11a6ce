from ranger_jax import cli
from ranger_jax.data import shards


def test_demo_runs_model_world_and_rollouts(tmp_path, capsys):
    assert cli.main(["demo", "--out", str(tmp_path), "--tasks", "5", "--seed", "3", "--rollout-tasks", "1"]) == 0
    out = capsys.readouterr().out
    assert "reload identical: True" in out
    assert (tmp_path / "tiny-qwen3-vl" / "config.json").exists()
    assert (tmp_path / "world" / "tasks.jsonl").exists()
    assert "expert search_score" in out and "naive  search_score" in out
    expert = list(shards.read_shard(tmp_path / "shards" / "expert-00000.array_record"))
    policy = list(shards.read_shard(tmp_path / "shards" / "jax-00000.array_record"))
    assert len(expert) == len(policy) == 2
    assert all(t.reward > 0.9 and t.termination == "answer" for t in expert)
    assert all(t.loss_mask.sum() > 0 for t in expert + policy)
    page = (tmp_path / "expert_trajectories.html").read_text()
    assert page.count("<section") == 2 and "data:image/png;base64," in page
