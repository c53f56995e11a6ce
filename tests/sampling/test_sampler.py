"""The sampler against transformers' `generate`, multi-turn appends against one-shot prompts, stops, seeds, buckets."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import torch
from support import tiny_hf

from ranger_jax.models.qwen3_vl import get_rope_index, load
from ranger_jax.sampling import FINISH_LENGTH, FINISH_STOP, Sampler, SamplingParams, Segment, steps

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


def _hf_greedy(hf, batch, max_new_tokens: int, vision_ids) -> tuple[np.ndarray, np.ndarray]:
    """transformers' greedy `generate` on a left-padded batch: new tokens and their log_softmax of the raw logits."""
    with torch.no_grad():
        out = hf.generate(**tiny_hf.torch_inputs(batch), max_new_tokens=max_new_tokens, do_sample=False,
                          suppress_tokens=list(vision_ids), output_logits=True, return_dict_in_generate=True,
                          pad_token_id=0, eos_token_id=None)
    tokens = out.sequences[:, -max_new_tokens:].numpy()
    logprobs = torch.log_softmax(torch.stack(out.logits, 1).double(), -1).numpy()
    return tokens, np.take_along_axis(logprobs, tokens[..., None], -1)[..., 0]


@pytest.mark.parametrize("rows", [
    [[4, (4, 6), 3], [2, (2, 4), 3, (4, 4), 2], [7]],  # images of different sizes, a text row, padded batch
    [[9], [3], [14]],  # text only, padded batch
], ids=["images", "text"])
def test_greedy_matches_transformers_generate(tiny, to_segments, rows):
    batch = tiny_hf.make_batch(tiny.config, rows, padding_side="left", seed=11)
    ref_tokens, ref_logprobs = _hf_greedy(tiny.hf, batch, GREEDY.max_new_tokens, tiny.vision_ids)
    completions = tiny.sampler.complete(to_segments(batch), GREEDY)
    for row, completion in enumerate(completions):
        np.testing.assert_array_equal(completion.token_ids, ref_tokens[row], err_msg=f"row {row}")
        assert np.abs(completion.logprobs - ref_logprobs[row]).max() <= 1e-4
        assert completion.finish_reason == FINISH_LENGTH and completion.logprobs.dtype == np.float32


def test_multi_turn_appends_equal_one_shot_on_the_concatenation(tiny, to_segments):
    """Turn 2 appends a tool response with two new images to the cache; tokens, log-probs, positions and rope deltas
    equal a fresh run on the whole concatenated sequence (a sampled row too: its keys follow its length)."""
    sampler, config = tiny.sampler, tiny.config
    first = to_segments(tiny_hf.make_batch(config, [[2, (4, 6), 1], [5]], seed=21))
    second = to_segments(tiny_hf.make_batch(config, [[1, (2, 4), 2, (4, 4), 1], [3]], seed=22))
    turn2 = [SamplingParams(temperature=0.0, max_new_tokens=6), SamplingParams(temperature=0.9, seed=5,
                                                                                max_new_tokens=6)]
    session = sampler.new_session(2)
    sampler.append(session, first)
    reply = sampler.generate(session, SamplingParams(temperature=0.0, max_new_tokens=4))
    sampler.append(session, second)
    incremental = sampler.generate(session, turn2)

    whole = []
    for a, r, b in zip(first, reply, second):
        ids = np.concatenate([a.token_ids, r.token_ids, b.token_ids])
        images = [s for s in (a, b) if s.pixel_values is not None]
        if images:
            whole.append(Segment(ids, np.concatenate([s.pixel_values for s in images]),
                                 np.concatenate([s.image_grid_thw for s in images])))
        else:
            whole.append(Segment(ids))
    one_shot = sampler.complete(whole, turn2)
    for row in range(2):
        np.testing.assert_array_equal(incremental[row].token_ids, one_shot[row].token_ids, err_msg=f"row {row}")
        np.testing.assert_allclose(incremental[row].logprobs, one_shot[row].logprobs, atol=1e-5)
        assert session.token_ids[row] == [*whole[row].token_ids, *incremental[row].token_ids]

    assert session.image_grid_thw == [[(1, 4, 6), (1, 2, 4), (1, 4, 4)], []]
    rope_kw = dict(image_token_id=config.image_token_id, spatial_merge_size=2)
    ids0 = np.asarray(session.token_ids[0])[None]
    positions, deltas = jax.jit(get_rope_index, static_argnames=tuple(rope_kw))(ids0, whole[0].image_grid_thw, None,
                                                                                  **rope_kw)
    positions = np.asarray(positions)
    assert session.rope_deltas[0] == int(deltas[0])
    assert session.rope_deltas[1] == 0  # text only: positions are slots

    # the appended segment's 3-D positions (two images) continue the history exactly as on the whole sequence
    prefix = len(first[0].token_ids) + len(reply[0].token_ids)
    segment = np.asarray(second[0].token_ids)[None]
    tail, next_position = jax.jit(steps.append_positions, static_argnames=tuple(rope_kw))(
        segment, second[0].image_grid_thw, np.array([segment.shape[1]]), positions[:, :, :prefix].max(axis=(0, 2)) + 1,
        **rope_kw)
    np.testing.assert_array_equal(np.asarray(tail), positions[:, :, prefix:prefix + segment.shape[1]])
    assert int(next_position[0]) == int(np.asarray(tail).max()) + 1


def test_stop_ids_and_per_row_budgets(tiny):
    sampler = tiny.sampler
    prompts = [Segment(np.arange(20, 31)), Segment(np.arange(40, 47))]
    free = sampler.complete(prompts, SamplingParams(temperature=0.0, max_new_tokens=10))
    stop = int(free[0].token_ids[3])
    cut = int(np.flatnonzero(free[0].token_ids == stop)[0]) + 1
    absent = next(i for i in range(7, 320) if i not in free[1].token_ids)
    out = sampler.complete(prompts, [SamplingParams(temperature=0.0, max_new_tokens=10, stop_token_ids=(stop, 1)),
                                     SamplingParams(temperature=0.0, max_new_tokens=5, stop_token_ids=(absent,))])
    np.testing.assert_array_equal(out[0].token_ids, free[0].token_ids[:cut])
    assert out[0].finish_reason == FINISH_STOP and out[0].token_ids[-1] == stop
    np.testing.assert_array_equal(out[1].token_ids, free[1].token_ids[:5])
    assert out[1].finish_reason == FINISH_LENGTH
    np.testing.assert_allclose(out[1].logprobs, free[1].logprobs[:5], atol=1e-6)


def test_seeded_sampling_is_reproducible_and_top_k_one_is_greedy(tiny):
    sampler = tiny.sampler
    prompts = [Segment(np.arange(50, 58)), Segment(np.arange(60, 75)), Segment(np.arange(80, 84))]
    params = [SamplingParams(temperature=1.0, seed=s, max_new_tokens=12) for s in (1, 2, 1)]
    a = sampler.complete(prompts, params)
    b = sampler.complete(prompts, params)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        np.testing.assert_array_equal(x.logprobs, y.logprobs)
    other = sampler.complete(prompts, [SamplingParams(temperature=1.0, seed=9, max_new_tokens=12)] * 3)
    assert any(not np.array_equal(x.token_ids, y.token_ids) for x, y in zip(a, other))
    greedy = sampler.complete(prompts, SamplingParams(temperature=0.0, max_new_tokens=12))
    top1 = sampler.complete(prompts, SamplingParams(temperature=1.5, top_k=1, seed=3, max_new_tokens=12))
    for x, y in zip(greedy, top1):
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        # log-probs are of logits / T before filtering, so they differ from the greedy (unscaled) ones
        assert np.all(y.logprobs <= 0) and not np.allclose(x.logprobs, y.logprobs)


def test_steady_state_does_not_recompile(tiny, to_segments):
    sampler, config = tiny.sampler, tiny.config
    sampler.warmup(2, prompt_length=5, max_new_tokens=4, image_grid_thw=[(1, 4, 4), (1, 2, 2)])
    warm = sampler.warmup(1, prompt_length=10, max_new_tokens=4)
    # other prompt lengths, image sizes, batch sizes within the buckets, budgets, sampling settings and stop ids
    other_images = tiny_hf.make_batch(config, [[1, (2, 6), 9], [2], [4, (4, 2), 1]], seed=32)
    sampler.complete(to_segments(other_images), SamplingParams(temperature=0.7, top_p=0.9, top_k=5,
                                                               max_new_tokens=9, stop_token_ids=(7, 8, 9)))
    sampler.complete([Segment(np.arange(10, 37)), Segment([11])], SamplingParams(seed=4, max_new_tokens=16))
    assert sampler.compilations == warm
    sampler.complete([Segment(np.arange(10, 50))], SamplingParams(temperature=0.0, max_new_tokens=4))
    assert sampler.compilations == {**warm, "append": warm["append"] + 1}  # 40 tokens: the next length bucket
    assert sampler.num_compilations == sum(sampler.compilations.values())


@pytest.mark.parametrize("fit_up_to, appends", [(16384, 1), (0, 3)], ids=["fitted", "per-image-bucket"])
def test_append_programs_do_not_depend_on_the_images(tiny, to_segments, fit_up_to, appends):
    """The decoder's append sees image features and grids fitted to the call's rows x tokens: appends with other
    image counts and sizes in the same row and length buckets reuse one program (the vision tower compiles per
    image shape), where the features' own buckets needed three; both match transformers' `generate`."""
    buckets = dataclasses.replace(tiny.sampler.buckets, min_images=2, min_patches=4, fit_images_up_to=fit_up_to)
    sampler = Sampler(tiny.model, buckets=buckets)
    batches = [[[2, (2, 2), 3], [6]], [[1, (4, 6), 1, (2, 4), 2], [2, (4, 4), 1]], [[9], [1, (6, 6), 1]]]
    for seed, rows in enumerate(batches):
        batch = tiny_hf.make_batch(tiny.config, rows, padding_side="left", seed=50 + seed)
        ref_tokens, ref_logprobs = _hf_greedy(tiny.hf, batch, GREEDY.max_new_tokens, tiny.vision_ids)
        for row, completion in enumerate(sampler.complete(to_segments(batch), GREEDY)):
            np.testing.assert_array_equal(completion.token_ids, ref_tokens[row], err_msg=f"batch {seed} row {row}")
            assert np.abs(completion.logprobs - ref_logprobs[row]).max() <= 1e-4
    assert sampler.compilations["append"] == appends  # 1 to 3 images of 1 to 9 merged tokens each
    assert sampler.compilations["encode_images"] == 3


def test_vision_ids_are_never_sampled(tiny):
    """With a head that makes vision placeholders the most likely ids, the sampler still picks text ids."""
    sampler = tiny.sampler
    skewed = load(tiny.path)
    weight = np.asarray(skewed.lm_head.weight[...])
    head = np.zeros_like(weight)
    head[:, list(tiny.vision_ids)] = 50.0 * weight[:, list(tiny.vision_ids)]
    skewed.lm_head.weight[...] = head
    prompts = [Segment(np.arange(20, 20 + n)) for n in (5, 9, 13, 3)]
    sampler.update_weights(skewed)
    try:
        session = sampler.new_session(4)
        sampler.append(session, prompts)
        raw_best = np.asarray(session.last_logits)[:4].argmax(-1)
        out = sampler.generate(session, [SamplingParams(temperature=0.0, max_new_tokens=6),
                                         SamplingParams(temperature=1.0, seed=1, max_new_tokens=6)] * 2)
    finally:
        sampler.update_weights(tiny.model)
    assert set(raw_best) <= set(tiny.vision_ids)
    for completion in out:
        assert not set(completion.token_ids.tolist()) & set(tiny.vision_ids)
    assert set(sampler.suppressed_token_ids) == set(tiny.vision_ids)
    assert sampler.compilations["decode"] >= 1


def test_reset_rows_frees_a_row_for_a_new_conversation(tiny):
    sampler = tiny.sampler
    session = sampler.new_session(2)
    sampler.append(session, [Segment(np.arange(30, 45)), Segment(np.arange(60, 66))])
    sampler.generate(session, SamplingParams(temperature=0.0, max_new_tokens=4))
    kept = list(session.token_ids[1])
    session.reset_rows(0)
    assert session.num_tokens(0) == 0 and session.token_ids[1] == kept
    sampler.append(session, [Segment(np.arange(90, 97)), None])
    [again, idle] = sampler.generate(session, [SamplingParams(temperature=0.0, max_new_tokens=8), None])
    [fresh] = sampler.complete([Segment(np.arange(90, 97))], SamplingParams(temperature=0.0, max_new_tokens=8))
    assert idle is None and session.token_ids[1] == kept
    np.testing.assert_array_equal(again.token_ids, fresh.token_ids)
    np.testing.assert_allclose(again.logprobs, fresh.logprobs, atol=1e-5)


def test_forked_rows_continue_the_source_conversation_exactly(tiny, to_segments):
    """`fork_rows`: rows forked from a conversation holding an image continue it as the source does (tokens,
    log-probs, rope deltas), each on its own from there; the other rows are untouched; bad rows are named."""
    sampler, config = tiny.sampler, tiny.config
    [source_prompt, other_prompt] = to_segments(tiny_hf.make_batch(config, [[2, (4, 6), 3], [5]], seed=31))
    session = sampler.new_session(4)
    sampler.append(session, [source_prompt, other_prompt, None, None])
    sampler.generate(session, [SamplingParams(temperature=0.0, max_new_tokens=5), None, None, None])
    other = (list(session.token_ids[1]), int(session.rope_deltas[1]))
    sampler.fork_rows(session, 0, [2, 3])
    assert session.token_ids[2] == session.token_ids[3] == session.token_ids[0]
    assert session.image_grid_thw[2] == session.image_grid_thw[0] == [(1, 4, 6)]
    assert session.rope_deltas[2] == session.rope_deltas[3] == session.rope_deltas[0] != 0
    tail = Segment(np.arange(40, 47))
    sampler.append(session, [tail, None, tail, tail])
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    sampled = SamplingParams(temperature=1.0, seed=3, max_new_tokens=8)
    [a, idle, b, c] = sampler.generate(session, [greedy, None, greedy, sampled])
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert idle is None and (list(session.token_ids[1]), int(session.rope_deltas[1])) == other
    [alone] = sampler.complete([Segment(np.concatenate([np.asarray(session.token_ids[0][:-8 - 7]), tail.token_ids]),
                                        source_prompt.pixel_values, source_prompt.image_grid_thw)], sampled)
    np.testing.assert_array_equal(c.token_ids, alone.token_ids)  # the forked row samples as a fresh one would
    np.testing.assert_allclose(c.logprobs, alone.logprobs, atol=1e-4)
    assert sampler.compilations["fork_rows"] == 1
    with pytest.raises(ValueError, match="row 4 is outside the session's rows"):
        sampler.fork_rows(session, 0, [4])
    with pytest.raises(ValueError, match="row 1 cannot be forked into itself"):
        sampler.fork_rows(session, 1, [1, 2])


def test_decision_sampling_draws_at_most_max_draws_uncertain_tokens(tiny):
    """`draw_below` / `max_draws`: a row draws only where its most likely token is below the threshold and at most
    `max_draws` times, then continues greedily; `Completion.drawn` says which tokens were drawn."""
    sampler = tiny.sampler
    prompts = [Segment(np.arange(50, 58)), Segment(np.arange(60, 75)), Segment(np.arange(80, 84))]
    free = sampler.complete(prompts, [SamplingParams(temperature=1.0, seed=s, max_new_tokens=12) for s in (1, 2, 3)])
    greedy = sampler.complete(prompts, GREEDY)
    assert all(c.drawn.all() for c in free) and not any(c.drawn.any() for c in greedy)
    # a threshold below every position's top probability draws nothing: the greedy tokens
    never = sampler.complete(prompts, SamplingParams(temperature=1.0, seed=1, max_new_tokens=12, draw_below=1e-9))
    for got, want in zip(never, greedy):
        np.testing.assert_array_equal(got.token_ids, want.token_ids)
        assert not got.drawn.any()
    # one draw: the first token is drawn (seeded), the rest is the greedy continuation of prompt + that token
    for seed in (1, 2, 3, 4):
        once = sampler.complete(prompts, SamplingParams(temperature=1.0, seed=seed, max_new_tokens=12, max_draws=1))
        for prompt, got in zip(prompts, once):
            assert got.drawn.tolist() == [True] + [False] * (len(got.token_ids) - 1)
            [rest] = sampler.complete([Segment([*prompt.token_ids, int(got.token_ids[0])])],
                                      SamplingParams(temperature=0.0, max_new_tokens=11))
            np.testing.assert_array_equal(got.token_ids[1:], rest.token_ids)
    assert any(o.token_ids[0] != g.token_ids[0] for o, g in zip(
        sampler.complete(prompts, SamplingParams(temperature=1.0, seed=9, max_new_tokens=12, max_draws=1)), greedy))
    # a threshold and a budget: only uncertain positions are drawn (their top probability, reported as the
    # log-prob of the argmax at T = 1, is below it elsewhere never), at most max_draws of them
    capped = sampler.complete(prompts, SamplingParams(temperature=1.0, seed=5, max_new_tokens=12, draw_below=0.5,
                                                      max_draws=3))
    for c in capped:
        assert 0 < c.drawn.sum() <= 3
        first_unspent = len(c.drawn) if c.drawn.sum() < 3 else int(np.flatnonzero(c.drawn)[-1])
        argmax_taken = ~c.drawn[:first_unspent]
        assert np.all(np.exp(c.logprobs[:first_unspent][argmax_taken]) >= 0.5 - 1e-6)
    for bad, match in [({"draw_below": 0.0}, "draw_below must be in"), ({"draw_below": 1.5}, "draw_below must be in"),
                       ({"max_draws": -1}, "max_draws must be an int >= 0"), ({"max_draws": 1.0}, "max_draws must")]:
        with pytest.raises(ValueError, match=match):
            SamplingParams(**bad)


def test_calls_on_a_few_rows_run_on_those_rows_alone_with_the_same_results(tiny, to_segments):
    """An append or generate whose rows fit a smaller bucket (`Buckets.active_rows`) gathers those rows, runs on
    them and writes them back: tokens, log-probs, draws, rope deltas and every row's cache and logits equal the
    whole-batch calls' (the other rows untouched), over appends with images, forks and sampled turns."""
    whole = Sampler(tiny.model, buckets=dataclasses.replace(tiny.sampler.buckets, min_batch=8, min_active_rows=8,
                                                            min_append_rows=8, group_appends=False))
    some = Sampler(tiny.model, buckets=dataclasses.replace(tiny.sampler.buckets, min_batch=8, min_active_rows=2,
                                                           min_append_rows=2, group_appends=False))
    config = tiny.config
    prompts = to_segments(tiny_hf.make_batch(config, [[3, (4, 6), 2], [6], [2, (2, 4), 4], [9], [5]], seed=41))
    tool = to_segments(tiny_hf.make_batch(config, [[1, (4, 4), 2], [4]], seed=42))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    sampled = SamplingParams(temperature=1.0, seed=7, max_new_tokens=6, draw_below=0.9, max_draws=2)

    def play(sampler):
        session = sampler.new_session(6)  # a batch of 8 rows
        outs = []
        sampler.append(session, [*prompts, None])  # 5 of 6 rows: the whole batch
        outs.append(sampler.generate(session, [greedy, None, sampled, None, None, None]))  # 2 rows
        sampler.append(session, [tool[0], None, None, tool[1], None, None])  # 2 rows, one image
        sampler.fork_rows(session, 0, [5])
        outs.append(sampler.generate(session, [sampled, None, None, greedy, None, sampled]))  # 3 rows
        outs.append(sampler.generate(session, [None, greedy, None, None, greedy, None]))  # rows never touched since
        return session, outs

    (a, a_outs), (b, b_outs) = play(whole), play(some)
    # whole: one program each; some: also the 2-row append and the 2- and 4-row decodes
    assert (whole.compilations["append"], whole.compilations["decode"]) == (1, 1)
    assert (some.compilations["append"], some.compilations["decode"]) == (2, 2)
    for turn, (x_turn, y_turn) in enumerate(zip(a_outs, b_outs)):
        for row, (x, y) in enumerate(zip(x_turn, y_turn)):
            assert (x is None) == (y is None), (turn, row)
            if x is not None:
                np.testing.assert_array_equal(x.token_ids, y.token_ids, err_msg=f"turn {turn} row {row}")
                np.testing.assert_array_equal(x.drawn, y.drawn)
                np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
    assert a.token_ids == b.token_ids and a.image_grid_thw == b.image_grid_thw
    np.testing.assert_array_equal(a.rope_deltas, b.rope_deltas)
    np.testing.assert_array_equal(np.asarray(a.lengths), np.asarray(b.lengths))
    np.testing.assert_allclose(np.asarray(a.last_logits)[:6], np.asarray(b.last_logits)[:6], atol=1e-5)
    for x, y in zip(a.caches, b.caches):
        for row in range(6):
            n = len(a.token_ids[row])
            np.testing.assert_allclose(np.asarray(x.key)[row, :, :n], np.asarray(y.key)[row, :, :n], atol=1e-5)
            np.testing.assert_allclose(np.asarray(x.value)[row, :, :n], np.asarray(y.value)[row, :, :n], atol=1e-5)


def test_an_append_split_by_length_equals_one_call(tiny, to_segments):
    """`Buckets.append_groups` splits an append of very different lengths into calls: the caches, logits, tokens
    and positions equal one whole-batch call's, images included, and so does what is generated next."""
    one = Sampler(tiny.model, buckets=dataclasses.replace(tiny.sampler.buckets, min_batch=8, group_appends=False))
    split = Sampler(tiny.model, buckets=dataclasses.replace(tiny.sampler.buckets, min_batch=8))
    segments = to_segments(tiny_hf.make_batch(tiny.config, [[2], [3, (4, 6), 2], [300], [1], [40, (2, 4), 3]],
                                              seed=43))
    assert len(split.buckets.append_groups([len(s.token_ids) for s in segments], batch=8, slots=512)) > 1
    sampled = SamplingParams(temperature=1.0, seed=5, max_new_tokens=5, draw_below=0.9, max_draws=2)

    def play(sampler):
        session = sampler.new_session(6, capacity=512)
        sampler.append(session, [*segments, None])
        return session, sampler.generate(session, [sampled] * 5 + [None])

    (a, a_out), (b, b_out) = play(one), play(split)
    assert split.compilations["append"] > one.compilations["append"] == 1
    for x, y in zip(a_out[:5], b_out[:5]):
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        np.testing.assert_array_equal(x.drawn, y.drawn)
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
    assert a.token_ids == b.token_ids and a.image_grid_thw == b.image_grid_thw
    np.testing.assert_array_equal(np.asarray(a.lengths), np.asarray(b.lengths))
    np.testing.assert_array_equal(np.asarray(a.next_positions), np.asarray(b.next_positions))
    for x, y in zip(a.caches, b.caches):
        for row in range(5):
            n = len(a.token_ids[row])
            np.testing.assert_allclose(np.asarray(x.key)[row, :, :n], np.asarray(y.key)[row, :, :n], atol=1e-5)
            np.testing.assert_allclose(np.asarray(x.value)[row, :, :n], np.asarray(y.value)[row, :, :n], atol=1e-5)
