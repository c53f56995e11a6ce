"""Savanna-style evaluation in the offline world: run an agent on every task and score it exactly.

`evaluate(world_dir, agent)` runs each task through a `ToolEnv` on the world's `OfflineBackend` and returns a
JSON-ready summary: the search score (pass rate, 0–1) overall, per domain and per subcategory, mean crop IoU,
text score and reward, termination counts, tool-call counts and one row per episode. An agent is a built-in name
(`POLICIES`: the scripted `expert` (oracle perception), `pixel_expert` (the same expert perceiving only through
`find_object`), `finder` (the compact page-reading teacher), the one-pass baselines `snippet` (a look copied from
search snippets, found by colour) and `caption` (the best-captioned picture), and `naive`), a callable
`act(state) -> assistant_text`, or an object with such an `act` method; it sees only the episode state, as a model
would.

Each episode's `reward` is `ToolEnv.score(state)`, the number RL trains on; the search pass, crop IoU and text
score are the exact judgement of its answer (`rewards.score`, with the env's criteria), the Savanna metrics.
`episode_row` builds one row from any finished state, so token-level policies run by the rollout loop
(`ranger_jax.rollout.evaluate`) report the same rows. `evals/savanna_sim.py` is the command-line front end.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tqdm

from ranger_jax import env
from ranger_jax.env import core, tools
from ranger_jax.env.sim import agents, finder_agent, rewards, world
from ranger_jax.env.sim.detector import OracleDetector

POLICIES: dict[str, Callable[[world.World], agents.Policy]] = {
    "expert": lambda w: agents.ExpertAgent(OracleDetector(w)),
    "naive": lambda w: agents.NaiveAgent(),
    "finder": lambda w: finder_agent.FinderAgent(),
    "pixel_expert": lambda w: finder_agent.PixelExpertAgent(),
    "caption": lambda w: agents.CaptionAgent(),
    "snippet": lambda w: finder_agent.SnippetAgent(),
}
# Env options a built-in agent needs (under the caller's options): these perceive through find_object.
POLICY_ENV: dict[str, Mapping[str, Any]] = {name: {"tools": tools.ALL_TOOL_NAMES}
                                            for name in ("finder", "pixel_expert", "snippet")}

Agent = agents.Policy | Callable[[Any], str]
RESPONSE_CHARS = 500  # characters of the last assistant turn kept in a report row


def make_policy(name: str, the_world: world.World) -> agents.Policy:
    """The scripted policy called `name`.

    Raises:
        ValueError: naming the policy and the known ones.
    """
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known policies: {sorted(POLICIES)}")
    return POLICIES[name](the_world)


class _Act:
    """A bare `act(state) -> str` callable as an agent."""

    def __init__(self, act: Callable[[Any], str]):
        self.act = act


def resolve_agent(agent: str | Agent, the_world: world.World) -> tuple[str, agents.Policy]:
    """(report name, agent with `act`) for a built-in name, an object with `act`, or a callable.

    Raises:
        ValueError: an unknown built-in name.
        TypeError: anything else, naming its type.
    """
    if isinstance(agent, str):
        return agent, make_policy(agent, the_world)
    if callable(getattr(agent, "act", None)):
        return type(agent).__name__, agent
    if callable(agent):
        return getattr(agent, "__name__", type(agent).__name__), _Act(agent)
    raise TypeError(f"an agent is a built-in name {sorted(POLICIES)}, a callable act(state) -> str, or an object "
                    f"with such an act method; got {type(agent).__name__}")


@dataclasses.dataclass(frozen=True)
class Episode:
    """One scored episode: the env's score and the exact judgement of its answer."""

    task_id: str
    domain: str
    subcategory: str
    termination: str | None
    num_turns: int
    num_tool_calls: int
    judgement: rewards.SimScore
    score: core.Score
    last_response: str = ""

    def row(self) -> dict[str, Any]:
        """The episode as one flat report row (scores rounded to 4 places)."""
        j = self.judgement
        return {"task_id": self.task_id, "domain": self.domain, "subcategory": self.subcategory,
                "termination": self.termination, "num_turns": self.num_turns, "num_tool_calls": self.num_tool_calls,
                "search_pass": j.search_pass, "crop_iou": round(j.crop_iou, 4), "text_score": round(j.text_score, 4),
                "search_reason": j.reason, "reward": round(self.score.reward, 4), "reason": self.score.reason,
                "zero_reason": self.score.zero_reason, "last_response": self.last_response}


def episode_row(tool_env: env.ToolEnv, state: Any, score: core.Score) -> Episode:
    """The report record of one finished episode of an offline-world env, given its `tool_env.score(state)`.

    Raises:
        ValueError: the env's backend holds no offline world.
    """
    the_world = getattr(tool_env.backend, "world", None)
    if not isinstance(the_world, world.World):
        raise ValueError(f"savanna evaluation needs the offline backend; got {type(tool_env.backend).__name__}")
    task = state.task
    judgement = rewards.score(the_world, task, state.answer, state.images,
                              criteria=rewards.Criteria.from_settings(tool_env.rewards))
    return Episode(task_id=task.id, domain=task.metadata["domain"], subcategory=task.metadata["subcategory"],
                   termination=state.termination, num_turns=state.num_turns, num_tool_calls=state.num_tool_calls,
                   judgement=judgement, score=score, last_response=(state.last_response or "")[:RESPONSE_CHARS])


def _mean(values: list[float]) -> float:
    return round(statistics.fmean(values), 4) if values else 0.0


def summarize(episodes: list[Episode]) -> dict[str, Any]:
    """Aggregates episodes: search score overall / per domain / per subcategory, means and counts."""

    def passes(group: list[Episode]) -> float:
        return _mean([float(e.judgement.search_pass) for e in group])

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
        "crop_iou_mean": _mean([e.judgement.crop_iou for e in episodes]),
        "text_score_mean": _mean([e.judgement.text_score for e in episodes]),
        "reward_mean": _mean([e.score.reward for e in episodes]),
        "tool_calls_mean": _mean([float(e.num_tool_calls) for e in episodes]),
        "terminations": dict(sorted(collections.Counter(str(e.termination) for e in episodes).items())),
    }


def check_limit(limit: int | None) -> None:
    """Raises ValueError unless `limit` is None or a positive number of tasks."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive number of tasks or None; got {limit!r}")


def report(policy: str, world_dir: str | Path, the_world: world.World, episodes: list[Episode]) -> dict[str, Any]:
    """The JSON-ready result: run facts, `summarize(episodes)` and one row per episode."""
    return {"policy": policy, "world": str(world_dir), "seed": the_world.seed, "today": the_world.today.isoformat(),
            **summarize(episodes), "episodes": [e.row() for e in episodes]}


def evaluate(world_dir: str | Path, policy: str | Agent, *, env_name: str = "offline", limit: int | None = None,
             progress: bool = False, **env_options: Any) -> dict[str, Any]:
    """Runs an agent on the world's tasks and returns the summary plus per-episode rows.

    Args:
        world_dir: a world built by `ranger_jax.env.sim.build`.
        policy: a key of POLICIES, a callable `act(state) -> str`, or an object with that `act` method.
        env_name: "offline", a shipped environment such as `"savanna_sim"`, or an environment file.
        limit: run only the first `limit` tasks.
        progress: show a tqdm bar with the running search score.
        **env_options: passed to `env.make` (e.g. `max_turns=5`), over a built-in agent's own (`POLICY_ENV`).

    Raises:
        ValueError: an unknown policy name, or a `limit` below 1.
        TypeError: `policy` is none of the three kinds of agent.
    """
    check_limit(limit)
    the_world = world.load_world(world_dir)
    tasks = world.load_tasks(world_dir)[:limit]
    name, agent = resolve_agent(policy, the_world)
    options = {**(POLICY_ENV.get(policy, {}) if isinstance(policy, str) else {}), **env_options}
    episodes: list[Episode] = []
    with env.make(env_name, world=str(world_dir), **options) as tool_env:
        bar = tqdm.tqdm(tasks, desc=f"savanna-sim {name}", disable=not progress)
        for task in bar:
            state = agents.run_episode(tool_env, task, agent)
            episodes.append(episode_row(tool_env, state, tool_env.score(state)))
            bar.set_postfix(search=f"{sum(e.judgement.search_pass for e in episodes) / len(episodes):.3f}")
    return report(name, world_dir, the_world, episodes)
