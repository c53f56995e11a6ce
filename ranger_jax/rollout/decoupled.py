"""The actor as a decoupled process: rounds of GRPO groups, new weights between rounds, shards all along.

    rounds = decoupled.RoundsConfig(weights_dir="/data/run1/weights", stop_file="/data/run1/weights/STOP",
                                    metrics_path="/data/run1/actor0.jsonl")
    summary = await decoupled.arun_rounds(tool_env, policy, tasks, renderer=renderer, out_dir="/data/run1/shards",
                                          config=runner.RolloutConfig(group_size=6), rounds=rounds, prefix="actor0")

(the actor CLI runs it with `--weights-dir`, `--max-rounds`, `--stop-file`, `--metrics`).

Each round:
1. if the weights folder (`rl.weights`) has a newer published version, the policy loads it
   (`SamplerPolicy.update_weights(model, policy_version=v)`); no episode is in flight then, so every
   trajectory is sampled with one version, recorded as its `policy_version`;
2. runs every task `group_size` times, in an order shuffled per round (seeded by the run seed and the round), with
   episode seeds and group ids of its own (`<run_id>-r00003/…`);
3. writes the groups as they finish to `<prefix>-r00003-00000.array_record`, … (`data.shards.RollingShardWriter`:
   each shard appears complete or not at all, so a learner streaming the folder never reads a partial one);
4. appends one JSONL line of metrics (round, version, episodes, episodes/s, mean reward, share of groups with zero
   reward variance, …) to the metrics file.

Rounds continue until `max_rounds`, the stop file appearing, or `stop` being set (the actor CLI sets it on
SIGTERM). A stop during a round drops the episodes in flight and publishes the groups already finished, so every
published shard holds complete groups and no temporary file is left behind. A restarted actor continues the round
numbering of the shards already in its folder.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tqdm

from ranger_jax import env as env_lib
from ranger_jax.data import shards
from ranger_jax.env import core
from ranger_jax.processing import chat as chat_lib
from ranger_jax.rl import metrics as metrics_lib
from ranger_jax.rl import weights as weights_lib
from ranger_jax.rollout import episode as episode_lib
from ranger_jax.rollout import policy as policy_lib
from ranger_jax.rollout import runner

log = logging.getLogger(__name__)

DEFAULT_POLL_S = 1.0  # how often the stop file (and, while waiting for a first version, the weights folder) is read
STOP_FILE = "STOP"  # in the weights folder: the default stop file of an actor that follows one


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoundsConfig:
    """When the rounds stop, where new weights come from and where round metrics go."""

    max_rounds: int | None = None  # rounds this process runs; None = until stopped
    stop_file: str | None = None  # the run stops once this file exists (checked every poll_s)
    weights_dir: str | None = None  # follow the versions published here (needs a policy with update_weights)
    metrics_path: str | None = None  # one JSONL line per round is appended here
    poll_s: float = DEFAULT_POLL_S
    tasks_per_round: int | None = None  # tasks of one round, taken from an endless shuffled stream; None = all

    def __post_init__(self):
        if self.max_rounds is not None and (isinstance(self.max_rounds, bool) or not isinstance(self.max_rounds, int)
                                            or self.max_rounds < 1):
            raise ValueError(f"RoundsConfig.max_rounds must be a positive int or None; got {self.max_rounds!r}")
        if self.tasks_per_round is not None and (isinstance(self.tasks_per_round, bool)
                                                 or not isinstance(self.tasks_per_round, int)
                                                 or self.tasks_per_round < 1):
            raise ValueError(f"RoundsConfig.tasks_per_round must be a positive int or None; "
                             f"got {self.tasks_per_round!r}")
        if not self.poll_s > 0:
            raise ValueError(f"RoundsConfig.poll_s must be > 0; got {self.poll_s!r}")


@dataclasses.dataclass(frozen=True)
class RoundsSummary:
    """What one decoupled actor run produced."""

    policy: str
    num_rounds: int
    num_groups: int
    num_trajectories: int
    versions: tuple[int, ...]  # the weights version of each round
    shards: tuple[str, ...]
    wall_s: float
    episodes_per_s: float
    reward_mean: float
    stopped_by: str  # "max_rounds", "stop_file" or "signal" (the stop event, which the actor CLI sets on SIGTERM)

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict."""
        row = dataclasses.asdict(self)
        row["reward_mean"] = None if math.isnan(self.reward_mean) else self.reward_mean
        return row


def round_prefix(prefix: str, round_index: int) -> str:
    """The shard prefix of one round: `<prefix>-r<round:05d>`."""
    return f"{prefix}-r{round_index:05d}"


def next_round(out_dir: str | os.PathLike, prefix: str) -> int:
    """The first round not yet in `out_dir`: one past the highest round of `prefix`'s shards there (0 if none)."""
    pattern = re.compile(re.escape(prefix) + r"-r(\d{5,})-\d+" + re.escape(shards.SHARD_SUFFIX))
    rounds = [int(m.group(1)) for p in shards.list_shards(out_dir) if (m := pattern.fullmatch(p.name))] \
        if Path(out_dir).is_dir() else []
    return max(rounds) + 1 if rounds else 0


def round_tasks(tasks: Sequence[core.Task], seed: int, round_index: int, per_round: int | None = None
                ) -> list[core.Task]:
    """The tasks of one round: all of them in an order that depends only on (seed, round), or with `per_round`
    the round's slice of an endless stream of shuffled passes (pass e shuffled by (seed, e)), so short rounds
    (frequent weight reloads) still visit every task equally often."""
    if per_round is None:
        order = np.random.default_rng([seed, round_index]).permutation(len(tasks))
        return [tasks[i] for i in order]
    out = []
    for k in range(round_index * per_round, (round_index + 1) * per_round):
        epoch, position = divmod(k, len(tasks))
        out.append(tasks[int(np.random.default_rng([seed, epoch]).permutation(len(tasks))[position])])
    return out


def round_config(config: runner.RolloutConfig, round_index: int) -> runner.RolloutConfig:
    """`config` with this round's run id (`<run_id>-r00003`) and a seed of its own, so episode seeds and group ids
    never repeat across rounds."""
    seed = int(np.random.SeedSequence([config.seed, round_index]).generate_state(1)[0])
    return dataclasses.replace(config, run_id=f"{config.run_id}-r{round_index:05d}", seed=seed)


def sampler_reloader(policy: Any, weights_dir: str | os.PathLike) -> Callable[[int], None]:
    """`reload(version)` for a policy over an in-process sampler: loads the version with the sampler's mesh and
    runtime settings (so its compiled programs stay valid) and swaps it in with `update_weights`.

    Raises:
        ValueError: the policy cannot take new weights (naming it).
    """
    sampler = getattr(policy, "sampler", None)
    if sampler is None or not hasattr(policy, "update_weights"):
        raise ValueError(f"policy {policy.name!r} cannot load new weights; following a weights folder needs the jax "
                         "policy (an in-process sampler)")

    def reload(version: int) -> None:
        c = sampler.config
        model = weights_lib.load_version(weights_dir, version, mesh=sampler.mesh, dtype=c.dtype,
                                         param_dtype=c.param_dtype, remat=c.remat, attention=c.attention,
                                         sharding_rules=c.sharding_rules)
        policy.update_weights(model, policy_version=version)

    return reload


def wait_for_version(weights_dir: str | os.PathLike, *, stop_file: str | os.PathLike | None = None,
                     poll_s: float = DEFAULT_POLL_S, timeout_s: float | None = None) -> int | None:
    """Blocks until `weights_dir` has a published version and returns it; None if the stop file appears first.

    Raises:
        TimeoutError: nothing published within `timeout_s` (naming the folder).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    logged = False
    while True:
        version = weights_lib.latest_version(weights_dir)
        if version is not None:
            return version
        if stop_file is not None and Path(stop_file).exists():
            return None
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"no weights version was published in {weights_dir} within {timeout_s} s")
        if not logged:
            log.info("waiting for a first weights version in %s", weights_dir)
            logged = True
        time.sleep(poll_s)


async def _watch_stop_file(path: str, stop: asyncio.Event, poll_s: float, reasons: list[str]) -> None:
    while not stop.is_set():
        if Path(path).exists():
            reasons.append("stop_file")
            stop.set()
            return
        await asyncio.sleep(poll_s)


def round_metrics(round_index: int, version: int, groups: Sequence[runner.Group], *, wall_s: float, num_shards: int,
                  stopped: bool) -> dict[str, Any]:
    """The metrics line of one round: round, version, groups, episodes, episodes_per_s, reward_mean,
    zero_variance_share (share of groups whose rewards are all equal: no GRPO signal), wall_s, shards, stopped (the
    round was cut short) and time; means are None for a round without groups."""
    rewards = [t.reward for g in groups for t in g.trajectories]
    return {"round": round_index, "version": version, "groups": len(groups), "episodes": len(rewards),
            "episodes_per_s": len(rewards) / wall_s if wall_s > 0 else 0.0,
            "reward_mean": float(np.mean(rewards)) if rewards else None,
            "zero_variance_share": metrics_lib.zero_variance_share(groups) if groups else None,
            "wall_s": wall_s, "shards": num_shards, "stopped": stopped, "time": time.time()}


def _append_line(path: str, row: dict[str, Any]) -> None:
    """Appends one JSON line (a single short write to a file opened for appending: lines never interleave)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


async def arun_rounds(tool_env: env_lib.ToolEnv, policy: policy_lib.Policy, tasks: Sequence[core.Task], *,
                      renderer: chat_lib.ChatRenderer, out_dir: str | os.PathLike,
                      config: runner.RolloutConfig = runner.RolloutConfig(),
                      rounds: RoundsConfig = RoundsConfig(), scorer: episode_lib.Scorer | None = None,
                      reload: Callable[[int], None] | None = None, stop: asyncio.Event | None = None,
                      prefix: str = "trajectories", records_per_shard: int = 256, progress: bool = False
                      ) -> RoundsSummary:
    """Runs rounds over `tasks` until a stop condition (see the module docstring).

    Args:
        reload: `reload(version)` puts a newer published version into the policy; None with a weights folder =
            `sampler_reloader(policy, rounds.weights_dir)`.
        stop: set it to end the run (the current round publishes its finished groups); None = a private one.
        The rest: as in `actor.arun_actor`.

    Raises:
        ValueError: no tasks, neither max_rounds nor a way to stop, or a policy that cannot follow a weights folder.
    """
    if not tasks:
        raise ValueError("arun_rounds needs at least one task")
    if rounds.max_rounds is None and rounds.stop_file is None and stop is None:
        raise ValueError("the rounds would never end: give max_rounds, a stop file or a stop event")
    if rounds.weights_dir is not None and reload is None:
        reload = sampler_reloader(policy, rounds.weights_dir)
    stop = stop if stop is not None else asyncio.Event()
    reasons: list[str] = []
    watcher = (asyncio.ensure_future(_watch_stop_file(rounds.stop_file, stop, rounds.poll_s, reasons))
               if rounds.stop_file is not None else None)
    version = int(getattr(policy, "policy_version", 0))
    first = next_round(out_dir, prefix)
    started = time.monotonic()
    rewards: list[float] = []
    versions: list[int] = []
    written: list[str] = []
    num_groups = 0
    bar = tqdm.tqdm(desc=f"actor {policy.name}", unit="ep", disable=not progress)
    try:
        round_index = first
        while rounds.max_rounds is None or round_index < first + rounds.max_rounds:
            if rounds.stop_file is not None and not stop.is_set() and Path(rounds.stop_file).exists():
                reasons.append("stop_file")
                stop.set()
            if stop.is_set():
                break
            if rounds.weights_dir is not None:
                latest = weights_lib.latest_version(rounds.weights_dir)
                if latest is not None and latest > version:
                    log.info("actor: loading weights version %d (was %d)", latest, version)
                    reload(latest)
                    version = latest
                    if stop.is_set():
                        break
            round_started = time.monotonic()
            groups: list[runner.Group] = []
            with shards.RollingShardWriter(out_dir, prefix=round_prefix(prefix, round_index),
                                           records_per_shard=records_per_shard) as writer:
                this_round = round_tasks(tasks, config.seed, round_index, rounds.tasks_per_round)
                await _run_round(tool_env, policy, this_round, renderer=renderer,
                                 config=round_config(config, round_index), scorer=scorer, writer=writer,
                                 groups=groups, stop=stop, bar=bar)
            row = round_metrics(round_index, version, groups, wall_s=time.monotonic() - round_started,
                                num_shards=len(writer.shards), stopped=stop.is_set())
            rewards += [t.reward for g in groups for t in g.trajectories]
            versions.append(version)
            written += [str(p) for p in writer.shards]
            num_groups += len(groups)
            if rounds.metrics_path is not None:
                _append_line(rounds.metrics_path, row)
            log.info("actor round %d (version %d): %d episodes, %.2f episodes/s, reward %.3f", round_index, version,
                     row["episodes"], row["episodes_per_s"], row["reward_mean"] or 0.0)
            round_index += 1
    finally:
        bar.close()
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    wall = time.monotonic() - started
    stopped_by = reasons[0] if reasons else ("signal" if stop.is_set() else "max_rounds")
    return RoundsSummary(policy=policy.name, num_rounds=len(versions), num_groups=num_groups,
                         num_trajectories=len(rewards), versions=tuple(versions), shards=tuple(written), wall_s=wall,
                         episodes_per_s=len(rewards) / wall if wall > 0 else 0.0,
                         reward_mean=float(np.mean(rewards)) if rewards else math.nan, stopped_by=stopped_by)


async def _run_round(tool_env: env_lib.ToolEnv, policy: policy_lib.Policy, tasks: list[core.Task], *,
                     renderer: chat_lib.ChatRenderer, config: runner.RolloutConfig,
                     scorer: episode_lib.Scorer | None, writer: shards.RollingShardWriter,
                     groups: list[runner.Group], stop: asyncio.Event, bar: tqdm.tqdm) -> None:
    """Writes the round's groups as they finish; when `stop` is set, cancels the episodes in flight and returns."""
    stream = runner.agroups(tool_env, policy, tasks, renderer=renderer, config=config, scorer=scorer)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while True:
            following = asyncio.ensure_future(anext(stream))
            await asyncio.wait({following, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not following.done():  # stopped: the cancellation runs agroups' cleanup (its episodes are cancelled)
                following.cancel()
                await asyncio.gather(following, return_exceptions=True)
                return
            try:
                group = following.result()
            except StopAsyncIteration:
                return
            for trajectory in group.trajectories:
                writer.write(trajectory)
            groups.append(group)
            bar.update(len(group.trajectories))
            bar.set_postfix(version=group.trajectories[0].policy_version, reward=f"{float(group.rewards.mean()):.3f}")
    finally:
        stopped.cancel()
        await asyncio.gather(stopped, return_exceptions=True)
        await stream.aclose()
