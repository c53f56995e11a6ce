"""The sampler on a (2, 2, 2) mesh equals one device, its cache follows the SAMPLE rules; every error names its thing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from support import tiny_hf

from ranger_jax.models.qwen3_vl import Qwen3VLConfig, init, load
from ranger_jax.parallel.mesh import make_mesh
from ranger_jax.sampling import Buckets, Sampler, SamplingParams, Segment


def test_sharded_sampler_matches_one_device(tiny, to_segments):
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharded = Sampler(load(tiny.path, mesh=mesh, sharding_rules="sample"), mesh=mesh, buckets=tiny.sampler.buckets)
    prompts = to_segments(tiny_hf.make_batch(tiny.config, [[4, (4, 6), 3], [6], [2, (2, 2), 5], [11]], seed=41))
    params = [SamplingParams(temperature=0.0, max_new_tokens=10),
              SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_new_tokens=10),
              SamplingParams(temperature=1.0, top_k=7, seed=4, max_new_tokens=10),
              SamplingParams(temperature=0.0, max_new_tokens=7, stop_token_ids=(2,))]
    session = sharded.new_session(4)
    expected = NamedSharding(mesh, PartitionSpec(("data", "fsdp"), "tensor", None, None))  # [B, K, S, H]
    assert session.caches[0].key.sharding.is_equivalent_to(expected, 4)
    sharded.append(session, prompts)
    out = sharded.generate(session, params)
    for cache in session.caches:
        assert cache.key.sharding.is_equivalent_to(expected, 4) and cache.value.sharding.is_equivalent_to(expected, 4)
    ref = tiny.sampler.complete(prompts, params)
    for row, (a, b) in enumerate(zip(out, ref)):
        np.testing.assert_array_equal(a.token_ids, b.token_ids, err_msg=f"row {row}")
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        assert a.finish_reason == b.finish_reason
    # a forked row keeps the cache's sharding and continues its source exactly
    sharded.fork_rows(session, 0, [2])
    for cache in session.caches:
        assert cache.key.sharding.is_equivalent_to(expected, 4) and cache.value.sharding.is_equivalent_to(expected, 4)
    again = sharded.generate(session, [params[0], None, params[0], None])
    np.testing.assert_array_equal(again[0].token_ids, again[2].token_ids)
    np.testing.assert_allclose(again[0].logprobs, again[2].logprobs, atol=1e-5)


def test_calls_on_a_few_rows_of_a_sharded_session_keep_its_sharding(tiny, to_segments):
    """Sub-batch calls (`Buckets.active_rows`) on the mesh: the same tokens as one device, the cache's sharding kept."""
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    buckets = dataclasses.replace(tiny.sampler.buckets, min_batch=8, min_active_rows=2)
    sharded = Sampler(load(tiny.path, mesh=mesh, sharding_rules="sample"), mesh=mesh, buckets=buckets)
    single = Sampler(tiny.model, buckets=buckets)
    prompts = to_segments(tiny_hf.make_batch(tiny.config, [[4, (4, 6), 3], [6], [9]], seed=43))
    params = [SamplingParams(temperature=1.0, seed=5, max_new_tokens=8), None, None, None, None, None, None,
              SamplingParams(temperature=0.0, max_new_tokens=8)]
    expected = NamedSharding(mesh, PartitionSpec(("data", "fsdp"), "tensor", None, None))
    outs, sessions = [], []
    for sampler in (sharded, single):
        session = sampler.new_session(8)
        sampler.append(session, [prompts[0], None, None, None, None, None, None, prompts[2]])  # 2 of 8 rows
        outs.append(sampler.generate(session, params))
        sessions.append(session)
    assert sharded.compilations["append"] == sharded.compilations["decode"] == 1  # one 2-row program each
    for cache in sessions[0].caches:
        assert cache.key.sharding.is_equivalent_to(expected, 4) and cache.value.sharding.is_equivalent_to(expected, 4)
    for row in (0, 7):
        np.testing.assert_array_equal(outs[0][row].token_ids, outs[1][row].token_ids, err_msg=f"row {row}")
        np.testing.assert_allclose(outs[0][row].logprobs, outs[1][row].logprobs, atol=1e-5)


def test_errors_name_the_row_count_or_value(tiny):
    sampler, config = tiny.sampler, tiny.config
    session = sampler.new_session(2)
    grid = np.array([[1, 4, 4]])
    pixels = np.zeros((16, config.vision_config.patch_features), np.float32)
    six_pads = [3] + [config.image_token_id] * 6 + [4]
    with pytest.raises(ValueError, match=r"row 1: image tokens \(6\) != merged patches \(4\) for grid_thw=\[\[1, 4, 4\]\]"):
        sampler.append(session, [Segment([9, 10]), Segment(six_pads, pixels, grid)])
    with pytest.raises(ValueError, match=r"row 0: input_ids hold 1 ids outside the vocabulary \[0, 320\)"):
        sampler.append(session, [Segment([9, 320]), None])
    with pytest.raises(ValueError, match=r"row 0: a segment without tokens cannot carry pixel_values"):
        sampler.append(session, [Segment([], pixels, grid), None])
    with pytest.raises(ValueError, match=r"got 3 segments for a session of 2 rows"):
        sampler.append(session, [None, None, None])
    assert session.token_ids == [[], []]  # nothing was appended by the failed calls
    with pytest.raises(ValueError, match=r"row 1 holds no tokens; append a prompt before generating"):
        sampler.generate(session, [None, SamplingParams()])
    sampler.append(session, [Segment([9, 10]), None])
    with pytest.raises(ValueError, match=r"row 0: stop_token_ids \[320, -1\] are outside the vocabulary \[0, 320\)"):
        sampler.generate(session, [SamplingParams(stop_token_ids=(7, 320, -1)), None])
    with pytest.raises(ValueError, match=r"got 1 sampling params for a session of 2 rows"):
        sampler.generate(session, [SamplingParams()])
    assert sampler.generate(session, [None, None]) == [None, None]
    with pytest.raises(ValueError, match=r"row 2 is outside the session's rows \[0, 2\)"):
        session.reset_rows([0, 2])
    with pytest.raises(ValueError, match=r"num_rows must be an int >= 1, got 0"):
        sampler.new_session(0)


@pytest.mark.parametrize("field, value, match", [
    ("temperature", -0.5, r"temperature must be >= 0 \(0 = greedy\), got -0.5"),
    ("top_p", 0.0, r"top_p must be in \(0, 1\], got 0.0"),
    ("top_p", 1.5, r"top_p must be in \(0, 1\], got 1.5"),
    ("top_k", -1, r"top_k must be an int >= 0 \(0 = off\), got -1"),
    ("max_new_tokens", 0, r"max_new_tokens must be an int >= 1, got 0"),
    ("seed", 2**32, r"seed must be an int in \[0, 2\*\*32\), got 4294967296"),
])
def test_sampling_params_are_checked(field, value, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**{field: value})


def test_construction_errors(tiny):
    with pytest.raises(ValueError, match=r"Buckets.min_length must be a positive int, got 0"):
        Buckets(min_length=0)
    with pytest.raises(ValueError, match=r"suppress_token_ids \[320, 999\] are outside the vocabulary \[0, 320\)"):
        Sampler(tiny.model, suppress_token_ids=[999, 320, 7])
    assert Sampler(tiny.model, suppress_token_ids=[7]).suppressed_token_ids == (3, 4, 5, 6, 7)
    with pytest.raises(ValueError, match=r"update_weights needs a model with the sampler's config and structure"):
        tiny.sampler.update_weights(init(Qwen3VLConfig.tiny(), seed=0))
