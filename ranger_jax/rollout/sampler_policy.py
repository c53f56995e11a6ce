"""The in-process JAX sampler as the policy: one KV-cache session, one row per episode, turns batched.

Each episode holds a row of a `sampling.Session` from its first turn to `release`. A turn appends only what
is new since the row's last turn — the closing of the previous assistant turn, the tool response with its
images (their pixels go through the vision tower once) and the generation prompt — and the sampler continues
from the cached history: nothing is re-run or re-tokenized. Turns of different episodes that are waiting at
the same time run as one batched `append` + `generate` call in a worker thread, so tool calls and other
episodes keep going on the event loop meanwhile. Before a call starts, the policy waits up to `batch_wait_s`
for the turns of every other episode holding a row (one still rendering its observation or running a tool
call): a batch costs about the same with one row as with all, so launching early would make the latecomers
wait a whole call.

Forks (`fork`) copy a row's cache, so a GRPO group's members continue one history without re-running it; `prefill`
appends a turn's prompt without generating, so the prompt every member continues from is computed once, before
the fork copies it (`episode.run_shared_trunk`).

Continuous batching (`chunk_tokens`): a call decodes at most `chunk_tokens` tokens per row; turns still going
carry on in the next call, which also takes the turns queued meanwhile. A batch then never waits for its longest
turn (a call decodes until its last row stops, at the cost of every row, and one runaway turn holds all the
others for its whole budget): finished rows go back to their episodes and new turns take their place after at
most one chunk. Continuing is exact: a row's random key is folded with its own length, its token and draw
budgets carry over, so a turn decoded in chunks has the tokens, log-probabilities and draws of one call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ranger_jax import sampling
from ranger_jax.rollout import policy as policy_lib

log = logging.getLogger(__name__)

DEFAULT_BATCH_WAIT_S = 0.05  # longest wait for stragglers before a batched call (a decode call takes ~seconds)
# tokens a row decodes per call before the batch is refilled. Measured (benchmarks/continuous_batching.py, 2 CPU
# cores): the greedy held-out evaluation of a sim-tiny SFT policy, 100 tasks, 32 rows, takes 42.6 s instead of 50.1
# (x1.18) with the same per-task rewards: 1,197 decode steps instead of 2,190, each a little dearer (the batch mixes
# short and long histories); turns that all run to the same length have nothing to gain
DEFAULT_CHUNK_TOKENS = 32
NEVER_DRAW = 1e-30  # `draw_below` of a row whose draw budget is spent: no token is that unlikely to be the argmax


@dataclasses.dataclass
class _Pending:
    row: int
    request: policy_lib.TurnRequest
    future: asyncio.Future
    # a turn decoded over several calls: its tokens so far (empty before its first call)
    parts: list[sampling.Completion] = dataclasses.field(default_factory=list)
    batch_size: int = 0  # turns in the call that started it
    prefill_only: bool = False  # append the prompt, generate nothing (`SamplerPolicy.prefill`)

    def generated(self) -> int:
        return sum(len(part.token_ids) for part in self.parts)

    def draws(self) -> int:
        return sum(int(np.sum(part.drawn)) for part in self.parts)

    def finished(self) -> bool:
        return bool(self.parts) and (self.parts[-1].finish_reason == sampling.FINISH_STOP
                                     or self.generated() >= self.request.max_new_tokens)

    def completion(self) -> sampling.Completion:
        """The turn's parts as one completion."""
        return sampling.Completion(token_ids=np.concatenate([p.token_ids for p in self.parts]),
                                   logprobs=np.concatenate([p.logprobs for p in self.parts]),
                                   finish_reason=self.parts[-1].finish_reason,
                                   drawn=np.concatenate([p.drawn for p in self.parts]))


def sampler_params(request: policy_lib.TurnRequest, *, generated: int = 0, drawn: int = 0,
                   chunk_tokens: int | None = None) -> sampling.SamplingParams:
    """The sampler's per-row settings of a turn (top_k -1, "all", is the sampler's 0); for a turn continued after
    `generated` tokens with `drawn` draws, its remaining budgets, at most `chunk_tokens` new tokens (None: all)."""
    s = request.sampling
    max_new = request.max_new_tokens - generated
    if chunk_tokens is not None:
        max_new = min(max_new, chunk_tokens)
    draw_below, max_draws = float(s.draw_below), int(s.max_draws)
    if max_draws:
        max_draws -= drawn
        if max_draws <= 0:  # the budget is spent: argmax from here, the tempered log-probabilities as before
            draw_below, max_draws = NEVER_DRAW, 0
    return sampling.SamplingParams(temperature=float(s.temperature), top_p=float(s.top_p),
                                   top_k=0 if s.top_k == -1 else int(s.top_k), max_new_tokens=max_new,
                                   stop_token_ids=tuple(request.stop_token_ids), seed=int(request.seed) & 0xFFFFFFFF,
                                   draw_below=draw_below, max_draws=max_draws)


def new_segment(held: list[int], request: policy_lib.TurnRequest) -> sampling.Segment | None:
    """What a row must append before this turn: the prompt beyond the tokens it holds, with the turn's new images.

    Raises:
        ValueError: the row's tokens are not a prefix of the prompt (the loop is not token-exact), naming the
            first differing position.
    """
    prompt = np.asarray(request.prompt_ids, np.int32)
    n = len(held)
    if n > prompt.size or not np.array_equal(prompt[:n], np.asarray(held, np.int32)):
        mismatch = next((i for i in range(min(n, prompt.size)) if int(prompt[i]) != held[i]), min(n, prompt.size))
        raise ValueError(f"episode {request.rid}: the sampler row holds {n} tokens that are not a prefix of the "
                         f"{prompt.size}-token prompt (first difference at position {mismatch})")
    delta = prompt[n:]
    if not delta.size:
        if request.new_images:
            raise ValueError(f"episode {request.rid}: {len(request.new_images)} new images but no new tokens")
        return None
    if not request.new_images:
        return sampling.Segment(delta)
    pixel_values = np.concatenate([image.pixel_values for image in request.new_images])
    grids = np.stack([image.grid_thw for image in request.new_images])
    return sampling.Segment(delta, pixel_values, grids)


class SamplerPolicy:
    """Policy backend over an in-process `sampling.Sampler` (see the module docstring).

    Args:
        sampler: the sampler of the policy model.
        num_rows: episodes that can hold a cache row at once (more wait for a free row); match the rollout's
            concurrency.
        name: label recorded on trajectories.
        policy_version: version recorded on every turn; `update_weights` advances it.
        capacity: initial cache slots per row (the cache doubles when needed).
        batch_wait_s: how long a batch may wait for the turns of the other episodes that hold rows (0: never).
        chunk_tokens: tokens a row decodes per call before the batch takes in the turns queued meanwhile
            (continuous batching, see the module docstring); None: a call decodes whole turns.
    """

    token_exact = True
    has_logprobs = True

    def __init__(self, sampler: sampling.Sampler, *, num_rows: int = 8, name: str = "jax", policy_version: int = 0,
                 capacity: int | None = None, batch_wait_s: float = DEFAULT_BATCH_WAIT_S,
                 chunk_tokens: int | None = DEFAULT_CHUNK_TOKENS):
        if not batch_wait_s >= 0:
            raise ValueError(f"batch_wait_s must be >= 0; got {batch_wait_s!r}")
        if chunk_tokens is not None and (isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int)
                                         or chunk_tokens < 1):
            raise ValueError(f"chunk_tokens must be None or an int >= 1; got {chunk_tokens!r}")
        self.sampler, self.name, self.policy_version = sampler, name, policy_version
        self.batch_wait_s = float(batch_wait_s)
        self.chunk_tokens = chunk_tokens
        self.session = sampler.new_session(num_rows, capacity=capacity)
        self._rows: dict[str, int] = {}  # rid -> row
        self._free = list(range(num_rows))
        self._dirty: set[int] = set()  # rows to empty before their next use (done on the worker thread)
        self._pending: list[_Pending] = []
        self._batch: list[_Pending] = []  # the turns of the sampler call running now
        self._continuing: list[_Pending] = []  # turns that carry on in the next call
        self._forks: list[tuple[int, list[int], asyncio.Future]] = []  # (source row, new rows, done) to copy
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the two primitives below belong to
        self._row_freed: asyncio.Condition | None = None
        self._arrived: asyncio.Event | None = None  # set when a turn is queued or a row released
        self._driver: asyncio.Task | None = None
        self.num_batches = 0  # batched sampler calls made (for monitoring)

    @property
    def num_rows(self) -> int:
        """Rows of the KV-cache session (episodes that can be in flight at once)."""
        return self.session.num_rows

    def update_weights(self, model: Any, *, policy_version: int) -> None:
        """Swaps in new weights (same architecture) and stamps later turns with `policy_version`.

        Call it between rollouts: rows still held keep caches computed with the old weights.
        """
        self.sampler.update_weights(model)
        self.policy_version = policy_version

    def _bind_loop(self) -> None:
        """asyncio primitives belong to one event loop: make fresh ones when the policy is used from another
        (each `runner.run` is its own `asyncio.run`)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._row_freed, self._arrived = loop, asyncio.Condition(), asyncio.Event()

    async def _row(self, rid: str) -> int:
        if rid in self._rows:
            return self._rows[rid]
        self._bind_loop()
        async with self._row_freed:
            await self._row_freed.wait_for(lambda: bool(self._free))
            row = self._free.pop(0)
        self._rows[rid] = row
        return row

    async def generate(self, request: policy_lib.TurnRequest) -> policy_lib.Generation:
        """Queues the turn for the next batched sampler call and waits for its completion.

        Raises:
            ValueError: the prompt does not continue the episode's row (see `new_segment`).
        """
        completion, batch_size = await self._queue(request)
        return policy_lib.Generation(token_ids=completion.token_ids, logprobs=completion.logprobs,
                                     finish_reason=completion.finish_reason, policy_version=self.policy_version,
                                     info={"batch_size": batch_size}, drawn=completion.drawn)

    async def prefill(self, request: policy_lib.TurnRequest) -> None:
        """Appends the turn's prompt (what is new since the row's last turn, with its images) to the episode's row
        without generating; the turn's `generate` then appends nothing. Before a `fork` this computes a group's
        shared next prompt once, in the row every fork copies, instead of once in each forked row
        (`episode.run_shared_trunk`).

        Raises:
            ValueError: the prompt does not continue the episode's row (see `new_segment`).
        """
        await self._queue(request, prefill_only=True)

    async def fork(self, rid: str, into: Sequence[str]) -> None:
        """Episodes `into` continue episode `rid`: each gets a row holding a copy of its row (KV cache, positions,
        last logits; `Sampler.fork_rows`), made on the worker thread before the next batch, so their next turn
        appends only what is new.

        Raises:
            ValueError: `rid` holds no row (it has not played a turn), or one of `into` already holds one.
        """
        if rid not in self._rows:
            raise ValueError(f"episode {rid} holds no sampler row to fork (fork after its first turn)")
        into = list(into)
        taken = [other for other in into if other in self._rows or other == rid]
        if taken or len(set(into)) != len(into):
            raise ValueError(f"cannot fork episode {rid} into {into}: {taken or 'repeated rids'} already hold rows")
        if not into:
            return
        rows = [await self._row(other) for other in into]
        future = asyncio.get_running_loop().create_future()
        self._forks.append((self._rows[rid], rows, future))
        self._wake()
        try:
            await future
        except BaseException:
            for other in into:  # the copies never happened: the rows go back
                await self.release(other)
            raise

    async def _queue(self, request: policy_lib.TurnRequest, *, prefill_only: bool = False) -> Any:
        """Queues the turn on its episode's row for the next batched call; what the call gives it (its completion
        and batch size; None for a prefill)."""
        row = await self._row(request.rid)
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(row, request, future, prefill_only=prefill_only))
        self._wake()
        return await future

    def _wake(self) -> None:
        """Tells the driver there is work, starting it if it is not running."""
        self._signal()
        if self._driver is None or self._driver.done():
            self._driver = asyncio.ensure_future(self._drive())

    def _signal(self) -> None:
        if self._arrived is not None and self._loop is asyncio.get_running_loop():
            self._arrived.set()

    async def _await_stragglers(self) -> None:
        """Waits (at most `batch_wait_s`) until every row held by an episode has a turn queued or carrying on."""
        self._bind_loop()
        deadline = self._loop.time() + self.batch_wait_s
        while len({item.row for item in self._pending + self._continuing}) < len(self._rows) and not self._forks:
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                return

    async def _drive(self) -> None:
        """Runs the waiting turns as batches until none is left; if the driver itself dies (cancelled with its
        loop), every turn still waiting learns why instead of hanging."""
        try:
            await self._drive_batches()
        except BaseException as err:
            waiting = [item.future for item in self._batch + self._continuing + self._pending]
            waiting += [future for _, _, future in self._forks]
            self._pending, self._batch, self._continuing, self._forks = [], [], [], []
            for future in waiting:
                if not future.done():
                    future.set_exception(err if isinstance(err, Exception) else
                                         RuntimeError(f"sampler driver stopped: {err!r}"))
            raise

    async def _drive_batches(self) -> None:
        while self._pending or self._continuing or self._forks:
            if self._forks:
                await self._run_forks()
                continue
            if self.batch_wait_s > 0:
                await self._await_stragglers()
                if self._forks:
                    continue
            for item in self._pending:
                item.batch_size = len(self._pending) + len(self._continuing)
            self._batch, self._pending, self._continuing = self._continuing + self._pending, [], []
            batch = self._batch
            dirty, self._dirty = sorted(self._dirty), set()  # taken here, on the loop thread `release` runs on
            try:
                results = await asyncio.to_thread(self._run_batch, batch, dirty)
            except Exception as err:  # noqa: BLE001 — the sampler failed for the whole batch: every turn learns why
                results = [err] * len(batch)
                self._dirty.update(dirty)
            self._batch = []
            self.num_batches += 1
            for item, result in zip(batch, results):
                if item.future.done():
                    continue
                if isinstance(result, Exception):
                    item.future.set_exception(result)
                elif item.prefill_only:
                    item.future.set_result(None)
                elif item.finished():
                    item.future.set_result((item.completion(), item.batch_size))
                else:
                    self._continuing.append(item)

    async def _run_forks(self) -> None:
        """Copies the queued forks' rows on the worker thread (reused rows emptied first); each fork learns the
        outcome."""
        forks, self._forks = self._forks, []
        dirty, self._dirty = sorted(self._dirty), set()

        def copy_rows() -> None:
            if dirty:
                self.session.reset_rows(dirty)
            for source, rows, _ in forks:
                self.sampler.fork_rows(self.session, source, rows)

        try:
            await asyncio.to_thread(copy_rows)
        except Exception as err:  # noqa: BLE001 — every waiting fork learns why
            self._dirty.update(dirty)
            for _, _, future in forks:
                if not future.done():
                    future.set_exception(err)
            return
        for _, _, future in forks:
            if not future.done():
                future.set_result(None)

    def _run_batch(self, batch: list[_Pending], dirty: list[int]) -> list[Any]:
        """On the worker thread: empties reused rows, appends each new turn's segment, generates for all (a turn
        that carries on appends nothing); each turn gets its completion as a part, or the error of its input."""
        session = self.session
        if dirty:
            session.reset_rows(dirty)
        results: list[Any] = [None] * len(batch)
        segments: list[sampling.Segment | None] = [None] * session.num_rows
        params: list[sampling.SamplingParams | None] = [None] * session.num_rows
        for i, item in enumerate(batch):
            try:
                if not item.parts:
                    segments[item.row] = new_segment(session.token_ids[item.row], item.request)
                if not item.prefill_only:
                    params[item.row] = sampler_params(item.request, generated=item.generated(),
                                                      drawn=item.draws(), chunk_tokens=self.chunk_tokens)
            except ValueError as err:
                results[i] = err
        self.sampler.append(session, segments)
        completions = self.sampler.generate(session, params)
        for i, item in enumerate(batch):
            if results[i] is None:
                if not item.prefill_only:
                    item.parts.append(completions[item.row])
                results[i] = item
        return results

    async def release(self, rid: str) -> None:
        """Frees the episode's row (emptied before its next use)."""
        row = self._rows.pop(rid, None)
        if row is None:
            return
        self._dirty.add(row)
        self._free.append(row)
        self._signal()  # one row fewer to wait for
        if self._row_freed is not None and self._loop is asyncio.get_running_loop():
            async with self._row_freed:
                self._row_freed.notify()

    async def aclose(self) -> None:
        """Nothing to close: the sampler belongs to the caller."""
