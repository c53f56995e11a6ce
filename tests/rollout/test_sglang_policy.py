"""The SGLang wire path of a rollout: `SGLangPolicy` and `SGLangClient` against a loopback server that speaks
SGLang's native API with OUR sampler behind it (no SGLang runs here). Images across turns, the wire contract's
errors, weight updates and cache flushes."""

import asyncio

import httpx
import numpy as np
import pytest
from PIL import Image
from support.sglang_server import SGLangSamplerServer

from ranger_jax.clients import sglang
from ranger_jax.rollout import actor, policy, sampler_policy, sequence, sglang_policy

ROWS, CAPACITY = 2, 2048
VISION = sequence.VisionSettings(min_pixels=1024, max_pixels=16_384)


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tiny_sampler):
    with SGLangSamplerServer(tiny_checkpoint, sampler=tiny_sampler, num_rows=ROWS, capacity=CAPACITY,
                             min_pixels=VISION.min_pixels, max_pixels=VISION.max_pixels) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with sglang.SGLangClient(server.url, max_retries=0) as c:
        yield c


def picture(seed, size):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (*size[::-1], 3), dtype=np.uint8))


def two_turns(renderer, state):
    """Requests of a two-turn episode with one image per observation (the second built from the first reply)."""
    tok = renderer.tokenizer
    first = sequence.prepare_image(picture(1, (90, 60)), VISION, img_id="IMG_001")
    second = sequence.prepare_image(picture(2, (60, 120)), VISION, img_id="IMG_002")
    prompt = (renderer.render_user("Which kit is new?", images_grid_thw=[first.grid_thw])
              + renderer.generation_prompt()).ids

    def request(turn, ids, images):
        return policy.TurnRequest(rid="ep", turn=turn, prompt_ids=ids, new_images=images,
                                  sampling=policy.SamplingParams(temperature=0.0), max_new_tokens=12,
                                  stop_token_ids=(tok.im_end_id,), seed=11 + turn, state=state)

    def follow_up(generated):
        closing = [] if generated.token_ids[-1] == tok.im_end_id else [tok.im_end_id]
        tail = renderer.render_user("<tool_response>\nIMG_002: a crop\n</tool_response>",
                                    images_grid_thw=[second.grid_thw]) + renderer.generation_prompt()
        ids = np.concatenate([prompt, generated.token_ids, closing, renderer.assistant_suffix().ids, tail.ids])
        return request(1, ids.astype(np.int32), (second,))

    return request(0, prompt, (first,)), follow_up, (first, second)


def play(pol, renderer, state):
    first, follow_up, _ = two_turns(renderer, state)

    async def go():
        a = await pol.generate(first)
        b = await pol.generate(follow_up(a))
        await pol.release("ep")
        return a, b

    return asyncio.run(go())


def test_images_across_turns_survive_the_wire_path(server, tiny_sampler, tiny_renderer, tiny_env, tasks):
    """The same sampler in process and behind the wire gives equal tokens and log-probs: the requests carry what
    the server needs to reproduce the local turns (cumulative PNG data URLs, expanded ids, seed, rid)."""
    state = tiny_env.reset(tasks[0])
    local = play(sampler_policy.SamplerPolicy(tiny_sampler, num_rows=ROWS, capacity=CAPACITY), tiny_renderer, state)
    server.flush()
    before = server.http.count("POST", "/generate")
    remote = play(sglang_policy.SGLangPolicy(sglang.SGLangClient(server.url)), tiny_renderer, state)
    for ours, theirs in zip(local, remote):
        np.testing.assert_array_equal(ours.token_ids, theirs.token_ids)
        np.testing.assert_array_equal(ours.logprobs, theirs.logprobs)
        assert ours.finish_reason == theirs.finish_reason and theirs.weight_version == "default"
    bodies = [r.json() for r in server.http.requests[before:] if r.path == "/generate"]
    assert [len(b["image_data"]) for b in bodies] == [1, 2]  # cumulative, as PNG data URLs of the prepared pixels
    assert all(url.startswith("data:image/png;base64,") for url in bodies[1]["image_data"])
    pads, images = tiny_renderer.tokenizer.image_pad_id, two_turns(tiny_renderer, state)[2]
    # the ids arrive expanded once: one pad per merged patch of each image so far
    assert [b["input_ids"].count(pads) for b in bodies] == [images[0].num_tokens, images[0].num_tokens
                                                           + images[1].num_tokens]
    assert remote[0].info["cached_tokens"] == 0 and remote[1].info["cached_tokens"] > len(bodies[0]["input_ids"])
    assert bodies[1]["sampling_params"]["sampling_seed"] == 12 and bodies[1]["rid"] == "ep#1"


def test_server_speaks_the_wire_contract(server, client, tiny_renderer):
    tok = tiny_renderer.tokenizer
    raw = httpx.post(server.url + "/generate", json={"input_ids": [1, 2], "sampling_params": {"max_tokens": 4}})
    assert raw.status_code == 400 and raw.json()["error"].startswith("unknown field `max_tokens`, expected one of")
    raw = httpx.post(server.url + "/generate", json={"input_ids": [1], "sampling_params": {"temperature": "hot"}})
    assert raw.status_code == 400 and 'invalid type: string "hot"' in raw.json()["error"]
    raw = httpx.post(server.url + "/generate", content=b"{not json")
    assert raw.status_code == 400 and raw.json()["object"] == "error"
    image = sequence.prepare_image(picture(3, (64, 64)), VISION)
    with pytest.raises(sglang.InvalidInput, match="input_ids hold 0 image tokens but the 1 images"):
        client.generate([tok.im_start_id, 20, 21], image_data=[image.image])
    with pytest.raises(sglang.InvalidInput, match="takes input_ids only"):
        client.generate(text="hello")
    result = client.generate([tok.im_start_id, 20, 21], sampling_params={"max_new_tokens": 3, "temperature": 0,
                                                                          "ignore_eos": True})
    assert result.finish_reason == "length" and result.output_ids.size == 3 and result.completion_tokens == 3
    assert (result.output_logprobs < 0).all() and result.text == tok.decode(result.output_ids)
    assert client.health() and client.get_model_info().has_image_understanding


def test_weight_updates_change_versions_and_outputs(server, client, tiny_checkpoint, tmp_path, tiny_renderer):
    other = actor.write_tiny_checkpoint(tmp_path / "step5", tiny_checkpoint, seed=99)
    prompt = [tiny_renderer.tokenizer.im_start_id, 30, 31, 32]
    greedy = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    before = client.generate(prompt, sampling_params=greedy)
    continued = prompt + before.output_ids.tolist() + [40]
    assert client.generate(continued, sampling_params=greedy).cached_tokens == len(continued) - 1  # row reused
    server.flush()
    assert client.generate(continued, sampling_params=greedy).cached_tokens == 0
    try:
        update = client.update_weights_from_disk(str(other), weight_version="step_5")
        assert "Weight version updated to step_5" in update.message
        assert client.get_model_info().weight_version == "step_5"
        after = client.generate(prompt, sampling_params=greedy)
        assert after.weight_version == "step_5" and after.cached_tokens == 0  # the update flushed the cache
        assert not np.array_equal(after.output_logprobs, before.output_logprobs)
        assert sglang_policy.version_number(after.weight_version, 0) == 5
        with pytest.raises(sglang.WeightUpdateFailed, match="Failed to get weights iterator"):
            client.update_weights_from_disk(str(tmp_path / "missing"))
    finally:
        client.update_weights_from_disk(str(tiny_checkpoint), weight_version="default")
    restored = client.generate(prompt, sampling_params=greedy)
    np.testing.assert_array_equal(restored.output_ids, before.output_ids)
    assert "Cache flushed." in client.flush_cache()


def test_policy_helpers():
    assert sglang_policy.version_number("12", 0) == 12 and sglang_policy.version_number("default", 3) == 3
    assert sglang_policy.version_number("step_7", 0) == 7
    request = policy.TurnRequest(rid="r", turn=2, prompt_ids=np.array([1]), new_images=(),
                                 sampling=policy.SamplingParams(temperature=0.6, top_p=0.9, top_k=20),
                                 max_new_tokens=64, stop_token_ids=(2,), seed=5, state=None)
    assert sglang_policy.sampling_params(request) == {
        "max_new_tokens": 64, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "stop_token_ids": [2],
        "sampling_seed": 5, "skip_special_tokens": False}
    params = sampler_policy.sampler_params(request)
    assert (params.top_k, params.seed, params.stop_token_ids) == (20, 5, (2,))
    with pytest.raises(ValueError, match="episode r: the sampler row holds 2 tokens that are not a prefix of the "
                                         "1-token prompt"):
        sampler_policy.new_segment([1, 2], request)
    assert sampler_policy.new_segment([1], request) is None
