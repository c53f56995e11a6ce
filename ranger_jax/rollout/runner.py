"""Many episodes in flight at once, grouped by task for GRPO.

Each task is run `group_size` (G) times, each sample with its own seed; at most `concurrency` episodes run at
once on one asyncio loop (tool calls, HTTP generations and the in-process sampler's worker thread overlap),
and a `Group` is emitted as soon as all G samples of its task are done — so a learner can compute group
advantages without waiting for the whole batch.

    async for group in agroups(env, policy, tasks, renderer=renderer, config=RolloutConfig(group_size=6)):
        advantages = grpo.group_advantages(group.rewards, ...)
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import numpy as np

from ranger_jax.data import trajectory
from ranger_jax.env import core, tool_env
from ranger_jax.processing import chat
from ranger_jax.rollout import episode as episode_lib
from ranger_jax.rollout import policy as policy_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """How many episodes run, and how (Gen-Searcher: G = 6 per prompt, 64 parallel tasks)."""

    group_size: int = 1  # G: samples per task, each with its own seed
    concurrency: int = 8  # episodes in flight at once
    # base seed; each episode's seed derives from (seed, group index, sample index). An SGLang policy server
    # honours sampling seeds only when launched with --enable-deterministic-inference (recorded per turn).
    seed: int = 0
    run_id: str = "run"  # prefix of every group id (make it unique per actor and step)
    episode: episode_lib.EpisodeConfig = episode_lib.EpisodeConfig()
    # Branching turns: each group draws one of these (seeded by its index); its samples play the turns before it
    # greedily as shared, untrained context and sample from it on (`EpisodeSpec.sample_from_turn`). (0,) samples
    # whole episodes. Later branches give credit to fewer turns: the advantage then compares continuations of one
    # shared prefix, which cuts the variance of the policy gradient (tree-style rollouts, as ARPO branches after tool
    # calls).
    branch_turns: tuple[int, ...] = (0,)
    # how many turns from the branching turn are sampled (None: all to the end); the later ones are greedy context,
    # so a group's advantages credit only the sampled turns
    sample_turns: int | None = None
    # the first member of each group plays its sampled turns greedily (`EpisodeSpec.greedy`), still trained (with
    # decision sampling, where a sample would draw: `episode.turn_sampling`): its advantage says whether the
    # policy's mode (what a greedy evaluation plays) beats the group's samples
    greedy_member: bool = False
    # a group branching at turn b >= 1 plays its greedy turns 0..b-1 once and forks its samples from there
    # (`episode.run_shared_trunk`, `Policy.fork`): the same episodes for less work. Needs concurrency >= group_size
    # (its samples then hold their rows together) and a backend with `fork`; otherwise every sample plays them.
    share_trunk: bool = True
    # with shared trunks: the trunk's row takes the branching turn's prompt (its last observation and the generation
    # prompt) before the fork, where the backend can (`SamplerPolicy.prefill`), so it is computed once a group, not
    # once a sample. Like `share_trunk`, it changes the time, not the episodes
    prefill_trunk: bool = True
    # with shared trunks and `sample_turns` set: a sample whose sampled turns (and the observations after them) come
    # out token-identical to an earlier sample's takes over that sample's greedy continuation instead of playing it
    # again (`episode.run_shared_trunk`; each sample is still scored). Exact for an environment that answers a
    # history the same way every time (the offline world); a live web may not, hence off by default
    share_continuations: bool = False
    # (i, n): this runner plays only the groups whose index is i modulo n, each with the index (seeds, branching
    # turn, group id) it has among all the tasks, so n runners with parts (0, n) ... (n-1, n) play between them
    # exactly the groups of one run: a round split among actor processes (`actor --part I/N`)
    part: tuple[int, int] = (0, 1)

    def __post_init__(self):
        for name in ("group_size", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RolloutConfig.{name} must be a positive int; got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"RolloutConfig.seed must be an int >= 0; got {self.seed!r}")
        if not self.run_id or "/" in self.run_id:
            raise ValueError(f"RolloutConfig.run_id must be non-empty without '/'; got {self.run_id!r}")
        object.__setattr__(self, "branch_turns", checked_branch_turns(self.branch_turns, "RolloutConfig"))
        check_sample_turns(self.sample_turns, "RolloutConfig")
        for name in ("share_trunk", "prefill_trunk", "share_continuations"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"RolloutConfig.{name} must be a bool; got {getattr(self, name)!r}")
        if not isinstance(self.greedy_member, bool):
            raise ValueError(f"RolloutConfig.greedy_member must be a bool; got {self.greedy_member!r}")
        if self.share_continuations and self.sample_turns is None:
            raise ValueError("RolloutConfig.share_continuations needs sample_turns (only turns after the sampled ones "
                             "are greedy, so only they can be shared); got sample_turns=None")
        object.__setattr__(self, "part", checked_part(self.part, "RolloutConfig"))
        if self.greedy_member and self.group_size < 2:
            raise ValueError(f"RolloutConfig.greedy_member needs group_size >= 2 (a greedy member and samples); "
                             f"got {self.group_size}")


@dataclasses.dataclass(frozen=True)
class Group:
    """All G samples of one task, in sample order."""

    group_id: str
    task_id: str
    trajectories: tuple[trajectory.Trajectory, ...]

    @property
    def rewards(self) -> np.ndarray:
        """[G] float32 rewards in sample order."""
        return np.asarray([t.reward for t in self.trajectories], np.float32)


def episode_seed(seed: int, group_index: int, sample_index: int) -> int:
    """A 63-bit seed for one episode from the run seed and its place in the run."""
    state = np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32, group_index, sample_index]).generate_state(2)
    return int((int(state[0]) << 31) ^ int(state[1]))


def checked_branch_turns(value: Any, owner: str) -> tuple[int, ...]:
    """`value` as a tuple of branching turns (ints >= 0, at least one).

    Raises:
        ValueError: anything else, naming `owner`'s field.
    """
    turns = tuple(value)
    if not turns or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in turns):
        raise ValueError(f"{owner}.branch_turns must be a non-empty tuple of ints >= 0; got {value!r}")
    return turns


def parse_branch_turns(text: str) -> tuple[int, ...]:
    """Branching turns from a command line's comma-separated `--branch-turns` value (e.g. "2" or "1,2,3").

    Raises:
        ValueError: a part that is not an int, naming the whole value.
    """
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise ValueError(f"--branch-turns must be comma-separated ints; got {text!r}") from None


def checked_part(value: Any, owner: str) -> tuple[int, int]:
    """`value` as a part (i, n) of a run's groups: ints with 0 <= i < n.

    Raises:
        ValueError: anything else, naming `owner`'s field.
    """
    try:
        index, count = value
    except (TypeError, ValueError):
        raise ValueError(f"{owner}.part must be a pair (i, n) with 0 <= i < n; got {value!r}") from None
    if (any(isinstance(v, bool) or not isinstance(v, int) for v in (index, count)) or count < 1
            or not 0 <= index < count):
        raise ValueError(f"{owner}.part must be a pair (i, n) with 0 <= i < n; got {value!r}")
    return index, count


def parse_part(text: str) -> tuple[int, int]:
    """A part of a run's groups from a command line's `I/N` (e.g. "0/2": the first of two actors).

    Raises:
        ValueError: text that is not two ints with 0 <= I < N, naming the whole value.
    """
    index, slash, count = text.partition("/")
    try:
        if not slash:
            raise ValueError
        return checked_part((int(index), int(count)), "part")
    except ValueError:
        raise ValueError(f"a part must be I/N with ints 0 <= I < N (e.g. 0/2); got {text!r}") from None


def indexed_tasks(config: RolloutConfig, tasks: Iterable[core.Task]) -> Iterator[tuple[int, core.Task]]:
    """(group index, task) of the groups this runner plays: every task, or with `config.part` (i, n) those whose
    index is i modulo n."""
    index, count = config.part
    return ((k, task) for k, task in enumerate(tasks) if k % count == index)


def check_sample_turns(value: Any, owner: str) -> None:
    """Raises ValueError naming `owner`'s field unless `value` is None or an int >= 1."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{owner}.sample_turns must be None or an int >= 1; got {value!r}")


def branch_turn(config: RolloutConfig, group_index: int) -> int:
    """The branching turn of one group: drawn from `config.branch_turns`, seeded by (seed, group index)."""
    if len(config.branch_turns) == 1:
        return config.branch_turns[0]
    rng = np.random.default_rng([config.seed & 0xFFFFFFFF, config.seed >> 32, group_index, 0xB4])
    return config.branch_turns[int(rng.integers(len(config.branch_turns)))]


def group_id(run_id: str, group_index: int, task: core.Task) -> str:
    """The id of one GRPO group: `run_id/group_index/task_id`."""
    return f"{run_id}/{group_index:06d}/{task.id}"


async def agroups(env: tool_env.ToolEnv, policy: policy_lib.Policy, tasks: Iterable[core.Task], *,
                  renderer: chat.ChatRenderer, config: RolloutConfig = RolloutConfig(),
                  scorer: episode_lib.Scorer | None = None,
                  cache: episode_lib.EpisodeCache | None = None) -> AsyncIterator[Group]:
    """Runs every task G times with at most `config.concurrency` episodes in flight; yields groups as they finish.

    Episodes are started in task order and share `cache` (None: a new one for this run). An exception from an
    episode (a bug or a scorer that cannot score the task; policy failures are recorded on the trajectory
    instead) cancels the rest and propagates. Groups that branch after turn 0 share their greedy turns when
    `config.share_trunk` allows (`shares_trunks`).
    """
    cache = cache if cache is not None else episode_lib.EpisodeCache()
    if shares_trunks(config, policy):
        async for group in _shared_trunk_groups(env, policy, tasks, renderer=renderer, config=config, scorer=scorer,
                                                cache=cache):
            yield group
        return
    specs = ((index, task, spec) for index, task in indexed_tasks(config, tasks)
             for spec in _episode_specs(config, index, task))
    running: dict[asyncio.Task, tuple[int, core.Task]] = {}
    done_by_group: dict[int, list[trajectory.Trajectory]] = {}

    def start_next() -> bool:
        spec = next(specs, None)
        if spec is None:
            return False
        index, task, episode = spec
        coroutine = episode_lib.run_episode(env, policy, episode, renderer=renderer, config=config.episode,
                                            scorer=scorer, cache=cache)
        running[asyncio.ensure_future(coroutine)] = (index, task)
        return True

    try:
        while len(running) < config.concurrency and start_next():
            pass
        while running:
            finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for future in finished:
                index, task = running.pop(future)
                done_by_group.setdefault(index, []).append(future.result())
                if len(done_by_group[index]) == config.group_size:
                    samples = sorted(done_by_group.pop(index), key=lambda t: t.sample_index)
                    yield Group(group_id=samples[0].group_id, task_id=task.id, trajectories=tuple(samples))
            while len(running) < config.concurrency and start_next():
                pass
    finally:
        for future in running:
            future.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


def shares_trunks(config: RolloutConfig, policy: policy_lib.Policy) -> bool:
    """Whether `agroups` plays a group's greedy turns once (`RolloutConfig.share_trunk`): groups of two or more that
    fit the rows in flight together, and a backend that can fork an episode."""
    return (config.share_trunk and 1 < config.group_size <= config.concurrency
            and callable(getattr(policy, "fork", None)) and any(turn > 0 for turn in config.branch_turns))


def _episode_specs(config: RolloutConfig, index: int, task: core.Task) -> list[episode_lib.EpisodeSpec]:
    """The G episodes of group `index` (one task): their seeds, branching turn and sampled turns."""
    branch = branch_turn(config, index)
    return [episode_lib.EpisodeSpec(task=task, group_id=group_id(config.run_id, index, task), sample_index=k,
                                    seed=episode_seed(config.seed, index, k), sample_from_turn=branch,
                                    sample_turns=config.sample_turns, greedy=config.greedy_member and k == 0)
            for k in range(config.group_size)]


def max_shared_groups(concurrency: int, group_size: int) -> int:
    """Groups in flight at once when they share trunks: about 2·rows / (G + 1), the count whose rows stay busy when
    a trunk (one row) lasts about as long as its samples (G rows); at most rows - G + 1, so that even if every group
    in flight holds one row waiting to fork, G - 1 rows are free for one of them (no deadlock)."""
    return max(1, min(2 * concurrency // (group_size + 1), concurrency - group_size + 1))


class _Rows:
    """The rows (episodes in flight) of a shared-trunk run: a group starts holding one row (its trunk), or G when it
    branches at turn 0; a fork takes G - 1 more, first come first served, before any new group starts; every
    released episode gives its row back at once."""

    def __init__(self, rows: int, group_size: int, max_groups: int):
        self.free, self.size, self.max_groups = rows, group_size, max_groups
        self.groups = 0
        self.forks: collections.deque[asyncio.Future] = collections.deque()
        self.changed = asyncio.Event()

    def can_start(self, rows: int) -> bool:
        return self.groups < self.max_groups and self.free >= rows and not self.forks

    def start(self, rows: int) -> None:
        self.free -= rows
        self.groups += 1

    async def reserve_fork(self) -> None:
        if not self.forks and self.free >= self.size - 1:
            self.free -= self.size - 1
            return
        future = asyncio.get_running_loop().create_future()
        self.forks.append(future)
        await future

    def release(self) -> None:
        self.free += 1
        while self.forks and self.free >= self.size - 1:
            future = self.forks.popleft()
            if not future.done():
                self.free -= self.size - 1
                future.set_result(None)
        self.changed.set()

    def finish_group(self) -> None:
        self.groups -= 1


async def _shared_trunk_groups(env: tool_env.ToolEnv, policy: policy_lib.Policy, tasks: Iterable[core.Task], *,
                               renderer: chat.ChatRenderer, config: RolloutConfig, scorer: episode_lib.Scorer | None,
                               cache: episode_lib.EpisodeCache) -> AsyncIterator[Group]:
    """`agroups` with a group as the unit of work (`episode.run_shared_trunk`), `config.concurrency` rows shared
    as `_Rows` says, at most `max_shared_groups` groups in flight: a trunk holds one row where G samples held G,
    so more groups run at once in the same rows."""
    size = config.group_size
    rows = _Rows(config.concurrency, size, max_shared_groups(config.concurrency, size))
    pending = indexed_tasks(config, tasks)
    next_item = next(pending, None)
    running: dict[asyncio.Task, tuple[int, core.Task]] = {}

    async def whole_group(specs: list[episode_lib.EpisodeSpec]) -> list[trajectory.Trajectory]:
        async def one(spec):
            try:
                return await episode_lib.run_episode(env, policy, spec, renderer=renderer, config=config.episode,
                                                     scorer=scorer, cache=cache)
            finally:
                rows.release()
        return list(await asyncio.gather(*(one(spec) for spec in specs)))

    def start_groups() -> None:
        nonlocal next_item
        while next_item is not None:
            index, task = next_item
            specs = _episode_specs(config, index, task)
            trunk = specs[0].sample_from_turn > 0
            if not rows.can_start(1 if trunk else size):
                return
            rows.start(1 if trunk else size)
            if trunk:
                coroutine = episode_lib.run_shared_trunk(env, policy, specs, renderer=renderer,
                                                         config=config.episode, scorer=scorer, cache=cache,
                                                         before_fork=rows.reserve_fork, on_release=rows.release,
                                                         prefill=config.prefill_trunk,
                                                         share_continuations=config.share_continuations)
            else:
                coroutine = whole_group(specs)
            running[asyncio.ensure_future(coroutine)] = (index, task)
            next_item = next(pending, None)

    waiter: asyncio.Task | None = None
    try:
        start_groups()
        while running:
            rows.changed.clear()
            waiter = asyncio.ensure_future(rows.changed.wait())
            finished, _ = await asyncio.wait([*running, waiter], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            groups = []
            for future in finished:
                if future is waiter:
                    continue
                index, task = running.pop(future)
                samples = future.result()
                rows.finish_group()
                groups.append(Group(group_id=samples[0].group_id, task_id=task.id, trajectories=tuple(samples)))
            start_groups()
            for group in groups:
                yield group
    finally:
        if waiter is not None:
            waiter.cancel()
        for future in running:
            future.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


async def arun(env: tool_env.ToolEnv, policy: policy_lib.Policy, tasks: Iterable[core.Task], *,
               renderer: chat.ChatRenderer, config: RolloutConfig = RolloutConfig(),
               scorer: episode_lib.Scorer | None = None, cache: episode_lib.EpisodeCache | None = None) -> list[Group]:
    """Every group of `agroups(...)` (same arguments), in completion order."""
    return [group async for group in agroups(env, policy, tasks, renderer=renderer, config=config, scorer=scorer,
                                             cache=cache)]


def run(env: tool_env.ToolEnv, policy: policy_lib.Policy, tasks: Iterable[core.Task], *,
        renderer: chat.ChatRenderer, config: RolloutConfig = RolloutConfig(),
        scorer: episode_lib.Scorer | None = None, cache: episode_lib.EpisodeCache | None = None) -> list[Group]:
    """Sync twin of `arun` (must not be called from a running event loop)."""
    return asyncio.run(arun(env, policy, tasks, renderer=renderer, config=config, scorer=scorer, cache=cache))
