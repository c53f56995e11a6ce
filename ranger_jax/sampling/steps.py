"""The traced bodies of the sampler's compiled calls: append a segment to each row, and the decode while-loop.

Both are pure functions of a merged `Qwen3VL` and arrays with static (bucketed) shapes. Row b holds its tokens in
cache slots `0 .. lengths[b] - 1`; a call writes new tokens at the next slots, so slots past S (padding) are
dropped by the scatter and slots past a row's length are masked by `kv_valid` until real tokens overwrite them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ranger_jax.models.qwen3_vl import attention, rope
from ranger_jax.models.qwen3_vl import model as model_lib
from ranger_jax.models.qwen3_vl import text
from ranger_jax.parallel import rules
from ranger_jax.parallel.rules import constrain
from ranger_jax.sampling import cache as cache_lib
from ranger_jax.sampling import logits as logits_lib

Caches = tuple[text.KVCache, ...]


def pin_caches(caches: Caches) -> Caches:
    """Constrains every cache to its SAMPLE-rules sharding (a no-op without a mesh)."""
    with rules.use_rules(rules.SAMPLE):
        return tuple(text.KVCache(*(constrain(x, *cache_lib.CACHE_AXES) for x in c)) for c in caches)


def take_rows(state: tuple, index: jax.Array) -> tuple:
    """Rows `index` ([R] int32) of a session's device state `(caches, lengths, next_positions, last_logits)`."""
    caches, lengths, next_positions, last_logits = state
    caches = tuple(text.KVCache(key=c.key[index], value=c.value[index]) for c in caches)
    return pin_caches(caches), lengths[index], next_positions[index], last_logits[index]


def put_rows(state: tuple, index: jax.Array, rows: tuple) -> tuple:
    """`state` with rows `index` replaced by `rows` (as `take_rows` returns them; the indices distinct)."""
    caches, lengths, next_positions, last_logits = state
    row_caches, row_lengths, row_next, row_logits = rows
    caches = tuple(text.KVCache(key=c.key.at[index].set(r.key), value=c.value.at[index].set(r.value))
                   for c, r in zip(caches, row_caches))
    return (pin_caches(caches), lengths.at[index].set(row_lengths), next_positions.at[index].set(row_next),
            last_logits.at[index].set(row_logits))


def fit_image_features(image_embeds: jax.Array, deepstack: jax.Array | None, *,
                       rows: int) -> tuple[jax.Array, jax.Array | None]:
    """Image features with exactly `rows` rows: zero rows appended, or padding rows cut.

    A call's placeholders take the features in order (`merge_image_features` gathers row k for the k-th
    placeholder), and a call of B rows by T tokens holds at most B·T placeholders, so with `rows = B·T` every
    real feature stays where it is and the append program's shape no longer depends on the images' sizes.

    Args:
        image_embeds: [M, D] features, real rows first.
        deepstack: [L_ds, M, D] or None.
        rows: the row count wanted, at least the real feature rows.
    """
    count = image_embeds.shape[0]
    if count >= rows:
        return image_embeds[:rows], None if deepstack is None else deepstack[:, :rows]
    pad = rows - count
    image_embeds = jnp.pad(image_embeds, ((0, pad), (0, 0)))
    return image_embeds, None if deepstack is None else jnp.pad(deepstack, ((0, 0), (0, pad), (0, 0)))


def append_positions(input_ids: jax.Array, grid_thw: jax.Array | None, num_new: jax.Array,
                     next_positions: jax.Array, *, image_token_id: int,
                     spatial_merge_size: int) -> tuple[jax.Array, jax.Array]:
    """MRoPE positions of segments appended after each row's history.

    `get_rope_index` restarts at 0 after whatever precedes a segment, and the whole sequence would start the
    segment at one past the largest earlier position; so the segment's positions are its own `get_rope_index`
    plus `next_positions`, which equals `get_rope_index` of the concatenation (images included).

    Args:
        input_ids: [B, T] int, the first num_new[b] tokens of row b real, the rest padding.
        grid_thw: [num_images, 3] grids of the segments' images in batch order (extra entries unused), or None.
        num_new: [B] int32 real tokens per row.
        next_positions: [B] int32, one past each row's largest position so far (0 for an empty row).
        image_token_id: the placeholder id.
        spatial_merge_size: patches per merged token along each side.

    Returns:
        positions: [3, B, T] int32 (pads arbitrary).
        next_positions: [B] int32 after the segment (unchanged for rows with num_new 0).
    """
    real = jnp.arange(input_ids.shape[1])[None, :] < num_new[:, None]  # [B, T]
    positions, _ = rope.get_rope_index(input_ids, grid_thw, real, image_token_id=image_token_id,
                                       spatial_merge_size=spatial_merge_size)
    positions = positions + next_positions[None, :, None]
    highest = jnp.max(jnp.where(real[None], positions, -1), axis=(0, 2))
    return positions, jnp.where(num_new > 0, highest + 1, next_positions)


def append(model: model_lib.Qwen3VL, caches: Caches, lengths: jax.Array, next_positions: jax.Array,
           last_logits: jax.Array, input_ids: jax.Array, num_new: jax.Array, image_embeds: jax.Array | None,
           deepstack: jax.Array | None, grid_thw: jax.Array | None):
    """Runs the decoder on one segment per row, writing its keys/values after the row's tokens.

    Args:
        model: the policy.
        caches: per layer [B, K, S, H].
        lengths: [B] int32 slots used.
        next_positions: [B] int32.
        last_logits: [B, V] float32, kept for rows without new tokens.
        input_ids: [B, T] int32 segments, right-padded.
        num_new: [B] int32 real tokens per row (0 = row untouched).
        image_embeds: [M, D] features of the segments' images (padded rows last), or None.
        deepstack: [L_ds, M, D] or None.
        grid_thw: [num_images, 3] padded grids, or None.

    Returns:
        (caches, lengths, next_positions, last_logits) after the segments.
    """
    length = input_ids.shape[1]
    config = model.config
    positions, new_next = append_positions(input_ids, grid_thw, num_new, next_positions,
                                           image_token_id=config.image_token_id,
                                           spatial_merge_size=config.vision_config.spatial_merge_size)
    embeds, deepstack_embeds = model.embed(input_ids, image_embeds, deepstack)
    query_slots = lengths[:, None] + jnp.arange(length, dtype=jnp.int32)[None, :]
    new_lengths = lengths + num_new
    kv_valid = jnp.arange(caches[0].key.shape[2])[None, :] < new_lengths[:, None]
    hidden, caches = model.decode(embeds, positions, attention.MaskInfo(query_slots, kv_valid), deepstack_embeds,
                                  caches)
    last = jnp.take_along_axis(hidden, jnp.maximum(num_new - 1, 0)[:, None, None], axis=1)  # [B, 1, D]
    logits = model.compute_logits(last)[:, 0]
    last_logits = jnp.where((num_new > 0)[:, None], logits, last_logits)
    return pin_caches(caches), new_lengths, new_next, last_logits


def decode(model: model_lib.Qwen3VL, caches: Caches, lengths: jax.Array, next_positions: jax.Array,
           last_logits: jax.Array, active: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
           seeds: jax.Array, draw_below: jax.Array, max_draws: jax.Array, max_new_tokens: jax.Array,
           stop_ids: jax.Array, suppressed: jax.Array, *, num_steps: int):
    """Samples up to `num_steps` tokens per active row in one `lax.while_loop` with early exit.

    Each iteration picks a token from the current logits (`logits.choose_tokens`, keyed by the row's seed and
    length; a sampled row draws only while it has draws left and its most likely token is below `draw_below`, else
    takes the argmax), records it with its log-probability and whether it was drawn, writes it into the cache at
    slot `lengths[b]` with position `next_positions[b]` on all three MRoPE rows, and runs the decoder for the next
    logits. A row finishes when it
    samples one of its stop ids or reaches its max_new_tokens; the loop ends when every row has finished.

    Args:
        model, caches, lengths, next_positions, last_logits: as for `append`.
        active: [B] bool rows that generate.
        temperature, top_k, top_p, seeds: [B] per-row sampling settings (see `logits.choose_tokens`).
        draw_below: [B] float32, draw only where the most likely token's probability is below it (>= 1: always).
        max_draws: [B] int32, draw at most this many tokens (0: no limit); the argmax afterwards.
        max_new_tokens: [B] int32, each <= num_steps.
        stop_ids: [B, n] int32 stop ids per row, -1 padded.
        suppressed: [V] bool ids never sampled.
        num_steps: static length of the output buffers.

    Returns:
        (caches, lengths, next_positions, last_logits, tokens [B, num_steps] int32, logprobs [B, num_steps]
        float32, drawn [B, num_steps] bool tokens drawn from the distribution (False: the argmax, also for greedy
        rows), counts [B] int32 tokens generated, stopped [B] bool finished by a stop id).
    """
    batch = lengths.shape[0]
    slots = caches[0].key.shape[2]

    def step(carry):
        i, tokens, logprobs, drawn, draws_left, done, stopped, caches, lengths, next_positions, logits = carry
        draw = (temperature > 0) & (draws_left > 0) & logits_lib.uncertain(logits, suppressed, draw_below)
        token, logprob = logits_lib.choose_tokens(logits, suppressed=suppressed, temperature=temperature,
                                                  top_k=top_k, top_p=top_p, seeds=seeds, counters=lengths, draw=draw)
        live = ~done
        tokens = tokens.at[:, i].set(jnp.where(live, token, 0))
        logprobs = logprobs.at[:, i].set(jnp.where(live, logprob, 0.0))
        drawn = drawn.at[:, i].set(live & draw)
        draws_left = draws_left - (live & draw).astype(jnp.int32)
        embeds, _ = model.embed(token[:, None])
        positions = jnp.broadcast_to(next_positions[None, :, None], (3, batch, 1))
        new_lengths = lengths + live.astype(jnp.int32)  # a finished row writes past its end, masked out
        mask_info = attention.MaskInfo(lengths[:, None], jnp.arange(slots)[None, :] < new_lengths[:, None])
        hidden, caches = model.decode(embeds, positions, mask_info, None, caches)
        logits = jnp.where(live[:, None], model.compute_logits(hidden)[:, 0], logits)
        hit_stop = live & jnp.any(token[:, None] == stop_ids, axis=-1)
        done = done | hit_stop | (live & (i + 1 >= max_new_tokens))
        return (i + 1, tokens, logprobs, drawn, draws_left, done, stopped | hit_stop, pin_caches(caches),
                new_lengths, next_positions + live.astype(jnp.int32), logits)

    def keep_going(carry):
        return (carry[0] < num_steps) & ~jnp.all(carry[5])

    draws_left = jnp.where(max_draws > 0, max_draws, num_steps + 1).astype(jnp.int32)
    carry = (jnp.int32(0), jnp.zeros((batch, num_steps), jnp.int32), jnp.zeros((batch, num_steps), jnp.float32),
             jnp.zeros((batch, num_steps), bool), draws_left, ~active, jnp.zeros(batch, bool), caches, lengths,
             next_positions, last_logits)
    (_, tokens, logprobs, drawn, _, _, stopped, caches, new_lengths, next_positions,
     last_logits) = jax.lax.while_loop(keep_going, step, carry)
    return (caches, new_lengths, next_positions, last_logits, tokens, logprobs, drawn, new_lengths - lengths,
            stopped)
