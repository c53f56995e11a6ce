"""The 8B presets fail fast and name everything they miss; the recipe's dry run prints the plan."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import jax
import pytest

from ranger_jax.rl import presets

ROOT = Path(__file__).resolve().parents[2]


def _recipe():
    spec = importlib.util.spec_from_file_location("grpo_savanna", ROOT / "recipes" / "grpo_savanna.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_missing_everything_is_named(monkeypatch):
    monkeypatch.chdir(ROOT)
    problems = presets.check(presets.PRESETS["savanna-8b-tpu"], presets.ScaleOptions(), environ={},
                             devices=jax.devices())
    text = "\n".join(problems)
    for needle in ("--checkpoint", "--tasks", "$SERPER_API_KEY is not set", "$OPENAI_API_KEY is not set (the "
                   "reward's judge; named by env savanna_live)", "runs on tpu"):
        assert needle in text
    assert "judge_url" not in text  # the shipped environment names every service


def test_an_incomplete_environment_file_is_named(tmp_path):
    env_file = tmp_path / "live.toml"
    env_file.write_text('backend = "live"\n[rewards]\nkind = "judge"\n')
    preset = dataclasses.replace(presets.PRESETS["savanna-8b-gpu"], env_file=str(env_file))
    text = "\n".join(presets.check(preset, presets.ScaleOptions(), environ={}, devices=jax.devices()))
    assert "[rewards] judge_url is not set" in text and "[rewards] generator_url is not set" in text


def test_a_ready_configuration_has_no_problems(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "tokenizer.json").write_text("{}")
    tasks = tmp_path / "rl_data.json"
    tasks.write_text("[]")
    env_file = tmp_path / "live.toml"
    env_file.write_text('backend = "live"\n[rewards]\nkind = "judge"\njudge_url = "http://127.0.0.1:1/v1"\n'
                        'judge_model = "judge"\ngenerator_url = "http://127.0.0.1:2"\n')

    class Device:
        platform = "gpu"

    preset = dataclasses.replace(presets.PRESETS["savanna-8b-gpu"], env_file=str(env_file))
    options = presets.ScaleOptions(checkpoint=str(ckpt), tasks=str(tasks))
    assert presets.check(preset, options, environ={"SERPER_API_KEY": "k"}, devices=[Device()] * 8) == []
    assert "mesh (data, fsdp, tensor) = (1, -1, 1)" in presets.plan(preset, options)
    odd = dataclasses.replace(preset, mesh=(1, -1, 3))
    assert any("multiple of 3 devices" in p for p in presets.check(odd, options, environ={"SERPER_API_KEY": "k"},
                                                                    devices=[Device()] * 8))
    commands, metrics = presets.actor_commands(preset, options, weights_dir=tmp_path / "w",
                                               shards_dir=tmp_path / "s", metrics_dir=tmp_path / "m")
    assert len(commands) == preset.actors and set(metrics) == {"actor0", "actor1"}
    assert "--weights-dir" in commands[0] and "--tasks-per-round" in commands[0]
    # the learner's log-probabilities are of the distribution the actors sample
    flag = commands[0].index("--temperature")
    assert preset.learner.temperature == preset.temperature == float(commands[0][flag + 1])
    with pytest.raises(ValueError, match=r"learner's temperature \(0.7\) must be the rollout temperature \(1.0\)"):
        dataclasses.replace(preset, temperature=1.0)


def test_recipe_dry_run(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    recipe = _recipe()
    assert recipe.main(["--preset", "savanna-8b-gpu", "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert "cannot run yet" in captured.err and "--checkpoint" in captured.err
    assert recipe.main(["--dry-run", "--seed", "3"]) == 0
    assert '"seed": 3' in capsys.readouterr().out
    assert recipe.main(["--dry-run", "--grpo-schedule", "large-batch", "--set", "grpo_learning_rate=3e-4",
                        "--set", "branch_turns=[1,2]", "--grpo-steps", "5"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["grpo_tasks"], plan["grpo_tasks_per_step"], plan["grpo_steps"]) == (720, 60, 5)
    assert plan["grpo_learning_rate"] == 3e-4 and plan["branch_turns"] == [1, 2]
    for argv, message in ((["--set", "nope=1"], "SimTinyConfig has no field 'nope'"),
                          (["--grpo-schedule", "huge"], "unknown GRPO schedule 'huge'"),
                          (["--set", "group_size=1"], "GRPO needs group_size >= 2")):
        with pytest.raises(SystemExit):
            recipe.main(["--dry-run", *argv])
        assert message in capsys.readouterr().err


def test_unknown_preset_is_refused():
    with pytest.raises(SystemExit):
        _recipe().main(["--preset", "savanna-70b"])
