"""Weight sync for SGLang actors: the learner publishes a version, every policy server (stand-in `sglang`
processes on loopback) loads it with /update_weights_from_disk under that version's number, and a turn sampled
afterwards records the version the server reported; failures name the server."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
from PIL import Image
from support import sglang_standin

from ranger_jax.clients import sglang_pool
from ranger_jax.models import qwen3_vl
from ranger_jax.parallel.distributed import free_port
from ranger_jax.rl import weights
from ranger_jax.rollout import policy as policy_lib
from ranger_jax.rollout import sequence, sglang_policy
from ranger_jax.serving import sglang_server as srv
from ranger_jax.serving import weight_sync


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("standin")
    sglang_standin.install(root / "bin")
    env = {"PATH": f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    running = srv.start_replicas([srv.PolicyServer(model_path="base", port=free_port()) for _ in range(2)],
                                 log_dir=root / "logs", envs=[env, env])
    stale = srv.ManagedServer(srv.PolicyServer(model_path="base", port=free_port()), log_path=root / "logs" / "stale",
                              env={**env, "STANDIN_IGNORE_VERSION": "1"}, poll_s=0.1)
    with stale:
        yield [s.url for s in running], stale.url
    for server in running:
        server.stop()


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    folder = tmp_path_factory.mktemp("weights")
    return weights.publish(qwen3_vl.init(qwen3_vl.Qwen3VLConfig.tiny(), seed=0), folder, 3), folder


def turn(rid: str) -> policy_lib.TurnRequest:
    image = sequence.prepare_image(Image.new("RGB", (64, 96), (9, 9, 9)), sequence.VisionSettings(), img_id="IMG_001")
    ids = np.array([1, 3, *[5] * image.num_tokens, 4, 20, 21], np.int32)
    return policy_lib.TurnRequest(rid=rid, turn=0, prompt_ids=ids, new_images=(image,),
                                  sampling=policy_lib.SamplingParams(), max_new_tokens=8, stop_token_ids=(2,), seed=0,
                                  state=None)


def test_every_server_loads_the_version_and_turns_record_it(servers, published):
    urls, _ = servers
    path, _ = published
    result = weight_sync.SGLangWeightSync(urls).update(3, path)
    assert result.reported == {url: "3" for url in urls} and result.server_path == str(path)
    policy = sglang_policy.SGLangPolicy(sglang_pool.connect(urls), image_pad_id=5)

    async def sample():
        try:
            return [await policy.generate(turn(f"episode{i}")) for i in range(4)]
        finally:
            await policy.aclose()

    generations = asyncio.run(sample())
    assert {(g.policy_version, g.weight_version) for g in generations} == {(3, "3")}
    assert policy.client.sent == [2, 2]


def test_server_paths_map_the_learners_folder_to_the_servers(servers, published, tmp_path):
    urls, _ = servers
    path, folder = published
    mounted = weight_sync.SGLangWeightSync(urls[:1], server_path=lambda p: p.replace(str(folder), "/gcs/run1"))
    with pytest.raises(weight_sync.WeightSyncFailed, match=rf"{urls[0]} did not load /gcs/run1/v000003 as version 4"):
        mounted.update(4, path)


def test_a_server_that_keeps_its_old_version_is_named(servers, published):
    _, stale = servers
    path, _ = published
    with pytest.raises(weight_sync.WeightSyncFailed, match=rf"1 of 1 servers failed: {stale} reports weight_version "
                                                           r"'default' after loading .* as version 3"):
        weight_sync.SGLangWeightSync([stale]).update(3, path)
