"""The resumable eval loop: for each item, the policy's episode (if any), one generation, the benchmark's judge.

    records = run(benchmark, items, RunStore(out), generator=generator, agent=agent, config=RunConfig())

Per item, in its own folder (`evals.store`): the agent's episode and the references it chose, then the generator:

- an answer with a `gen_prompt` and at least one reference file → `gen_prompt` with the item's input images and
  the references (the generator keeps its first few, Gen-Searcher: 3);
- no policy (the generator-alone baseline) → the item's prompt (+ the benchmark's `t2i_suffix`) with its input
  images;
- an answer without references, or none at all → the same, as Gen-Searcher's eval falls back to text-to-image on
  the original prompt (`RunConfig.fallback`; without it the item fails at the policy stage).

Prompts without any image go to `t2i_generator` when one is given (Gen-Searcher's edit service cannot draw without
a reference). Then the benchmark judges the item, and its record is written: the item is finished, and a rerun
skips it. A failed stage (generation, judge, an unexpected error) is recorded with its reason and counted the way
the benchmark's published scorer counts it (`Benchmark.summarize`); `RunConfig.retry_failed` reruns such items.
The generator's seed is pinned (Gen-Searcher: 0), judges run at temperature 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tqdm

from ranger_jax import fileio
from ranger_jax.clients import images as images_lib
from ranger_jax.env import core
from ranger_jax.evals import agent as agent_lib
from ranger_jax.evals import base
from ranger_jax.evals import items as items_lib
from ranger_jax.evals import store as store_lib

log = logging.getLogger(__name__)

GENERATOR_SEED = 0  # Gen-Searcher pins seed 0 for every generation


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """How a run proceeds."""

    concurrency: int = 4  # items in flight at once
    seed: int = GENERATOR_SEED  # the generator's seed for every item
    fallback: bool = True  # an item without a usable answer is drawn from its prompt (Gen-Searcher's eval)
    retry_failed: bool = False  # rerun items whose record says a stage failed
    progress: bool = False  # tqdm bar

    def __post_init__(self):
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"RunConfig.concurrency must be a positive int; got {self.concurrency!r}")


def _generation_plan(item: items_lib.Item, result: agent_lib.AgentResult | None, folder: Path,
                     benchmark: base.Benchmark, fallback: bool) -> tuple[str | None, str, list[str]]:
    """(source, prompt, references) of the item's generation; source None means nothing is generated."""
    inputs = list(item.inputs)
    prompt_only = item.prompt + benchmark.t2i_suffix
    if result is None:
        return "prompt", prompt_only, inputs
    files = [str(path) for path in result.reference_files(folder)]
    if result.answer is not None and result.answer.gen_prompt.strip() and files:
        return "answer", result.answer.gen_prompt, inputs + files
    if fallback:
        return "fallback", prompt_only, inputs
    return None, "", []


class _Item:
    """One item's pipeline and the record it builds."""

    def __init__(self, runner: "Runner", item: items_lib.Item, index: int):
        self.runner, self.item, self.index = runner, item, index
        self.folder = runner.store.partial(item.id)
        self.record: dict[str, Any] = {
            "id": item.id, "index": index, "benchmark": runner.benchmark.name, "prompt": item.prompt,
            "category": item.category, "subcategory": item.subcategory, "ground_truth": list(item.ground_truth),
            "inputs": list(item.inputs), "agent": None, "generation": None, "image": None, "judge": {},
            "scores": {}, "failure": None}

    def fail(self, stage: str, reason: str) -> None:
        if self.record["failure"] is None:
            self.record["failure"] = {"stage": stage, "reason": reason}

    async def generate(self, result: agent_lib.AgentResult | None) -> images_lib.GenerationResult | None:
        runner = self.runner
        source, prompt, references = _generation_plan(self.item, result, self.folder, runner.benchmark,
                                                      runner.config.fallback)
        if source is None:
            termination = result.termination if result is not None else None
            self.fail("policy", f"no answer with references (termination {termination!r}) and no fallback")
            return None
        generator = runner.t2i_generator if not references and runner.t2i_generator is not None \
            else runner.generator
        generation = await generator.agenerate(prompt, references, seed=runner.config.seed)
        self.record["generation"] = {
            "source": source, "prompt": prompt, "references": [str(Path(r).name) for r in references],
            "ok": generation.ok, "error": generation.error, "latency_s": round(generation.latency_s, 6),
            "request": dict(generation.request)}
        if generation.ok and generation.image is not None:
            fileio.write_atomic(self.folder / store_lib.IMAGE_FILE, generation.image)
            self.record["image"] = store_lib.IMAGE_FILE
        else:
            self.fail("generation", generation.error or "the generator returned no image")
        return generation

    async def finish(self, result: agent_lib.AgentResult | None) -> core.Score:
        """Generation and judging (the episode's scorer when there is a policy)."""
        generation = await self.generate(result)
        image = generation.image if generation is not None and generation.ok else None
        judged = await self.runner.benchmark.ajudge(self.item, image, result, self.folder)
        self.record["judge"], self.record["scores"] = dict(judged.judge), dict(judged.scores)
        if judged.error is not None:
            self.fail("judge", judged.error)
        return core.Score(reward=float(judged.reward), reason=judged.error, breakdown=dict(judged.scores),
                          generation=generation)

    async def run(self) -> dict[str, Any]:
        started = time.monotonic()
        try:
            if self.runner.agent is None:
                await self.finish(None)
            else:
                result, trajectory = await self.runner.agent.arun(self.item, self.index, self.folder, self.finish)
                self.record["agent"] = {**result.to_dict(), "policy": self.runner.agent.name,
                                        "error": trajectory.metadata.get("error"),
                                        "trajectory": store_lib.TRAJECTORY_FILE}
        except Exception as err:  # noqa: BLE001 — one broken item must not end a long run; it is recorded
            log.exception("eval item %s failed", self.item.id)
            self.fail("error", f"{type(err).__name__}: {err}")
        self.record["wall_s"] = round(time.monotonic() - started, 6)
        self.runner.store.commit(self.item.id, self.record)
        return self.record


class Runner:
    """Runs a benchmark's items into a run folder (see the module docstring).

    Args:
        benchmark: the benchmark adapter (judges and scoring).
        run_store: the run folder.
        generator: the image generator (references go to its edit endpoint).
        t2i_generator: the generator for prompts without any image (None: `generator`).
        agent: the policy in its environment; None evaluates the generator alone.
        config: concurrency, seed, fallback, retries.
    """

    def __init__(self, benchmark: base.Benchmark, run_store: store_lib.RunStore, *,
                 generator: images_lib.Generator, t2i_generator: images_lib.Generator | None = None,
                 agent: agent_lib.Agent | None = None, config: RunConfig = RunConfig()):
        self.benchmark, self.store, self.generator, self.t2i_generator = benchmark, run_store, generator, t2i_generator
        self.agent, self.config = agent, config

    def pending(self, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]]
                ) -> list[tuple[int, items_lib.Item]]:
        """(index, item) of the items still to run: not finished, or failed when retrying failures."""
        def done(item: items_lib.Item) -> bool:
            record = records.get(item.id)
            return record is not None and not (self.config.retry_failed and record.get("failure"))
        return [(index, item) for index, item in enumerate(items) if not done(item)]

    async def arun(self, items: Sequence[items_lib.Item],
                   on_record: Callable[[Mapping[str, Any]], None] | None = None) -> dict[str, dict[str, Any]]:
        """Runs every pending item, at most `config.concurrency` at once; returns all finished records by id.

        `on_record(record)` is called after each item is committed (an exception from it stops the run; items in
        flight are cancelled and leave no record).
        """
        records = self.store.records()
        todo = self.pending(items, records)
        slots = asyncio.Semaphore(self.config.concurrency)

        async def one(index: int, item: items_lib.Item) -> dict[str, Any]:
            async with slots:
                return await _Item(self, item, index).run()

        bar = tqdm.tqdm(total=len(items), initial=len(items) - len(todo), desc=f"eval {self.benchmark.name}",
                        unit="item", disable=not self.config.progress)
        futures = [asyncio.ensure_future(one(index, item)) for index, item in todo]
        try:
            with bar:
                for future in asyncio.as_completed(futures):
                    record = await future
                    records[record["id"]] = record
                    bar.update(1)
                    bar.set_postfix(failed=sum(bool(r.get("failure")) for r in records.values()))
                    if on_record is not None:
                        on_record(record)
        finally:
            for future in futures:
                future.cancel()
            await asyncio.gather(*futures, return_exceptions=True)
        return records

    def run(self, items: Sequence[items_lib.Item],
            on_record: Callable[[Mapping[str, Any]], None] | None = None) -> dict[str, dict[str, Any]]:
        """Sync twin of `arun` (must not be called from a running event loop)."""
        return asyncio.run(self.arun(items, on_record))
