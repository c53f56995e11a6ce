"""Batched KV-cache sampling for Qwen3-VL: append segments (prefill), then decode in one jitted while-loop.

    sampler = Sampler(model)                                # model from qwen3_vl.load(..., sharding_rules="sample")
    [done] = sampler.complete([Segment(prompt_ids)], SamplingParams(temperature=0.0, max_new_tokens=32))

    session = sampler.new_session(4)                        # multi-turn: rows are conversations
    sampler.append(session, [Segment(ids, pixel_values, grid_thw), None, ...])
    completions = sampler.generate(session, [SamplingParams(seed=1), None, ...])
    sampler.append(session, [Segment(tool_response_ids, new_pixels, new_grids), None, ...])  # appends, no re-run

Three compiled functions, each keyed only on bucketed shapes (`buckets.Buckets`): the vision tower on the new
images of a call, `append` (new tokens with their image features and DeepStack rows into the cache, MRoPE
positions continuing each row's history), and `decode` (a `lax.while_loop` that samples from the last logits,
writes the token into the cache and runs the decoder, until every row stopped or reached its budget). Sampled
tokens are always fed back, so a session holds every token it returned and the next turn starts from its logits.
`num_compilations` counts the traces of the three.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ranger_jax.models.qwen3_vl import model as model_lib
from ranger_jax.sampling import buckets as buckets_lib
from ranger_jax.sampling import cache as cache_lib
from ranger_jax.sampling import steps

log = logging.getLogger(__name__)

FINISH_STOP = "stop"  # sampled one of its stop ids (kept as the last token)
FINISH_LENGTH = "length"  # reached max_new_tokens


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one row samples in one `generate` call."""

    temperature: float = 1.0  # 0 = greedy; logits are divided by it before top-k/top-p
    top_p: float = 1.0  # nucleus mass in (0, 1]; 1 = off
    top_k: int = 0  # keep the k most likely ids; 0 = off
    max_new_tokens: int = 128  # budget of new tokens in this call
    stop_token_ids: tuple[int, ...] = ()  # ids that end the row (kept as its last token), e.g. <|im_end|>
    seed: int = 0  # per-row PRNG seed; same seed and history give the same tokens
    draw_below: float = 1.0  # draw only where the most likely token's probability is below it (1 = everywhere)
    max_draws: int = 0  # draw at most this many tokens in this call, the argmax afterwards (0 = no limit)

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise ValueError(f"SamplingParams.seed must be an int in [0, 2**32), got {self.seed!r}")
        if isinstance(self.draw_below, bool) or not isinstance(self.draw_below, (int, float)) \
                or not 0 < self.draw_below <= 1:
            raise ValueError(f"SamplingParams.draw_below must be in (0, 1] (1 = draw everywhere), got "
                             f"{self.draw_below!r}")
        if isinstance(self.max_draws, bool) or not isinstance(self.max_draws, int) or self.max_draws < 0:
            raise ValueError(f"SamplingParams.max_draws must be an int >= 0 (0 = no limit), got {self.max_draws!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in self.stop_token_ids))


@dataclasses.dataclass(frozen=True)
class Segment:
    """Tokens appended to one row, with the images whose placeholders they hold (transformers' conventions)."""

    token_ids: Sequence[int]  # [T] ids, each image expanded to vision_start + M image pads + vision_end
    pixel_values: np.ndarray | None = None  # [P, I] patch rows of this segment's images, in order
    image_grid_thw: np.ndarray | None = None  # [num_images, 3] (t, h, w) in patches


@dataclasses.dataclass(frozen=True)
class Completion:
    """What one row generated in one `generate` call."""

    token_ids: np.ndarray  # [n] int32, including the stop id when finish_reason == "stop"
    logprobs: np.ndarray  # [n] float32, see `logits` (log_softmax(logits / T), full vocabulary, before filtering)
    finish_reason: str  # FINISH_STOP or FINISH_LENGTH
    drawn: np.ndarray | None = None  # [n] bool, tokens drawn from the distribution (False: the argmax was taken)


def _per_row(value, num_rows: int, what: str) -> list:
    if value is None or isinstance(value, (SamplingParams, Segment)):
        return [value] * num_rows
    items = list(value)
    if len(items) != num_rows:
        raise ValueError(f"got {len(items)} {what} for a session of {num_rows} rows; pass one per row (None to skip)")
    return items


class Sampler:
    """Generates from a `Qwen3VL` with a sharded, bucketed KV cache (see the module docstring)."""

    def __init__(self, model: model_lib.Qwen3VL, *, mesh: jax.sharding.Mesh | None = None,
                 buckets: buckets_lib.Buckets | None = None, suppress_token_ids: Sequence[int] = ()):
        """Wraps `model` for sampling.

        Args:
            model: the policy; its parameters stay where they are (load it with sharding_rules="sample" and `mesh`).
            mesh: the ("data", "fsdp", "tensor") mesh of the parameters, or None on one device.
            buckets: smallest sizes of the padded shapes.
            suppress_token_ids: ids never sampled besides the vision ids of the config (image/video pads,
                vision start/end), e.g. the tokenizer's `<|vision_pad|>`.

        Raises:
            ValueError: a suppressed id outside the vocabulary.
        """
        self.config = model.config
        self.mesh = mesh
        self.buckets = buckets or buckets_lib.Buckets()
        vocab = self.config.text_config.vocab_size
        c = model.config
        ids = {c.image_token_id, c.video_token_id, c.vision_start_token_id, c.vision_end_token_id,
               *(int(i) for i in suppress_token_ids)}
        outside = sorted(i for i in ids if not 0 <= i < vocab)
        if outside:
            raise ValueError(f"suppress_token_ids {outside} are outside the vocabulary [0, {vocab})")
        self.suppressed_token_ids = tuple(sorted(ids))
        suppressed = np.zeros(vocab, bool)
        suppressed[list(ids)] = True
        self._suppressed = jnp.asarray(suppressed)
        self.graphdef, self.state = nnx.split(model)
        self._traces: collections.Counter[str] = collections.Counter()
        self._encode = jax.jit(self._encode_images)
        self._fit = jax.jit(steps.fit_image_features, static_argnames=("rows",))  # a pad or slice: not counted
        self._append = jax.jit(self._append_tokens, donate_argnums=(1,))
        self._append_some = jax.jit(self._append_rows, donate_argnums=(1,))
        self._decode = jax.jit(self._decode_tokens, static_argnames=("num_steps",), donate_argnums=(1,))
        self._decode_some = jax.jit(self._decode_rows, static_argnames=("num_steps",), donate_argnums=(1,))
        self._gather = jax.jit(self._gather_rows, donate_argnums=(0,))

    # ----- bookkeeping ---------------------------------------------------------------------------------------------

    @property
    def num_compilations(self) -> int:
        """How many programs this sampler compiled (traces of its vision, append and decode functions)."""
        return sum(self._traces.values())

    @property
    def compilations(self) -> dict[str, int]:
        """Compilations per function: {"encode_images": n, "append": n, "decode": n, "fork_rows": n}."""
        return {name: self._traces[name] for name in ("encode_images", "append", "decode", "fork_rows")}

    def update_weights(self, model: model_lib.Qwen3VL) -> None:
        """Swaps in new parameters of the same architecture (no recompilation); sessions stay valid only as caches
        of the old weights.

        Raises:
            ValueError: `model` has a different structure or config.
        """
        graphdef, state = nnx.split(model)
        if graphdef != self.graphdef or model.config != self.config:
            raise ValueError("update_weights needs a model with the sampler's config and structure; build a new "
                             "Sampler for another architecture")
        self.state = state

    def _mesh_context(self):
        return jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

    # ----- compiled functions ---------------------------------------------------------------------------------------

    def _model(self, state) -> model_lib.Qwen3VL:
        return nnx.merge(self.graphdef, state)

    def _count(self, name: str, *shapes) -> None:
        self._traces[name] += 1
        log.info("sampler: compiling %s #%d for shapes %s", name, self._traces[name], shapes)

    def _encode_images(self, state, pixel_values, grid_thw):
        self._count("encode_images", pixel_values.shape, grid_thw.shape)
        return self._model(state).encode_images(pixel_values, grid_thw)

    def _append_tokens(self, state, caches, lengths, next_positions, last_logits, input_ids, num_new, image_embeds,
                       deepstack, grid_thw):
        self._count("append", input_ids.shape, caches[0].key.shape[2],
                    None if image_embeds is None else image_embeds.shape[0])
        return steps.append(self._model(state), caches, lengths, next_positions, last_logits, input_ids, num_new,
                            image_embeds, deepstack, grid_thw)

    def _append_rows(self, state, caches, lengths, next_positions, last_logits, index, input_ids, num_new,
                     image_embeds, deepstack, grid_thw):
        """`_append_tokens` on rows `index` alone (gathered, appended, written back): a call that appends to a few
        rows of a large session costs those rows, not the whole batch."""
        self._count("append", input_ids.shape, caches[0].key.shape[2],
                    None if image_embeds is None else image_embeds.shape[0])
        full = (caches, lengths, next_positions, last_logits)
        rows = steps.append(self._model(state), *steps.take_rows(full, index), input_ids, num_new, image_embeds,
                            deepstack, grid_thw)
        return steps.put_rows(full, index, rows)

    def _decode_tokens(self, state, caches, *rows, num_steps):
        self._count("decode", (caches[0].key.shape[0], caches[0].key.shape[2]), num_steps)
        return steps.decode(self._model(state), caches, *rows, num_steps=num_steps)

    def _decode_rows(self, state, caches, lengths, next_positions, last_logits, index, *settings, num_steps):
        """`_decode_tokens` on rows `index` alone (gathered, decoded, written back); `settings` are per call row."""
        self._count("decode", (index.shape[0], caches[0].key.shape[2]), num_steps)
        full = (caches, lengths, next_positions, last_logits)
        out = steps.decode(self._model(state), *steps.take_rows(full, index), *settings, num_steps=num_steps)
        return (*steps.put_rows(full, index, out[:4]), *out[4:])

    def _gather_rows(self, rows_state, source):
        self._count("fork_rows", rows_state[1].shape, rows_state[0][0].key.shape[2])
        return steps.take_rows(rows_state, source)

    # ----- sessions -------------------------------------------------------------------------------------------------

    def new_session(self, num_rows: int, *, capacity: int | None = None) -> cache_lib.Session:
        """An empty session of `num_rows` conversations (the batch is padded to its bucket).

        Args:
            num_rows: conversations held at once.
            capacity: initial cache slots per row (rounded up to a bucket); the cache doubles when needed.
        """
        if not isinstance(num_rows, int) or num_rows < 1:
            raise ValueError(f"num_rows must be an int >= 1, got {num_rows!r}")
        return cache_lib.new_session(self.config, num_rows, batch_size=self.buckets.batch(num_rows),
                                     capacity=self.buckets.cache(capacity or 1), mesh=self.mesh)

    def _call_rows(self, session: cache_lib.Session, rows: Sequence[int], sub_batch: int) -> np.ndarray | None:
        """The rows an append or generate call on `rows` works on: None for the whole batch, or (when `rows` fit a
        smaller `sub_batch`: `Buckets.append_rows`, `Buckets.active_rows`) those rows and enough others to fill
        it, in row order."""
        if sub_batch >= session.batch_size:
            return None
        chosen = set(rows)
        others = [row for row in range(session.batch_size) if row not in chosen][:sub_batch - len(rows)]
        return np.asarray(sorted([*rows, *others]), np.int32)

    def _check_segment(self, row: int, segment: Segment) -> np.ndarray:
        ids = np.asarray(segment.token_ids, np.int64).reshape(1, -1) if len(segment.token_ids) else None
        if ids is None:
            if segment.pixel_values is not None:
                raise ValueError(f"row {row}: a segment without tokens cannot carry pixel_values")
            return np.zeros(0, np.int32)
        try:
            model_lib.check_inputs(self.config, ids, None, segment.pixel_values, segment.image_grid_thw)
        except ValueError as err:
            raise ValueError(f"row {row}: {err}") from err
        return ids[0].astype(np.int32)

    def append(self, session: cache_lib.Session, segments: Sequence[Segment | None]) -> None:
        """Appends one segment per row (None or no tokens: row unchanged) to the session's cache.

        New images go through the vision tower alone; their placeholders get MRoPE positions continuing each row's
        history, equal to `get_rope_index` on the row's whole token sequence. Rows of very different lengths are
        appended by separate calls (`Buckets.append_groups`): a call pads every row to its longest.

        Raises:
            ValueError: a wrong number of segments, or a segment failing `model.check_inputs` (named by row).
        """
        segments = _per_row(segments, session.num_rows, "segments")
        checked = [np.zeros(0, np.int32) if s is None else self._check_segment(row, s)
                   for row, s in enumerate(segments)]
        rows = [row for row, ids in enumerate(checked) if len(ids)]
        if not rows:
            return
        cache_lib.grow(session, self.buckets.cache(max(session.num_tokens(r) + len(checked[r])
                                                       for r in range(session.num_rows))))
        groups = self.buckets.append_groups([len(checked[row]) for row in rows], batch=session.batch_size,
                                            slots=session.caches[0].key.shape[2])
        for group in groups:
            self._append_call(session, checked, segments, sorted(rows[i] for i in group))

    def _append_call(self, session: cache_lib.Session, checked: list[np.ndarray],
                     segments: Sequence[Segment | None], rows: list[int]) -> None:
        """One compiled append of the segments of `rows` (ascending; the cache already large enough)."""
        length = self.buckets.length(max(len(checked[row]) for row in rows))
        # in row order, as the images are consumed
        index = self._call_rows(session, rows, self.buckets.append_rows(len(rows)))
        call_rows = range(session.batch_size) if index is None else index
        chosen = set(rows)
        pad_id = 0 if self.config.image_token_id != 0 else 1  # any text id: pads are masked out
        input_ids = np.full((len(call_rows), length), pad_id, np.int32)
        num_new = np.zeros(len(call_rows), np.int32)
        for slot, row in enumerate(call_rows):
            if row in chosen:
                ids = checked[row]
                input_ids[slot, :len(ids)] = ids
                num_new[slot] = len(ids)
        with_images = [(row, segments[row]) for row in rows if segments[row].pixel_values is not None]
        with self._mesh_context():
            image_embeds = deepstack = grid = None
            if with_images:
                pixel_values = np.concatenate([np.asarray(s.pixel_values, np.float32) for _, s in with_images])
                grids = np.concatenate([np.asarray(s.image_grid_thw, np.int32).reshape(-1, 3) for _, s in with_images])
                merge = self.config.vision_config.spatial_merge_size
                pixel_values, grid = buckets_lib.pad_images(
                    pixel_values, grids, num_patches=self.buckets.patches(len(pixel_values), merge),
                    num_images=self.buckets.images(len(grids) + 1), merge=merge)
                image_embeds, deepstack = self._encode(self.state, pixel_values, grid)
                if self.buckets.fits_images(len(call_rows), length):
                    # the append program then depends on the call's rows x tokens, not on its images (exact: a
                    # call holds at most that many placeholders, and they read the features and grids in order)
                    placeholders = len(call_rows) * length
                    image_embeds, deepstack = self._fit(image_embeds, deepstack, rows=placeholders)
                    grid = buckets_lib.fit_grids(grid, placeholders, merge=merge)
            state = (session.caches, session.lengths, session.next_positions, session.last_logits)
            if index is None:
                caches, lengths, next_positions, last_logits = self._append(
                    self.state, *state, input_ids, num_new, image_embeds, deepstack, grid)
            else:
                caches, lengths, next_positions, last_logits = self._append_some(
                    self.state, *state, index, input_ids, num_new, image_embeds, deepstack, grid)
        session.caches, session.lengths = caches, lengths
        session.next_positions, session.last_logits = next_positions, last_logits
        for row in rows:
            session.token_ids[row].extend(int(i) for i in checked[row])
        for row, segment in with_images:
            session.image_grid_thw[row].extend(tuple(int(x) for x in g)
                                               for g in np.asarray(segment.image_grid_thw).reshape(-1, 3))

    def fork_rows(self, session: cache_lib.Session, source: int, targets: Sequence[int]) -> None:
        """Copies row `source` (its cache, positions, last logits, tokens and images) into each of `targets`, so
        they continue the same conversation: forking a conversation costs one gather, not a re-run of its tokens.

        Raises:
            ValueError: a row outside the session, or `source` among `targets`.
        """
        targets = [int(t) for t in targets]
        for row in (source, *targets):
            if not 0 <= row < session.num_rows:
                raise ValueError(f"row {row} is outside the session's rows [0, {session.num_rows})")
        if source in targets:
            raise ValueError(f"row {source} cannot be forked into itself")
        if not targets:
            return
        gather = np.arange(session.batch_size, dtype=np.int32)
        gather[targets] = source
        with self._mesh_context():
            state = self._gather((session.caches, session.lengths, session.next_positions, session.last_logits),
                                 gather)
        session.caches, session.lengths, session.next_positions, session.last_logits = state
        session.lengths = cache_lib.place(session.lengths, session.mesh, cache_lib.ROW_AXES)
        session.next_positions = cache_lib.place(session.next_positions, session.mesh, cache_lib.ROW_AXES)
        session.last_logits = cache_lib.place(session.last_logits, session.mesh, cache_lib.LOGITS_AXES)
        for row in targets:
            session.token_ids[row] = list(session.token_ids[source])
            session.image_grid_thw[row] = list(session.image_grid_thw[source])

    def generate(self, session: cache_lib.Session,
                 params: SamplingParams | Sequence[SamplingParams | None]) -> list[Completion | None]:
        """Samples new tokens for the rows given params (None: row idle), appending them to the session.

        Returns:
            One `Completion` per row (None for idle rows).

        Raises:
            ValueError: a wrong number of params, a stop id outside the vocabulary, or an active row without tokens.
        """
        params = _per_row(params, session.num_rows, "sampling params")
        active_rows = [row for row, p in enumerate(params) if p is not None]
        vocab = self.config.text_config.vocab_size
        for row in active_rows:
            if session.num_tokens(row) == 0:
                raise ValueError(f"row {row} holds no tokens; append a prompt before generating")
            outside = [i for i in params[row].stop_token_ids if not 0 <= i < vocab]
            if outside:
                raise ValueError(f"row {row}: stop_token_ids {outside} are outside the vocabulary [0, {vocab})")
        if not active_rows:
            return [None] * session.num_rows
        num_steps = self.buckets.new_tokens(max(params[r].max_new_tokens for r in active_rows))
        cache_lib.grow(session, self.buckets.cache(max(session.num_tokens(r) + params[r].max_new_tokens
                                                       for r in active_rows)))
        stops = self.buckets.stop_ids(max(len(params[r].stop_token_ids) for r in active_rows))
        index = self._call_rows(session, active_rows, self.buckets.active_rows(len(active_rows)))
        call_rows = list(range(session.batch_size)) if index is None else index.tolist()
        slot_of = {row: slot for slot, row in enumerate(call_rows)}
        batch = len(call_rows)
        active = np.zeros(batch, bool)
        temperature, top_p = np.zeros(batch, np.float32), np.ones(batch, np.float32)
        top_k, max_new, seeds = np.zeros(batch, np.int32), np.ones(batch, np.int32), np.zeros(batch, np.uint32)
        draw_below, max_draws = np.ones(batch, np.float32), np.zeros(batch, np.int32)
        stop_ids = np.full((batch, stops), -1, np.int32)
        for row in active_rows:
            p, slot = params[row], slot_of[row]
            active[slot] = True
            temperature[slot], top_p[slot], top_k[slot] = p.temperature, p.top_p, p.top_k
            max_new[slot], seeds[slot] = p.max_new_tokens, p.seed
            draw_below[slot], max_draws[slot] = p.draw_below, p.max_draws
            stop_ids[slot, :len(p.stop_token_ids)] = p.stop_token_ids
        settings = (active, temperature, top_k, top_p, seeds, draw_below, max_draws, max_new, stop_ids,
                    self._suppressed)
        state = (session.caches, session.lengths, session.next_positions, session.last_logits)
        with self._mesh_context():
            if index is None:
                result = self._decode(self.state, *state, *settings, num_steps=num_steps)
            else:
                result = self._decode_some(self.state, *state, index, *settings, num_steps=num_steps)
        caches, lengths, next_positions, last_logits, tokens, logprobs, drawn, counts, stopped = result
        session.caches, session.lengths = caches, lengths
        session.next_positions, session.last_logits = next_positions, last_logits
        tokens, logprobs, drawn, counts, stopped = jax.device_get((tokens, logprobs, drawn, counts, stopped))
        out: list[Completion | None] = [None] * session.num_rows
        for row in active_rows:
            slot = slot_of[row]
            n = int(counts[slot])
            out[row] = Completion(token_ids=tokens[slot, :n].copy(), logprobs=logprobs[slot, :n].copy(),
                                  finish_reason=FINISH_STOP if stopped[slot] else FINISH_LENGTH,
                                  drawn=drawn[slot, :n].copy())
            session.token_ids[row].extend(int(i) for i in tokens[slot, :n])
        return out

    def complete(self, prompts: Sequence[Segment],
                 params: SamplingParams | Sequence[SamplingParams]) -> list[Completion]:
        """Single turn: a fresh session holding `prompts`, one `generate` call, its completions."""
        prompts = list(prompts)
        session = self.new_session(len(prompts))
        self.append(session, prompts)
        return self.generate(session, params)

    def warmup(self, num_rows: int, *, prompt_length: int, max_new_tokens: int,
               image_grid_thw: Sequence[Sequence[int]] = ()) -> dict[str, int]:
        """Compiles the buckets of a call shape ahead of time by running a throwaway session through them.

        Args:
            num_rows: rows of the sessions to come.
            prompt_length: text tokens per row of the appends to come (images add their placeholders).
            max_new_tokens: budget of the generate calls to come.
            image_grid_thw: grids of the images of one append call (placed in row 0), e.g. [(1, 16, 16)].

        Returns:
            `compilations` afterwards.
        """
        config = self.config
        merge = config.vision_config.spatial_merge_size
        text_id = 0 if config.image_token_id != 0 else 1
        segments = [Segment([text_id] * prompt_length) for _ in range(num_rows)]
        grids = np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
        if len(grids):
            ids = [text_id] * prompt_length
            for grid in grids:
                ids += [config.vision_start_token_id, *[config.image_token_id] * (int(grid.prod()) // merge**2),
                        config.vision_end_token_id]
            pixels = np.zeros((int(grids.prod(-1).sum()), config.vision_config.patch_features), np.float32)
            segments[0] = Segment(ids, pixels, grids)
        self.complete(segments, SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))
        return self.compilations
