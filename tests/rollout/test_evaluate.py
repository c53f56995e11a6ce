"""Savanna-style evaluation of a checkpoint through the JAX sampler (greedy), with the env settings it carries
(`ranger_env.json`), and of agents by name, object or callable."""

import json
import runpy
import shutil
import sys
from pathlib import Path

import pytest

from ranger_jax import env
from ranger_jax.rollout import episode, evaluate, policy, sequence, trained_env

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
    assert first["sampling"] == {"temperature": 0.0, "concurrency": 2}
    assert first["search_score"] == first["reward_mean"] == 0.0  # a random policy never answers
    for row in first["episodes"]:
        assert row["termination"] in ("repeated_response", "no_answer") and row["zero_reason"] is not None
        assert row["num_turns"] <= 3 and row["last_response"]
    out = tmp_path / "second.json"  # the second run goes through the command line
    monkeypatch.setattr(sys, "argv", ["savanna_sim.py", "--world", str(world_dir), "--policy", str(checkpoint),
                                      "--json", str(out), "--limit", "2", "--concurrency", "2"])
    runpy.run_path(str(REPO / "evals" / "savanna_sim.py"), run_name="__main__")
    second = json.loads(out.read_text())
    assert second == json.loads(json.dumps(first))  # greedy: the same turns, rows and summary


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
    ]:
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match=match):
            trained_env.read(tmp_path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        trained_env.read(tmp_path)
