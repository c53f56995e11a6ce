"""The SGLang wire path of a rollout: `SGLangPolicy` and `SGLangClient` against a loopback server that speaks
SGLang's native API with OUR sampler behind it (no SGLang runs here). Images across turns (one placeholder per
image on the wire, expanded runs in the trajectory), the re-tokenisation drift that expanded runs would cause, seeds
honoured only by a deterministic server, the wire contract's errors, weight updates and cache flushes."""

import asyncio

import httpx
import numpy as np
import pytest
from PIL import Image
from support.sglang_server import SGLangSamplerServer

from ranger_jax.clients import sglang, sglang_mm
from ranger_jax.rollout import actor, policy, sampler_policy, sequence, sglang_policy

ROWS, CAPACITY = 2, 2048
VISION = sequence.VisionSettings(min_pixels=1024, max_pixels=16_384)


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tiny_sampler):
    with SGLangSamplerServer(tiny_checkpoint, sampler=tiny_sampler, num_rows=ROWS, capacity=CAPACITY,
                             min_pixels=VISION.min_pixels, max_pixels=VISION.max_pixels,
                             deterministic_inference=True) as s:
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
    the server needs to reproduce the local turns (cumulative PNG data URLs, one placeholder per image, seed, rid),
    and the server's expanded prompt is exactly the trajectory's."""
    state = tiny_env.reset(tasks[0])
    local = play(sampler_policy.SamplerPolicy(tiny_sampler, num_rows=ROWS, capacity=CAPACITY), tiny_renderer, state)
    server.flush()
    before, retokenized = server.http.count("POST", "/generate"), server.retokenized
    pads = tiny_renderer.tokenizer.image_pad_id
    remote = play(sglang_policy.SGLangPolicy(sglang.SGLangClient(server.url), image_pad_id=pads), tiny_renderer, state)
    for ours, theirs in zip(local, remote):
        np.testing.assert_array_equal(ours.token_ids, theirs.token_ids)
        np.testing.assert_array_equal(ours.logprobs, theirs.logprobs)
        assert ours.finish_reason == theirs.finish_reason and theirs.weight_version == "default"
    bodies = [r.json() for r in server.http.requests[before:] if r.path == "/generate"]
    assert [len(b["image_data"]) for b in bodies] == [1, 2]  # cumulative, as PNG data URLs of the prepared pixels
    assert all(url.startswith("data:image/png;base64,") for url in bodies[1]["image_data"])
    first, follow_up, images = two_turns(tiny_renderer, state)
    second = follow_up(remote[0])
    # one placeholder per image on the wire; the server expanded them back to the trajectory's prompt exactly
    assert [b["input_ids"].count(pads) for b in bodies] == [1, 2] and server.retokenized == retokenized
    assert server.last_prompt == second.prompt_ids.tolist()
    assert len(bodies[1]["input_ids"]) == second.prompt_ids.size - images[0].num_tokens - images[1].num_tokens + 2
    assert [g.info["prompt_tokens"] for g in remote] == [first.prompt_ids.size, second.prompt_ids.size]
    assert [g.info["sent_tokens"] for g in remote] == [len(b["input_ids"]) for b in bodies]
    assert remote[0].info["cached_tokens"] == 0 and remote[1].info["cached_tokens"] > first.prompt_ids.size
    assert bodies[1]["sampling_params"]["sampling_seed"] == 12 and bodies[1]["rid"] == "ep#1"
    assert remote[1].info["sampling_seed"] == 12 and remote[1].info["seed_honoured"] is True


def test_expanded_runs_make_the_server_retokenise(server, client, tiny_renderer):
    """What upstream does with a prompt whose image runs are already expanded: it decodes and re-tokenises it, and a
    sampled spelling the tokenizer would not write comes back as other tokens. One placeholder per image keeps every
    id, and the server's prompt is then ours, position for position."""
    tok = tiny_renderer.tokenizer
    image = sequence.prepare_image(picture(4, (64, 48)), VISION)
    split = [i for ch in " quick" for i in tok.encode(ch)]  # one token per character, as a policy may sample them
    assert tok.encode(" quick") != split and tok.decode(split) == " quick"
    ids = np.concatenate([(tiny_renderer.render_user("Which kit is new?", images_grid_thw=[image.grid_thw])
                           + tiny_renderer.generation_prompt()).ids, split]).astype(np.int64)
    greedy = {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}
    retokenized = server.retokenized
    drifted = client.generate(ids, image_data=[image.image], sampling_params=greedy)
    assert server.retokenized == retokenized + 1
    assert drifted.prompt_tokens < ids.size and server.last_prompt != ids.tolist()  # " quick" became fewer tokens
    sent = sglang_mm.collapse_image_runs(ids, tok.image_pad_id, [image.num_tokens])
    kept = client.generate(sent, image_data=[image.image], sampling_params=greedy)
    assert server.retokenized == retokenized + 1 and kept.prompt_tokens == ids.size
    assert server.last_prompt == ids.tolist()


def test_policy_refuses_a_prompt_the_server_expanded_differently(server, tiny_renderer, tiny_env, tasks):
    """A server whose processor sizes images differently (other pixel bounds) runs another prompt: the turn fails
    with both counts instead of recording tokens and log-probs of a prompt that was not ours."""
    state = tiny_env.reset(tasks[0])
    first, _, images = two_turns(tiny_renderer, state)
    pol = sglang_policy.SGLangPolicy(sglang.SGLangClient(server.url), image_pad_id=tiny_renderer.tokenizer.image_pad_id)
    server.max_pixels = 1024
    try:
        with pytest.raises(sglang_mm.PromptMismatch, match=rf"request ep#0: SGLang ran a \d+-token prompt but the "
                                                           rf"trajectory's prompt has {first.prompt_ids.size} tokens"):
            asyncio.run(pol.generate(first))
    finally:
        server.max_pixels = VISION.max_pixels
    count = images[0].num_tokens
    with pytest.raises(ValueError, match=rf"episode cut turn 0: image 0: the placeholder run at position \d+ has "
                                         rf"{count - 1} tokens but the image has {count}"):
        asyncio.run(pol.generate(_cut_run(first, tiny_renderer.tokenizer.image_pad_id)))


def _cut_run(request, pad_id):
    """The request with one placeholder dropped from its image's run (a prompt that disagrees with its image)."""
    ids = request.prompt_ids.tolist()
    ids.remove(pad_id)
    return policy.TurnRequest(rid="cut", turn=0, prompt_ids=np.asarray(ids, np.int32), new_images=request.new_images,
                              sampling=request.sampling, max_new_tokens=request.max_new_tokens,
                              stop_token_ids=request.stop_token_ids, seed=request.seed, state=request.state)


def test_sampling_seed_is_honoured_only_by_a_deterministic_server(server, client, tiny_renderer):
    prompt = [tiny_renderer.tokenizer.im_start_id, 40, 41, 42]
    seeded = {"max_new_tokens": 12, "temperature": 1.0, "ignore_eos": True, "sampling_seed": 5}
    assert client.get_server_info().deterministic_inference is True
    same = [client.generate(prompt, sampling_params=seeded).output_ids for _ in range(2)]
    np.testing.assert_array_equal(*same)
    server.deterministic_inference = False
    try:
        assert client.get_server_info().deterministic_inference is False
        differ = [client.generate(prompt, sampling_params=seeded).output_ids for _ in range(2)]
        assert not np.array_equal(*differ)  # the seed was ignored: each request sampled with its own
        pol = sglang_policy.SGLangPolicy(sglang.SGLangClient(server.url),
                                         image_pad_id=tiny_renderer.tokenizer.image_pad_id)
        request = policy.TurnRequest(rid="s", turn=0, prompt_ids=np.asarray(prompt, np.int32), new_images=(),
                                     sampling=policy.SamplingParams(temperature=1.0), max_new_tokens=3,
                                     stop_token_ids=(), seed=5, state=None)
        generation = asyncio.run(pol.generate(request))
        assert (generation.info["sampling_seed"], generation.info["seed_honoured"]) == (5, False)
    finally:
        server.deterministic_inference = True


def test_server_speaks_the_wire_contract(server, client, tiny_renderer):
    tok = tiny_renderer.tokenizer
    raw = httpx.post(server.url + "/generate", json={"input_ids": [1, 2], "sampling_params": {"max_tokens": 4}})
    assert raw.status_code == 400 and raw.json()["error"].startswith("unknown field `max_tokens`, expected one of")
    raw = httpx.post(server.url + "/generate", json={"input_ids": [1], "sampling_params": {"temperature": "hot"}})
    assert raw.status_code == 400 and 'invalid type: string "hot"' in raw.json()["error"]
    raw = httpx.post(server.url + "/generate", content=b"{not json")
    assert raw.status_code == 400 and raw.json()["object"] == "error"
    image = sequence.prepare_image(picture(3, (64, 64)), VISION)
    with pytest.raises(sglang.InvalidInput, match=r"prompt has 0 image placeholder token\(s\) but 1 image\(s\)"):
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
