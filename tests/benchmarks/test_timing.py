"""benchmarks/timing.py, the decode benchmark's timing side: its config, prompts, and both timed calls on a tiny
checkpoint (no timing asserts), plus the benchmark script that imports it as a sibling module."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import tiny_hf

from ranger_jax.models.qwen3_vl import Qwen3VLConfig, TextConfig, VisionConfig, load
from ranger_jax.sampling import Buckets, Sampler

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
CONFIG = Qwen3VLConfig(
    text_config=TextConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="silu",
                           max_position_embeddings=4096, rms_norm_eps=1e-6, attention_bias=False,
                           rope_theta=5_000_000.0, mrope_section=(3, 3, 2)),
    vision_config=VisionConfig(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                               hidden_act="gelu_pytorch_tanh", in_channels=3, patch_size=16, temporal_patch_size=2,
                               spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=16,
                               deepstack_visual_indexes=(0,)),
    image_token_id=5, video_token_id=6, vision_start_token_id=3, vision_end_token_id=4, tie_word_embeddings=False)


def _load_timing():
    spec = importlib.util.spec_from_file_location("timing", BENCHMARKS / "timing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


timing = _load_timing()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("timing_ckpt")
    hf = tiny_hf.save_checkpoint(CONFIG, path, seed=3)
    sampler = Sampler(load(path), buckets=Buckets(min_batch=2, min_length=16, min_cache=32, min_new_tokens=8))
    return hf, sampler


def test_benchmark_config_is_the_benchmark_model():
    config = timing.benchmark_config()
    t = config.text_config
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads, t.head_dim,
            t.intermediate_size, t.vocab_size) == (512, 8, 8, 4, 64, 1536, 32000)
    prompts = timing.random_prompts(config, batch=8, length=128, seed=0)
    assert prompts.shape == (8, 128) and prompts.min() > 6 and prompts.max() < 32000


def test_interleaved_calls_generate_the_same_greedy_tokens(tiny):
    hf, sampler = tiny
    prompts = timing.random_prompts(CONFIG, batch=2, length=9, seed=3)
    timed = timing.time_interleaved({
        "ours": timing.sampler_call(sampler, prompts, max_new_tokens=6),
        "torch": timing.transformers_call(hf, prompts, max_new_tokens=6),
    }, repeats=2)
    tokens, logprobs = timed["ours"]["result"]
    assert tokens.shape == timed["torch"]["result"].shape == (2, 6)
    np.testing.assert_array_equal(tokens, timed["torch"]["result"])
    assert np.all(logprobs <= 0)
    for entry in timed.values():
        assert len(entry["times"]) == 2 and entry["seconds"] == np.median(entry["times"]) and entry["first_s"] > 0
    assert timing.decode_seconds(sampler, prompts, max_new_tokens=6, repeats=1) > 0


def test_decode_benchmark_script_finds_its_sibling_module():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "decode_vs_torch.py"), "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--new" in done.stdout and "--json" in done.stdout


def test_active_rows_benchmark_parses_and_checks_its_arguments():
    script = str(BENCHMARKS / "active_rows.py")
    done = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--min-active-rows" in done.stdout and "--sampled" in done.stdout
    bad = subprocess.run([sys.executable, script, "--concurrency", "8", "--min-active-rows", "8"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--min-active-rows must be in [1, --concurrency); got 8" in bad.stderr


def test_worker_stages_benchmark_parses_and_checks_its_arguments():
    script = str(BENCHMARKS / "worker_stages.py")
    done = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--workers" in done.stdout and "--sft-worlds" in done.stdout
    bad = subprocess.run([sys.executable, script, "--workers", "-1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--workers must be >= 0" in bad.stderr


def test_pinned_workers_benchmark_parses_and_checks_its_arguments():
    script = str(BENCHMARKS / "pinned_workers.py")
    done = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--processes" in done.stdout and "--sampled" in done.stdout
    bad = subprocess.run([sys.executable, script, "--processes", "1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "--processes must be at least 2 (one process has nothing to share); got 1" in bad.stderr


def test_learner_shapes_benchmark_parses_and_checks_its_arguments(tmp_path):
    script = str(BENCHMARKS / "learner_shapes.py")
    done = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--run" in done.stdout and "--rounds" in done.stdout
    bad = subprocess.run([sys.executable, script, "--run", str(tmp_path), "--rounds", "0"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--rounds must be >= 1; got 0" in bad.stderr
    empty = subprocess.run([sys.executable, script, "--run", str(tmp_path)], capture_output=True, text=True,
                           timeout=120)
    assert empty.returncode == 2 and "lacks summary.json: pass a finished sim-tiny run folder" in empty.stderr
