from ranger_jax import cli


def test_demo_runs_model_round_trip_and_offline_world(tmp_path, capsys):
    assert cli.main(["demo", "--out", str(tmp_path), "--tasks", "5", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "reload identical: True" in out
    assert (tmp_path / "tiny-qwen3-vl" / "config.json").exists()
    assert (tmp_path / "world" / "tasks.jsonl").exists()
    assert "expert search_score" in out and "naive  search_score" in out
