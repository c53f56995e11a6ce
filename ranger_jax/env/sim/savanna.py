"""Savanna-style evaluation in the offline world: run a policy on every task and score it exactly.

`evaluate(world_dir, "expert")` runs each task through a `ToolEnv` on the world's `OfflineBackend`, scores the
final answer with `rewards.score`, and returns a JSON-ready summary: the search score (pass rate, 0–1)
overall, per domain and per subcategory, mean crop IoU, text score and reward, termination counts, tool-call
counts and one row per episode. `evals/savanna_sim.py` is the command-line front end.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tqdm

from ranger_jax import env
from ranger_jax.env.sim import agents, rewards, world
from ranger_jax.env.sim.detector import OracleDetector

POLICIES: dict[str, Callable[[world.World], agents.Policy]] = {
    "expert": lambda w: agents.ExpertAgent(OracleDetector(w)),
    "naive": lambda w: agents.NaiveAgent(),
}


def make_policy(name: str, the_world: world.World) -> agents.Policy:
    """The scripted policy called `name`.

    Raises:
        ValueError: naming the policy and the known ones.
    """
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known policies: {sorted(POLICIES)}")
    return POLICIES[name](the_world)


@dataclasses.dataclass(frozen=True)
class Episode:
    """One scored episode."""

    task_id: str
    domain: str
    subcategory: str
    termination: str | None
    num_turns: int
    num_tool_calls: int
    score: rewards.SimScore

    def row(self) -> dict[str, Any]:
        """The episode as one flat report row (scores rounded to 4 places)."""
        s = self.score
        return {"task_id": self.task_id, "domain": self.domain, "subcategory": self.subcategory,
                "termination": self.termination, "num_turns": self.num_turns, "num_tool_calls": self.num_tool_calls,
                "search_pass": s.search_pass, "crop_iou": round(s.crop_iou, 4), "text_score": round(s.text_score, 4),
                "reward": round(s.reward, 4), "reason": s.reason}


def _mean(values: list[float]) -> float:
    return round(statistics.fmean(values), 4) if values else 0.0


def summarize(episodes: list[Episode]) -> dict[str, Any]:
    """Aggregates episodes: search score overall / per domain / per subcategory, means and counts."""

    def passes(group: list[Episode]) -> float:
        return _mean([float(e.score.search_pass) for e in group])

    by_domain, by_sub = collections.defaultdict(list), collections.defaultdict(list)
    for e in episodes:
        by_domain[e.domain].append(e)
        by_sub[e.subcategory].append(e)
    return {
        "num_tasks": len(episodes),
        "search_score": passes(episodes),
        "search_score_by_domain": {d: passes(g) for d, g in sorted(by_domain.items())},
        "search_score_by_subcategory": {s: passes(g) for s, g in sorted(by_sub.items())},
        "num_tasks_by_domain": {d: len(g) for d, g in sorted(by_domain.items())},
        "crop_iou_mean": _mean([e.score.crop_iou for e in episodes]),
        "text_score_mean": _mean([e.score.text_score for e in episodes]),
        "reward_mean": _mean([e.score.reward for e in episodes]),
        "tool_calls_mean": _mean([float(e.num_tool_calls) for e in episodes]),
        "terminations": dict(sorted(collections.Counter(str(e.termination) for e in episodes).items())),
    }


def evaluate(world_dir: str | Path, policy: str, *, env_name: str = "offline", limit: int | None = None,
             progress: bool = False, **env_options: Any) -> dict[str, Any]:
    """Runs `policy` on the world's tasks and returns the summary plus per-episode rows.

    Args:
        world_dir: a world built by `ranger_jax.env.sim.build`.
        policy: a key of POLICIES.
        env_name: "offline" or an environment file such as `envs/savanna_sim.toml`.
        limit: run only the first `limit` tasks.
        progress: show a tqdm bar with the running search score.
        **env_options: passed to `env.make` (e.g. `max_turns=5`).

    Raises:
        ValueError: an unknown policy, or a `limit` below 1.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive number of tasks or None; got {limit!r}")
    the_world = world.load_world(world_dir)
    tasks = world.load_tasks(world_dir)[:limit]
    agent = make_policy(policy, the_world)
    episodes: list[Episode] = []
    with env.make(env_name, world=str(world_dir), **env_options) as tool_env:
        bar = tqdm.tqdm(tasks, desc=f"savanna-sim {policy}", disable=not progress)
        for task in bar:
            state = agents.run_episode(tool_env, task, agent)
            score = rewards.score(the_world, task, state.answer, state.images)
            episodes.append(Episode(task_id=task.id, domain=task.metadata["domain"],
                                    subcategory=task.metadata["subcategory"], termination=state.termination,
                                    num_turns=state.num_turns, num_tool_calls=state.num_tool_calls, score=score))
            bar.set_postfix(search=f"{sum(e.score.search_pass for e in episodes) / len(episodes):.3f}")
    return {"policy": policy, "world": str(world_dir), "seed": the_world.seed, "today": the_world.today.isoformat(),
            **summarize(episodes), "episodes": [e.row() for e in episodes]}
