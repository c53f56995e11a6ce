"""The policy side of an eval: one episode per item, with the references it chose kept in the item's folder.

An `Agent` runs an item as an environment task through `rollout.episode.run_episode` (any policy backend: the
in-process JAX sampler, an SGLang server, the OpenAI-compatible harness, a scripted agent). The episode's scorer
is the eval itself: while the environment's image store still holds the episode's images, `copy_references`
copies each reference the answer cites into the item folder — a crop together with the image it was cut from and
its box, for the gallery — and the benchmark's generation and judging run on those copies. The episode is saved
as a trajectory record next to them.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from ranger_jax import fileio
from ranger_jax.data import trajectory as trajectory_lib
from ranger_jax.env import core, tool_env
from ranger_jax.evals import items as items_lib
from ranger_jax.evals import store
from ranger_jax.processing import chat as chat_lib
from ranger_jax.rewards import text_reward
from ranger_jax.rollout import episode as episode_lib
from ranger_jax.rollout import policy as policy_lib
from ranger_jax.rollout import runner


@dataclasses.dataclass(frozen=True)
class AgentResult:
    """What the policy handed over for one item.

    Attributes:
        termination: how the episode ended.
        answer: the parsed answer, None when there is none.
        references: one JSON-ready dict per cited reference, in answer order: `img_id`, `note`, `file` (relative to
            the item folder; None when the image is unknown or gone), `url`, `page_url`, `title`, `width`,
            `height`, and `crop` (`root_id`, `root_file`, `box` [x0, y0, x1, y1] in the root image's pixels,
            `root_width`, `root_height`) for a crop, else None.
        answer_text: the answer as judges read it (gen_prompt and references with their titles and pages).
        num_turns / num_tool_calls: the episode's counts.
    """

    termination: str | None
    answer: core.Answer | None
    references: tuple[Mapping[str, Any], ...]
    answer_text: str
    num_turns: int
    num_tool_calls: int

    def reference_files(self, folder: Path) -> list[Path]:
        """The files of the references that have one, in answer order."""
        return [folder / ref["file"] for ref in self.references if ref.get("file")]

    def to_dict(self) -> dict[str, Any]:
        """The record's `agent` entry."""
        return {"termination": self.termination, "num_turns": self.num_turns, "num_tool_calls": self.num_tool_calls,
                "gen_prompt": self.answer.gen_prompt if self.answer is not None else None,
                "references": [dict(ref) for ref in self.references]}


def _copy(record: core.ImageRecord, folder: Path) -> str | None:
    """Copies an image file under `refs/` (named by its img_id); its relative path, or None when it is gone."""
    if not os.path.isfile(record.path):
        return None
    name = f"{store.REFS_DIR}/{items_lib.file_stem(record.img_id)}{Path(record.path).suffix.lower() or '.png'}"
    (folder / store.REFS_DIR).mkdir(exist_ok=True)
    shutil.copyfile(record.path, folder / name)
    return name


def _root_of(record: core.ImageRecord, images: Mapping[str, core.ImageRecord]) -> core.ImageRecord | None:
    return next((r for r in images.values() if r.parent_id is None and r.root_url == record.root_url), None)


def copy_references(state: tool_env.EnvState, folder: Path) -> tuple[dict[str, Any], ...]:
    """The answer's references as record entries (see `AgentResult.references`), their files copied to `folder`."""
    if state.answer is None:
        return ()
    out = []
    for ref in state.answer.reference_images:
        entry: dict[str, Any] = {"img_id": ref.img_id, "note": ref.note, "file": None, "crop": None}
        record = state.images.get(ref.img_id)
        if record is not None:
            entry.update(file=_copy(record, folder), url=record.url, page_url=record.page_url, title=record.title,
                         width=record.width, height=record.height)
            root = _root_of(record, state.images) if record.parent_id is not None else None
            if root is not None and record.root_box is not None:
                entry["crop"] = {"root_id": root.img_id, "root_file": _copy(root, folder),
                                 "box": [float(v) for v in record.root_box], "root_width": root.width,
                                 "root_height": root.height}
        out.append(entry)
    return tuple(out)


def agent_result(state: tool_env.EnvState, folder: Path) -> AgentResult:
    """The `AgentResult` of a finished episode, its references copied to `folder`."""
    answer_text = ""
    if state.answer is not None:
        answer_text = text_reward.render_answer(state.answer, text_reward.image_facts(state.images))
    return AgentResult(termination=state.termination, answer=state.answer,
                       references=copy_references(state, folder), answer_text=answer_text,
                       num_turns=state.num_turns, num_tool_calls=state.num_tool_calls)


Finish = Callable[[AgentResult], Awaitable[core.Score]]


class _Scorer:
    """The episode's scorer: hands the finished episode to the eval's `finish` while its images exist."""

    def __init__(self, folder: Path, finish: Finish):
        self.folder, self.finish = folder, finish
        self.result: AgentResult | None = None

    async def ascore(self, env: tool_env.ToolEnv, state: tool_env.EnvState) -> core.Score:
        self.result = agent_result(state, self.folder)
        return await self.finish(self.result)


class Agent:
    """A policy in an environment, run once per item (greedy by default, as evaluations are).

    Args:
        env: the tool environment (its own reward is not used: the benchmark judges).
        policy: any `rollout.policy.Policy` backend.
        renderer: the policy model's chat renderer.
        episode: token budgets, sampling and observation image settings.
        seed: base seed of the episodes' sampling seeds.
    """

    def __init__(self, env: tool_env.ToolEnv, policy: policy_lib.Policy, renderer: chat_lib.ChatRenderer, *,
                 episode: episode_lib.EpisodeConfig, seed: int = 0):
        self.env, self.policy, self.renderer, self.episode, self.seed = env, policy, renderer, episode, seed
        self.cache = episode_lib.EpisodeCache()

    @property
    def name(self) -> str:
        """The policy's label."""
        return self.policy.name

    async def arun(self, item: items_lib.Item, index: int, folder: Path, finish: Finish
                   ) -> tuple[AgentResult, trajectory_lib.Trajectory]:
        """Runs the item's episode; `finish(result)` generates and judges and returns the episode's score.

        The trajectory is written to `folder/trajectory.rjt`. Policy failures end the episode (termination
        `error`, the message in `trajectory.metadata["error"]`); they do not raise.
        """
        task = item.task()
        spec = episode_lib.EpisodeSpec(task=task, group_id=runner.group_id("eval", index, task), sample_index=0,
                                       seed=runner.episode_seed(self.seed, index, 0))
        scorer = _Scorer(folder, finish)
        trajectory = await episode_lib.run_episode(self.env, self.policy, spec, renderer=self.renderer,
                                                   config=self.episode, scorer=scorer, cache=self.cache)
        fileio.write_atomic(folder / store.TRAJECTORY_FILE, trajectory.to_bytes())
        assert scorer.result is not None  # run_episode always scores a finished episode
        return scorer.result, trajectory

    async def aclose(self) -> None:
        """Closes the policy's connections (the env is closed by its owner)."""
        await self.policy.aclose()
