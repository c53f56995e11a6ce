"""Teacher trajectories with rejection: run a strong policy on the prompts, keep what passes the search judge.

The teacher is any rollout policy (`rollout.policy.Policy`): the offline world's scripted Locate–Corroborate–Isolate
expert (`policy.ScriptedPolicy`), a frontier model through the OpenAI-compatible harness (`rollout.harness`), an
SGLang server or a checkpoint (`rollout.actor.build_policy`). Episodes run through the rollout loop
(`rollout.runner`), so every trajectory is recorded token-exactly as the learner reads it. A trajectory is kept
when its references pass the search judge:

- `ExactSearchJudge` (offline): the exact judgement the env's reward already computed (`breakdown.search_pass`);
- `LiveSearchJudge` (live): the Savanna search judge (`rewards.savanna.SearchJudge`, a VLM) over the references the
  answer cites, with the prompt's target described.

Tasks run in batches; each batch's kept trajectories become one shard (`teacher-<batch>.array_record`, published
atomically), and only then is every task of the batch written to the stage's ledger (kept with its shard, or dropped
with the reason: `search_failed`, `no_references`, or `terminated_<why>`). A rerun skips finished tasks; a shard
that no ledger entry names (a run killed between the two writes) is deleted first, so no trajectory is kept twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tqdm

from ranger_jax.data import shards, trajectory
from ranger_jax.datagen import ledger as ledger_lib
from ranger_jax.datagen import stages
from ranger_jax.env import core, tool_env
from ranger_jax.processing import chat
from ranger_jax.rewards import savanna
from ranger_jax.rollout import episode, runner
from ranger_jax.rollout import policy as policy_lib

SHARD_PREFIX = "teacher"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherConfig:
    """How teacher episodes run."""

    batch_size: int = 32  # tasks per batch, and so at most this many trajectories per shard
    concurrency: int = 8  # episodes in flight
    seed: int = 0
    episode: episode.EpisodeConfig = episode.EpisodeConfig()

    def __post_init__(self):
        for name in ("batch_size", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TeacherConfig.{name} must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether a teacher trajectory is kept, why, and what the judge said (JSON)."""

    passed: bool
    reason: str
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def _unanswered(traj: trajectory.Trajectory) -> Verdict | None:
    """A dropping verdict for an episode without an answer (`terminated_<why>`) or without references."""
    if traj.answer is None:
        return Verdict(False, f"terminated_{traj.termination}" if traj.termination else "no_answer")
    if not traj.answer.reference_images:
        return Verdict(False, "no_references")
    return None


class ExactSearchJudge:
    """The offline world's exact search judgement, read from the trajectory's reward breakdown."""

    async def judge(self, traj: trajectory.Trajectory, task: core.Task) -> Verdict:
        """Kept when the env's exact judgement says the references show the target and no sibling."""
        unanswered = _unanswered(traj)
        if unanswered is not None:
            return unanswered
        breakdown = dict(traj.reward_breakdown.get("breakdown") or {})
        if "search_pass" not in breakdown:
            raise ValueError(f"trajectory of task {task.id!r} has no exact search judgement in its reward breakdown; "
                             "score teacher episodes with the offline env's reward")
        passed = bool(breakdown["search_pass"])
        return Verdict(passed, "search_pass" if passed else "search_failed",
                       {"sim_reason": breakdown.get("sim_reason"), "crop_iou": breakdown.get("crop_iou")})


class LiveSearchJudge:
    """The Savanna search judge over the cited references (see the module docstring).

    Args:
        client: the judge's chat client (a `services.RecordingChat` of the teacher stage).
        targets: task id -> the target in words (the prompt's `target`).
    """

    def __init__(self, client: Any, targets: Mapping[str, str]):
        self.search = savanna.SearchJudge(client)
        self.targets = dict(targets)

    async def judge(self, traj: trajectory.Trajectory, task: core.Task) -> Verdict:
        """The VLM's pass/fail on the answer's references. Raises judge.JudgeError."""
        unanswered = _unanswered(traj)
        if unanswered is not None:
            return unanswered
        pictures = {image.img_id: image.png for image in traj.images if image.img_id}
        cited = {ref.img_id: pictures[ref.img_id] for ref in traj.answer.reference_images if ref.img_id in pictures}
        if not cited:
            return Verdict(False, "no_answer", {"problem": "the answer cites no image the episode showed"})
        answer_text = traj.answer.gen_prompt
        verdict = await asyncio.to_thread(self.search.judge_search, task.prompt, self.targets.get(task.id, ""),
                                          cited, answer_text=answer_text)
        value = verdict.value
        return Verdict(value.passed, "search_pass" if value.passed else "search_failed",
                       {"rationale": value.rationale, "matching_reference": value.matching_reference})


def shard_dir(run_dir: str | Path) -> Path:
    """Where the teacher's shards go."""
    return Path(run_dir) / "teacher" / "shards"


def _shard_name(batch: int) -> str:
    return f"{SHARD_PREFIX}-{batch:05d}{shards.SHARD_SUFFIX}"


def _clean_orphans(folder: Path, ledger: ledger_lib.Ledger) -> int:
    """Deletes shards no ledger entry names; returns the next batch number."""
    named = {e.record.get("shard") for e in ledger.entries() if e.record.get("shard")}
    batches = {int(e.record["batch"]) for e in ledger.entries() if "batch" in e.record}
    for path in shards.list_shards(folder) if folder.is_dir() else []:
        if path.name not in named:
            path.unlink()
    return max(batches, default=-1) + 1


async def run_teacher(run_dir: str | Path, env: tool_env.ToolEnv, policy: policy_lib.Policy,
                      tasks: Sequence[core.Task], *, renderer: chat.ChatRenderer, judge: Any,
                      config: TeacherConfig = TeacherConfig(), scorer: episode.Scorer | None = None,
                      report: stages.Report | None = None, progress: bool = True) -> ledger_lib.Ledger:
    """Rolls the teacher out on every unfinished task and keeps what the judge passes (module docstring).

    Args:
        run_dir: the run's folder (`stages/teacher.jsonl`, `teacher/shards/`).
        env: the environment the teacher acts in.
        policy: the teacher.
        tasks: the prompts as tasks (ids unique).
        renderer: the policy model's chat renderer.
        judge: `ExactSearchJudge` or `LiveSearchJudge` (anything with `async judge(traj, task) -> Verdict`).
        config: batch size, concurrency, seed and episode limits.
        scorer: the env's scorer (offline: `rollout.scoring.make_scorer(env, generate_images=False)`, whose exact
            judgement `ExactSearchJudge` reads); None records no reward.
        report: where the stage's counts go.
        progress: show a progress bar.

    Returns:
        The stage's ledger (task id -> kept with its shard, or dropped with the reason).
    """
    run_dir = Path(run_dir)
    ledger = ledger_lib.Ledger(run_dir / "stages" / "teacher.jsonl")
    folder = shard_dir(run_dir)
    batch = _clean_orphans(folder, ledger)
    todo = [t for t in tasks if not ledger.done(t.id)]
    stats = stages.StageStats(skipped=len(tasks) - len(todo))
    kept_count = 0
    bar = tqdm.tqdm(total=len(todo), desc="teacher", unit="episode", disable=not progress or not todo)
    try:
        for start in range(0, len(todo), config.batch_size):
            chunk = todo[start:start + config.batch_size]
            rollout = runner.RolloutConfig(concurrency=config.concurrency, seed=config.seed + batch,
                                           run_id=f"teacher{batch:05d}", episode=config.episode)
            groups = await runner.arun(env, policy, chunk, renderer=renderer, config=rollout, scorer=scorer)
            by_task = {g.task_id: g.trajectories[0] for g in groups}
            verdicts = {}
            for task in chunk:
                traj = by_task[task.id]
                try:
                    verdicts[task.id] = await judge.judge(traj, task)
                except stages.RETRYABLE_FAILURES as err:
                    stats.failed += 1
                    stats.errors.append(f"{task.id}: {type(err).__name__}: {err}")
            kept = [dataclasses.replace(by_task[t.id], metadata={**by_task[t.id].metadata, "teacher_verdict": dict(
                verdicts[t.id].details)}) for t in chunk if t.id in verdicts and verdicts[t.id].passed]
            name = _shard_name(batch)
            if kept:
                shards.write_shard(folder / name, kept, overwrite=True)
            for task in chunk:
                if task.id not in verdicts:
                    continue
                verdict = verdicts[task.id]
                record = {"batch": batch, "shard": name if verdict.passed else None, "reward": by_task[task.id].reward,
                          "termination": by_task[task.id].termination, "details": dict(verdict.details)}
                ledger.add(task.id, "kept" if verdict.passed else "dropped", verdict.reason, record)
            kept_count += len(kept)
            stats.finished += len(verdicts)
            bar.update(len(chunk))
            bar.set_postfix(kept=kept_count)
            batch += 1
    finally:
        bar.close()
    if report is not None:
        report.add_ledger("teacher", ledger, stats)
    return ledger


def kept_trajectories(run_dir: str | Path) -> dict[str, trajectory.Trajectory]:
    """The kept teacher trajectories by task id (read from the shards the ledger names)."""
    ledger = ledger_lib.Ledger(Path(run_dir) / "stages" / "teacher.jsonl")
    wanted = {e.key for e in ledger.kept()}
    out = {}
    folder = shard_dir(run_dir)
    for path in shards.list_shards(folder) if folder.is_dir() else []:
        for traj in shards.read_shard(path):
            if traj.task_id in wanted:
                out[traj.task_id] = traj
    return out
