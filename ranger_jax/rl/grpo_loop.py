"""GRPO with decoupled actors: the learner side.

Actors are separate processes (`python -m ranger_jax.rollout.actor --weights-dir W --tasks-per-round R …`)
that sample GRPO groups with the latest published weights and write one shard set per round. This loop:

1. publishes the learner's weights as version 0 (`rl.weights.publish`, an HF checkpoint actors hot-reload);
2. optionally starts the actor processes itself (`actor_commands`), with their output in log files;
3. per step, streams the oldest unread round of shards through the Grain pipeline (`data.pipeline`: exact tokens
   and pixels, group advantages over valid members, trajectories older than `max_staleness` versions dropped),
   takes one GRPO update, publishes the new version, and records metrics: loss and GRPO metrics, reward, the share
   of groups with zero reward variance, the staleness histogram, episodes/s and the learner's idle fraction (time
   spent waiting for actors);
4. writes the stop file and waits for the actors to finish their round.

With several learner processes (a pod), every process runs this loop: process 0 starts the actors and picks each
round, the others train on the round it picked (each on its own share of the groups) and publish with it.

A round is the learner's unit of data: an actor with `--tasks-per-round R` and group size G writes R·G
trajectories per round, and one step trains on one round: in one batch (the batch spec's batch size R·G), or, with
`one_update_per_round`, in batches of a few groups whose gradients make one update (the spec then bounds memory).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import tqdm

from ranger_jax.data import batching, filters, pipeline, shards
from ranger_jax.parallel import host_data
from ranger_jax.rl import learner as learner_lib
from ranger_jax.rl import metrics as metrics_lib
from ranger_jax.rl import weights
from ranger_jax.rollout import sequence

log = logging.getLogger(__name__)

_ROUND = re.compile(r"-r(\d{5,})-\d+\.array_record$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GrpoLoopConfig:
    """How long the loop runs and what it accepts."""

    # rounds of actor data (one learner update each when a round fits one batch; none when nothing is trainable)
    num_steps: int
    max_staleness: int = 2  # k: trajectories sampled more than k versions ago are dropped
    poll_s: float = 0.1  # how often the shard folder is listed while waiting
    data_timeout_s: float = 600.0  # waiting this long for a round is an error (actors dead or stuck)
    publish_keep: int = 3  # weight versions kept on disk
    stop_timeout_s: float = 120.0  # how long actors get to finish their round once stopped
    # "group": one GRPO advantage per row; "prefix-tree": per token, from the group's tree of shared prefixes
    # (`grpo.prefix_tree_advantages`: only tokens where members took different ways carry a signal)
    advantages: str = "group"
    # True: all of a round's batches make one update (gradients accumulated, `Learner.accumulated_step`), so the
    # batch spec bounds the learner's memory, not the update; False: one update per batch of the round
    one_update_per_round: bool = False
    # with one update per round: groups whose rewards are all equal (advantages all zero; often most of a round)
    # go into batches of their own whose forward and backward the learner leaves out; the update is the same
    # (`Learner.accumulated_step(skip_zero_advantage=True)`; a learner with a KL term runs them all)
    skip_zero_advantage: bool = True
    # the actors split each round between them (`actor --part I/N`): a step takes round r of every actor of
    # `actor_metrics` together, once all of them have finished it (`RoundReader(split_rounds=True)`)
    split_rounds: bool = False
    # save the learner (its `checkpoint_dir`) with the loop's place in the rounds every this many rounds and after
    # the last; a loop whose learner has a checkpoint resumes from it (see `run`). None: no saves by the loop
    checkpoint_every: int | None = None

    def __post_init__(self):
        if self.advantages not in pipeline.ADVANTAGE_ESTIMATORS:
            raise ValueError(f"GrpoLoopConfig.advantages must be one of {list(pipeline.ADVANTAGE_ESTIMATORS)}; "
                             f"got {self.advantages!r}")
        if self.num_steps < 1:
            raise ValueError(f"GrpoLoopConfig.num_steps must be >= 1; got {self.num_steps}")
        if self.max_staleness < 0:
            raise ValueError(f"GrpoLoopConfig.max_staleness must be >= 0; got {self.max_staleness}")
        if self.checkpoint_every is not None and (isinstance(self.checkpoint_every, bool)
                                                  or not isinstance(self.checkpoint_every, int)
                                                  or self.checkpoint_every < 1):
            raise ValueError(f"GrpoLoopConfig.checkpoint_every must be a positive int or None; "
                             f"got {self.checkpoint_every!r}")


@dataclasses.dataclass(frozen=True)
class GrpoResult:
    """What a GRPO run did."""

    num_steps: int
    final_version: int
    wall_s: float
    idle_fraction: float  # share of the learner's wall time spent waiting for actors
    episodes: int
    episodes_per_s: float
    staleness: dict[int, int]
    dropped: dict[str, Any]
    skipped_rounds: int = 0  # rounds with no trainable row (e.g. every group's rewards equal): no update, no publish
    # rounds consumed before this call, restored with the learner's checkpoint (0: a fresh start). Wall, idle,
    # episodes, staleness and dropped rows count the whole loop: the totals saved with that checkpoint plus this
    # call's (the time and rounds of an interrupted attempt after its last checkpoint are not counted)
    resumed_rounds: int = 0


LOOP_STATE = "grpo_loop"  # the key of the loop's place in the rounds, in the data state of the learner's checkpoints


def _restore(learner: learner_lib.Learner) -> dict[str, Any] | None:
    """The loop's state saved with the learner's latest checkpoint, after restoring it; None without one.

    Raises:
        ValueError: a checkpoint that a GRPO loop did not save (naming its folder and step).
    """
    if learner.checkpoints is None or learner.checkpoints.latest_step() is None:
        return None
    data_state = learner.restore()
    if not isinstance(data_state, dict) or not isinstance(data_state.get(LOOP_STATE), dict):
        raise ValueError(f"the checkpoint of step {learner.step_count} in {learner.checkpoints.directory} was not "
                         "saved by a GRPO loop (no place in the rounds): give the GRPO learner a checkpoint_dir of "
                         "its own")
    return data_state[LOOP_STATE]


class RoundReader:
    """Finds complete rounds of actor shards in a folder, oldest first, each returned once.

    Actors append one line per finished round to their metrics file (`--metrics`, a line with "round" and
    "shards"); a round counts as complete once its line is there, whatever the number of shards it wrote. Without
    metrics files, a round is complete once the same actor has a shard of a later round.

    Actors that split each round between them (`actor --part I/N`) write parts of one round: with `split_rounds`, a
    round number is complete once every actor of `metrics_files` has finished it, and it is read as one round, the
    shards of all of them together.

    Args:
        folder: the shard folder the actors write to.
        metrics_files: actor shard prefix -> that actor's metrics JSONL.
        split_rounds: the actors of `metrics_files` play the parts of each round.

    Raises:
        ValueError: `split_rounds` without metrics files (which actors make a round must be known).
    """

    def __init__(self, folder: str | os.PathLike, metrics_files: dict[str, str | os.PathLike] | None = None, *,
                 split_rounds: bool = False):
        self.folder = Path(folder)
        self.metrics_files = {k: Path(v) for k, v in (metrics_files or {}).items()}
        if split_rounds and not self.metrics_files:
            raise ValueError("RoundReader(split_rounds=True) needs the metrics file of every actor that plays a part")
        self.split_rounds = split_rounds
        self.done: set[tuple[str, int]] = set()

    def _rounds(self) -> dict[tuple[str, int], list[Path]]:
        found: dict[tuple[str, int], list[Path]] = collections.defaultdict(list)
        if not self.folder.exists():
            return found
        for path in shards.list_shards(self.folder):
            match = _ROUND.search(path.name)
            if match is not None:
                found[(path.name[:match.start()], int(match.group(1)))].append(path)
        return found

    def _finished(self, prefix: str) -> set[int] | None:
        path = self.metrics_files.get(prefix)
        if path is None:
            return None
        if not path.exists():
            return set()
        done = set()
        for line in path.read_text("utf-8").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line being written
            if isinstance(row, dict) and isinstance(row.get("round"), int):
                done.add(row["round"])
        return done

    def next_round(self) -> list[Path] | None:
        """The shards of the oldest complete unread round, or None."""
        rounds = self._rounds()
        if self.split_rounds:
            return self._next_split_round(rounds)
        latest: dict[str, int] = {}
        for prefix, number in rounds:
            latest[prefix] = max(latest.get(prefix, -1), number)
        finished = {prefix: self._finished(prefix) for prefix in latest}
        ready = []
        for key in rounds:
            prefix, number = key
            done = finished[prefix]
            if key not in self.done and (number in done if done is not None else number < latest[prefix]):
                ready.append(key)
        if not ready:
            return None
        key = min(ready, key=lambda k: (k[1], k[0]))
        self.done.add(key)
        return sorted(rounds[key])

    def _next_split_round(self, rounds: dict[tuple[str, int], list[Path]]) -> list[Path] | None:
        """The oldest round every actor has finished, not read yet, with at least one shard (a round every actor
        stopped before writing a group is passed over)."""
        finished = [self._finished(prefix) for prefix in self.metrics_files]
        for number in sorted(set.intersection(*finished) - {read for _, read in self.done}):
            self.done.add(("", number))
            paths = sorted(path for prefix in self.metrics_files for path in rounds.get((prefix, number), []))
            if paths:
                return paths
        return None


def start_actors(commands: Sequence[Sequence[str]], log_dir: str | os.PathLike,
                 env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """Starts each actor command as a process, its stdout and stderr in `log_dir/actor-<i>.log`."""
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    procs = []
    for i, command in enumerate(commands):
        handle = open(Path(log_dir) / f"actor-{i}.log", "ab")  # noqa: SIM115 — owned by the process below
        procs.append(subprocess.Popen(list(command), stdout=handle, stderr=subprocess.STDOUT,
                                      env={**os.environ, **(env or {})}))
        handle.close()
    return procs


def clear_earlier_attempt(paths: Sequence[str | os.PathLike]) -> None:
    """Removes what an earlier attempt of a GRPO run left in its folder (published weights, actor shards, actor
    metrics) before the run starts again from its first policy: the loop recognises a finished round by its actors'
    metrics lines and reads its shards, so an earlier attempt's would be taken for this one's (or, once read as
    rounds without shards of this attempt, never waited for). Names what it removes on stderr."""
    stale = [Path(path) for path in paths if Path(path).exists()]
    if not stale:
        return
    print(f"GRPO starts again from its first policy: removing the earlier attempt's {', '.join(map(str, stale))}",
          file=sys.stderr, flush=True)
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def stop_actors(procs: Sequence[subprocess.Popen], stop_file: str | os.PathLike, timeout_s: float) -> list[int]:
    """Writes the stop file, waits for each actor, terminates those past `timeout_s`; returns their exit codes."""
    Path(stop_file).parent.mkdir(parents=True, exist_ok=True)
    Path(stop_file).touch()
    deadline = time.monotonic() + timeout_s
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.terminate()
            codes.append(proc.wait(timeout=30))
    return codes


def _check_actors(procs: Sequence[subprocess.Popen], log_dir: Path) -> None:
    for i, proc in enumerate(procs):
        code = proc.poll()
        if code not in (None, 0):
            tail = (log_dir / f"actor-{i}.log").read_text("utf-8", "replace")[-2000:]
            raise RuntimeError(f"actor {i} exited with code {code}; the end of {log_dir / f'actor-{i}.log'}:\n{tail}")


def _blank(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`batch` with every row turned into padding (row_valid 0, nothing trained): a no-op share of a global batch."""
    out = dict(batch)
    out["row_valid"] = np.zeros_like(batch["row_valid"])
    out["loss_mask"] = np.zeros_like(batch["loss_mask"])
    for key in ("advantages", "token_advantages"):
        if key in out:
            out[key] = np.zeros_like(batch[key])
    return out


def _same_count(batches: list[dict[str, np.ndarray]], paths: Sequence[Path]) -> list[dict[str, np.ndarray]]:
    """This process's batches of a round, padded with blank batches to the most any process has: every learner
    process must take the same number of steps (each step is one program over all of them).

    Raises:
        RuntimeError: this process got no batch of a round that others did (it cannot shape a blank one).
    """
    most = max(host_data.gather_json(len(batches)))
    if not most:  # nothing trainable anywhere (e.g. every group had one reward): the round is skipped
        return []
    if batches:
        return batches + [_blank(batches[-1])] * (most - len(batches))
    raise RuntimeError(f"learner process {jax.process_index()} got none of the rows of the round "
                       f"{[p.name for p in paths]} while others got {most} batches; give each round at least one GRPO "
                       "group per process")


def run(learner: learner_lib.Learner, *, shards_dir: str | os.PathLike, weights_dir: str | os.PathLike,
        spec: batching.BatchSpec, config: GrpoLoopConfig, vision: sequence.VisionSettings = sequence.VisionSettings(),
        filter_config: filters.FilterConfig = filters.FilterConfig(), tokenizer_dir: str | os.PathLike | None = None,
        actor_commands: Sequence[Sequence[str]] = (), actor_metrics: dict[str, str | os.PathLike] | None = None,
        actor_env: dict[str, str] | None = None, metrics: metrics_lib.MetricsWriter | None = None,
        progress: bool = True, after_publish: Callable[[int, Any], Any] | None = None,
        augment: Callable[[list[dict[str, Any]], np.random.Generator], list[dict[str, Any]]] | None = None
        ) -> GrpoResult:
    """Trains `learner` (objective "grpo") for `config.num_steps` rounds of actor data (see the module docstring).

    `actor_metrics` maps each actor's shard prefix to its `--metrics` file (how complete rounds are recognised);
    `actor_env` adds environment variables to the actor processes (e.g. `compilation_cache.enabled`'s).
    `after_publish(version, folder)` runs after each published version, e.g. `SGLangWeightSync.update`, which makes
    SGLang policy servers load it. `augment` transforms each group's rows before batching (one draw per group and
    round: `data.augment.TokenPermutation(per_unit=True)`).

    Resuming: a learner with a checkpoint (its `checkpoint_dir`; `config.checkpoint_every` makes the loop save one)
    is restored from the latest, with the loop's place in the rounds: the rounds it had read, and how many. The
    versions published after that checkpoint are withdrawn, its own is published again, and the loop reads on from
    the oldest round it had not read, for the rounds left of `num_steps`. Rounds read after the checkpoint are read
    again (their updates were lost), and their rows sampled by a withdrawn version are dropped (`newer` in the
    filter counts). Actors started again continue the round numbering of the shards in `shards_dir`. The result and
    the metrics rows count on from the totals saved with the checkpoint (wall, idle, episodes, staleness, filter
    counts).

    Raises:
        ValueError: a learner whose objective is not "grpo"; `checkpoint_every` for a learner without a
            checkpoint_dir; a learner checkpoint a GRPO loop did not save.
        RuntimeError: an actor process died, or no round arrived within `config.data_timeout_s`.
    """
    if learner.config.objective != "grpo":
        raise ValueError(f"grpo_loop.run needs a learner with objective 'grpo'; got {learner.config.objective!r}")
    if config.checkpoint_every is not None and learner.checkpoints is None:
        raise ValueError("GrpoLoopConfig.checkpoint_every needs a learner with a checkpoint_dir")
    weights_dir, shards_dir = Path(weights_dir), Path(shards_dir)
    stop_file = weights_dir / "STOP"
    stop_file.unlink(missing_ok=True)  # a leftover stop file would end new actors at once
    resumed = _restore(learner) or {}
    rounds_done, skipped_rounds = int(resumed.get("rounds_done", 0)), int(resumed.get("skipped_rounds", 0))
    version = learner.step_count
    if resumed:  # versions after the checkpoint came from updates that are lost; this one is published again
        weights.withdraw(weights_dir, from_version=version)
        host_data.gather_json(version)  # every process publishes once process 0 has withdrawn them
    if metrics is not None:  # an earlier attempt of this loop in the same folder: its later rows give way
        metrics.discard("grpo", after_step=version + skipped_rounds)
    published = weights.publish(learner.params_model(), weights_dir, version, tokenizer_dir=tokenizer_dir,
                                keep=config.publish_keep)
    if after_publish is not None:
        after_publish(version, published)
    log_dir = weights_dir.parent / "actor_logs"
    lead = jax.process_index() == 0  # with several learner processes, process 0 runs the actors and picks rounds
    procs = start_actors(actor_commands, log_dir, actor_env) if lead else []
    reader = RoundReader(shards_dir, actor_metrics, split_rounds=config.split_rounds)
    reader.done = {(str(prefix), int(number)) for prefix, number in resumed.get("rounds_read", ())}
    stats = filters.FilterStats.from_dict(resumed["dropped"]) if "dropped" in resumed else filters.FilterStats()
    staleness: collections.Counter[int] = collections.Counter(
        {int(k): int(v) for k, v in resumed.get("staleness", {}).items()})
    before = resumed.get("totals", {})  # the rounds before the checkpoint: wall and idle seconds, episodes
    wall_before, idle, episodes = (float(before.get("wall_s", 0.0)), float(before.get("idle_s", 0.0)),
                                   int(before.get("episodes", 0)))
    started, saved_at = time.monotonic() - wall_before, learner.step_count if resumed else None
    current = {"version": version}
    rules = dataclasses.replace(filter_config, max_staleness=config.max_staleness,
                                current_version=lambda: current["version"])
    skip = config.one_update_per_round and config.skip_zero_advantage
    bar = tqdm.tqdm(total=config.num_steps, initial=min(rounds_done, config.num_steps), desc="grpo", unit="step",
                    disable=not progress)
    try:
        for _ in range(rounds_done, config.num_steps):
            waited = time.monotonic()
            paths = None
            while lead and (paths := reader.next_round()) is None:
                _check_actors(procs, log_dir)
                if time.monotonic() - waited > config.data_timeout_s:
                    raise RuntimeError(f"no complete round of shards in {shards_dir} after "
                                       f"{config.data_timeout_s:.0f} s")
                time.sleep(config.poll_s)
            # every process trains on the round process 0 chose (a shared folder may show rounds at different times)
            paths = [Path(p) for p in host_data.gather_json([str(p) for p in paths or []])[0]]
            idle += time.monotonic() - waited
            source = shards.TrajectorySource(paths)
            records = [source[i] for i in range(len(source))]
            # rows of a withdrawn version (an earlier attempt's, after its checkpoint) are dropped by the filter, and
            # left out of the round's reward, spread and staleness; episodes/s counts every row the actors played
            kept = [r for r in records if not rules.is_newer(r.policy_version, current["version"])]
            rewards = np.array([r.reward for r in kept], np.float32)
            versions = [r.policy_version for r in kept]
            staleness.update(metrics_lib.staleness_histogram(current["version"], versions))
            by_group: dict[str, list[float]] = collections.defaultdict(list)
            for r in kept:
                by_group[r.group_id].append(r.reward)
            zero_var = float(np.mean([np.ptp(v) < 1e-6 for v in by_group.values()])) if by_group else 0.0
            dataset = pipeline.trajectory_dataset(source, spec=spec, vision=vision, config=rules, stats=stats,
                                                  grpo_groups=True, num_epochs=1, augment=augment,
                                                  advantages=config.advantages,
                                                  seed=learner.step_count + skipped_rounds,
                                                  zero_advantage_apart=skip)
            step_metrics: dict[str, float] = {}
            batches = _same_count(list(dataset), paths)
            if config.one_update_per_round and batches:
                step_metrics = learner.accumulated_step(batches, skip_zero_advantage=skip)
            else:
                for batch in batches:
                    step_metrics = learner.step(batch)
            episodes += len(records)
            if learner.step_count != current["version"]:  # a round with nothing to train publishes nothing new
                current["version"] = learner.step_count
                published = weights.publish(learner.params_model(), weights_dir, current["version"],
                                            tokenizer_dir=tokenizer_dir, keep=config.publish_keep)
                if after_publish is not None:
                    after_publish(current["version"], published)
            else:
                skipped_rounds += 1
            elapsed = time.monotonic() - started
            reward_mean = float(rewards.mean()) if len(rewards) else None
            row = {**{f"grpo/{k}": v for k, v in step_metrics.items()}, "grpo/reward_mean": reward_mean,
                   "grpo/zero_variance_share": zero_var, "grpo/episodes_per_s": episodes / elapsed,
                   "grpo/idle_fraction": idle / elapsed, "grpo/version": current["version"],
                   "grpo/skipped_rounds": skipped_rounds,
                   "grpo/mean_staleness": (float(np.mean([current["version"] - 1 - v for v in versions]))
                                           if versions else None)}
            if metrics is not None:
                metrics.write(learner.step_count + skipped_rounds, row)
            rounds_done += 1
            every = config.checkpoint_every
            if every and (rounds_done % every == 0 or rounds_done == config.num_steps) \
                    and learner.step_count != saved_at:  # a round without an update has nothing new to save
                learner.save(data_state={LOOP_STATE: {
                    "rounds_done": rounds_done, "skipped_rounds": skipped_rounds,
                    "rounds_read": sorted([prefix, number] for prefix, number in reader.done),
                    "totals": {"wall_s": time.monotonic() - started, "idle_s": idle, "episodes": episodes},
                    "staleness": {str(k): v for k, v in sorted(staleness.items())}, "dropped": stats.as_dict()}},
                    force=True)
                saved_at = learner.step_count
            bar.update(1)
            bar.set_postfix(reward="-" if reward_mean is None else f"{reward_mean:.3f}", idle=f"{idle / elapsed:.2f}")
    finally:
        bar.close()
        codes = stop_actors(procs, stop_file, config.stop_timeout_s)
        if any(code != 0 for code in codes):
            log.warning("actors exited with codes %s (logs in %s)", codes, log_dir)
    wall = time.monotonic() - started
    return GrpoResult(num_steps=config.num_steps, final_version=current["version"], wall_s=wall,
                      idle_fraction=idle / wall if wall > 0 else 0.0, episodes=episodes,
                      episodes_per_s=episodes / wall if wall > 0 else 0.0,
                      staleness=dict(sorted(staleness.items())), dropped=stats.as_dict(),
                      skipped_rounds=skipped_rounds, resumed_rounds=int(resumed.get("rounds_done", 0)))
