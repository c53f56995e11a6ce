"""A whole data-generation run, live or offline: prompts → teacher trajectories → ground truth → splits.

    config = pipeline.RunConfig(out=Path("runs/d1"), world=Path("worlds/w7"), tokenizer=Path("tok"))  # offline
    summary = pipeline.run(config)                      # or run(config, stages=("synthesize",))
    print(pipeline.describe_plan(pipeline.plan(config)))  # what --dry-run prints: the stages and their calls

A run is offline when it names a `world` (the offline world's news, the template writer, the exact filter and
judges, the scripted expert as teacher, the compositor as generator; no network) and live otherwise (the services
of `services`: Serper, an LLM writer, a VLM judge, a teacher model, an image generator). The stages, in order:

1. `synthesize`: news-driven prompts (`synthesis`) and, when categories or questions are given, category-driven
   ones (`categories`); offline runs also measure the filter (`filter_check`: the naive agent's search score on
   the prompts it kept and on those it dropped);
2. `teacher`: teacher episodes on the prompts, kept when the search judge passes them (`teacher`);
3. `groundtruth`: ground-truth images and quality filtering (`groundtruth`);
4. `splits`: benchmark, RL and SFT datasets (`splits`).

Every stage resumes (finished items are skipped), every call is recorded (`<run>/calls/`), `accounting.json` holds
requests, tokens and cost per stage and service, and `report.json` / `report.md` the kept and dropped counts per
reason per stage plus the measured figures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ranger_jax import env as env_lib
from ranger_jax.clients import compositor
from ranger_jax.datagen import (calls, categories, confusion, extract, groundtruth, ledger, news, records, services,
                                splits, stages, synthesis, taxonomy, teacher, world_tasks)
from ranger_jax.env import core
from ranger_jax.env import tool_env as tool_env_lib
from ranger_jax.env.backends import offline
from ranger_jax.env.sim import agents, savanna
from ranger_jax.env.sim import world as world_lib
from ranger_jax.env.sim.detector import OracleDetector
from ranger_jax.processing import chat
from ranger_jax.processing import tokenizer as tokenizer_lib
from ranger_jax.rollout import actor, episode, harness, scoring
from ranger_jax.rollout import policy as policy_lib

STAGES = ("synthesize", "teacher", "groundtruth", "splits")
OFFLINE_ENV = "savanna_sim"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything a run decides (see the module docstring)."""

    out: Path  # the run's folder
    world: Path | None = None  # offline: the world; None: a live run
    services: Mapping[str, services.ServiceSpec] = dataclasses.field(default_factory=dict)  # live services
    allow_hosts: tuple[str, ...] = ()  # downloads the URL guard allows to loopback hosts (tests only)
    env: str = "savanna_live"  # live: the teacher's environment (name or file); offline runs use savanna_sim
    env_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # overrides of the env's settings
    # news-driven synthesis
    news: bool = True
    end: dt.date | None = None  # last news day; None: the world's today (offline) or today (live)
    num_days: int = 7
    subcategories: tuple[str, ...] | None = None  # None: all
    headlines_per_query: int = 10
    rule: confusion.CrowdRule = confusion.CrowdRule()
    image_fallback: bool = True
    # category-driven synthesis
    categories: tuple[str, ...] = ()
    calls_per_category: int = 2
    prompts_per_call: int = 5
    questions: Path | None = None  # JSON lines of {"id", "question", "answer"[, "category"]}
    # teacher
    tokenizer: Path | None = None  # the policy model's tokenizer (needed from the teacher stage on)
    teacher_policy: str = "expert"  # offline: expert; live: harness (the [teacher] service), sglang or jax
    teacher_url: str | None = None  # sglang: the server
    teacher_checkpoint: str | None = None  # jax: the checkpoint
    episode: episode.EpisodeConfig = episode.EpisodeConfig()
    teacher_batch: int = 32
    # ground truth, splits
    quality: groundtruth.QualityRule = groundtruth.QualityRule()
    split: splits.SplitConfig = splits.SplitConfig()
    concurrency: int = 8
    seed: int = 0
    progress: bool = True

    @property
    def offline(self) -> bool:
        """Whether the run is in the offline world."""
        return self.world is not None


def _subcategories(config: RunConfig) -> tuple[taxonomy.Subcategory, ...]:
    table = taxonomy.world_meta_queries() if config.offline else taxonomy.SAVANNA_META_QUERIES
    return taxonomy.select(table, list(config.subcategories) if config.subcategories else None)


def _end(config: RunConfig) -> dt.date:
    if config.end is not None:
        return config.end
    return dt.date.fromisoformat(world_lib.read_meta(config.world)["today"]) if config.offline else dt.date.today()


def _news_config(config: RunConfig) -> synthesis.NewsConfig:
    return synthesis.NewsConfig(end=_end(config), num_days=config.num_days,
                                headlines_per_query=config.headlines_per_query, rule=config.rule,
                                image_fallback=config.image_fallback, concurrency=config.concurrency)


def _category_config(config: RunConfig) -> categories.CategoryConfig:
    return categories.CategoryConfig(today=_end(config), categories=config.categories,
                                     calls_per_category=config.calls_per_category,
                                     prompts_per_call=config.prompts_per_call, concurrency=config.concurrency)


def _questions(config: RunConfig, the_world: world_lib.World | None) -> list[dict[str, Any]]:
    if config.questions is not None:
        return ledger.read_jsonl(config.questions)
    if the_world is None or not config.categories:
        return []
    return [q for q in categories.world_questions(the_world) if q["category"] in config.categories]


def plan(config: RunConfig) -> dict[str, Any]:
    """What the run will do: per stage, the calls it makes (exact or bounds) and what earlier runs finished."""
    stage_dir = config.out / synthesis.STAGE_DIR
    done = {p.stem: len(ledger.Ledger(p)) for p in sorted(stage_dir.glob("*.jsonl"))} if stage_dir.is_dir() else {}
    out: dict[str, Any] = {"mode": "offline" if config.offline else "live", "out": str(config.out),
                           "world": str(config.world) if config.world else None, "finished_items": done,
                           "services": {r: str(s.url) for r, s in config.services.items()}, "stages": {}}
    if config.news:
        subs = _subcategories(config)
        for stage, calls_ in synthesis.plan(_news_config(config), subs, offline=config.offline,
                                            stage_dir=stage_dir).items():
            out["stages"][stage] = calls_
        out["news_queries"] = len(synthesis.queries(_news_config(config), subs))
    if config.categories or config.questions:
        num_questions = len(ledger.read_jsonl(config.questions)) if config.questions else 0
        out["stages"].update(categories.plan(_category_config(config), num_questions, offline=config.offline,
                                             stage_dir=stage_dir))
    prompts = sum(len(ledger.read_jsonl(config.out / name)) for name in (synthesis.PROMPTS_FILE,
                                                                          categories.PROMPTS_FILE)
                  if (config.out / name).is_file())
    taught = ledger.Ledger(stage_dir / "teacher.jsonl") if (stage_dir / "teacher.jsonl").is_file() else None
    scored = len(ledger.Ledger(stage_dir / "groundtruth.jsonl")) if (stage_dir / "groundtruth.jsonl").is_file() else 0
    episodes = max(0, prompts - (len(taught) if taught else 0)) if prompts else "one per kept prompt"
    out["stages"]["teacher"] = {f"{config.teacher_policy} episodes at most": episodes,
                                "search judge calls": "none (exact)" if config.offline else "one per answer"}
    generations = max(0, len(taught.kept()) - scored) if taught is not None else "one per kept trajectory"
    out["stages"]["groundtruth"] = {"generator calls": generations,
                                    "judge calls": "none (exact)" if config.offline else "one per generated image"}
    out["stages"]["splits"] = dataclasses.asdict(config.split)
    return out


def describe_plan(the_plan: Mapping[str, Any]) -> str:
    """The plan as the lines `--dry-run` prints."""
    lines = [f"datagen {the_plan['mode']} run into {the_plan['out']}"]
    if the_plan.get("world"):
        lines.append(f"  world: {the_plan['world']}")
    for role, url in the_plan["services"].items():
        lines.append(f"  service {role}: {url}")
    if the_plan.get("news_queries") is not None:
        lines.append(f"  news searches: {the_plan['news_queries']} (meta queries x days)")
    for stage, calls_ in the_plan["stages"].items():
        lines.append(f"  {stage}: " + ", ".join(f"{k} {v}" for k, v in calls_.items()))
    if the_plan["finished_items"]:
        lines.append("  already finished: " + ", ".join(f"{k} {v}" for k, v in the_plan["finished_items"].items()))
    return "\n".join(lines)


class _Run:
    """The objects one run shares: recorder, report, services or world."""

    def __init__(self, config: RunConfig):
        self.config = config
        config.out.mkdir(parents=True, exist_ok=True)
        prices = {role: spec.price for role, spec in config.services.items()}
        self.recorder = calls.Recorder(config.out, prices)
        self.report = stages.Report(config.out / "report.json")
        self.report.load()  # stages not run this time keep their last counts
        self.services = services.Services(config.services, self.recorder, cache_dir=config.out / "cache",
                                          allow_hosts=config.allow_hosts)
        self.backend = offline.OfflineBackend(config.world) if config.offline else None
        self.world = self.backend.world if self.backend is not None else None

    def toolkit(self) -> synthesis.Toolkit:
        if self.backend is not None:
            return synthesis.Toolkit(news.WorldNews(self.backend, self.recorder),
                                     extract.TemplateRequestWriter(self.world, self.recorder, today=_end(self.config)),
                                     confusion.ExactConfusion(self.backend, self.recorder, self.config.rule))
        fetcher = self.services.fetcher("extract_image")
        writer = extract.LLMRequestWriter(self.services.chat("llm", "extract"), today=_end(self.config),
                                          fetch_image=lambda url: fetcher.image(url))
        judge_fetcher = self.services.fetcher("confusion")
        return synthesis.Toolkit(news.SerperNews(self.services.serper("news")), writer,
                                 confusion.JudgeConfusion(self.services.serper("confusion"), judge_fetcher.image,
                                                          self.services.chat("judge", "confusion"), self.config.rule))

    def category_writer(self) -> Any:
        if self.world is not None:
            return categories.TemplateCategoryWriter(self.world, today=_end(self.config))
        return categories.LLMCategoryWriter(self.services.chat("llm", "category"), today=_end(self.config),
                                            qa_client=self.services.chat("llm", "qa"))

    def prompts(self) -> list[records.Prompt]:
        out = []
        for name in (synthesis.PROMPTS_FILE, categories.PROMPTS_FILE):
            path = self.config.out / name
            if path.is_file():
                out += [records.Prompt.from_record(r) for r in ledger.read_jsonl(path)]
        return out


def filter_check(run: _Run) -> dict[str, Any]:
    """Offline: the naive agent's search score on the prompts the confusion filter kept and on those it dropped."""
    kept, dropped = [], []
    for stage in ("extract", "extract_image"):
        written = ledger.Ledger(run.config.out / synthesis.STAGE_DIR / f"{stage}.jsonl")
        verdicts = ledger.Ledger(run.config.out / synthesis.STAGE_DIR /
                                 ("confusion.jsonl" if stage == "extract" else "confusion_image.jsonl"))
        for entry in written.kept():
            prompt = records.Prompt.from_record(entry.record["prompt"])
            verdict = verdicts.get(prompt.id)
            if verdict is not None:
                (kept if verdict.status == "kept" else dropped).append(prompt)
    figures: dict[str, Any] = {}
    for name, group in (("kept", kept), ("dropped", dropped)):
        rows = []
        for prompt in group:
            try:
                rows.append(world_tasks.task_row(run.world, prompt))
            except world_tasks.NoGroundTruth:
                continue
        figures[f"filter_{name}_prompts"] = len(rows)
        if rows:
            view = world_tasks.write_world_view(run.world.root, run.config.out / "filter_check" / name, rows)
            figures[f"naive_search_score_{name}"] = savanna.evaluate(view, "naive")["search_score"]
    return figures


async def _synthesize(run: _Run) -> None:
    config = run.config
    if config.news:
        await synthesis.synthesize(config.out, _news_config(config), _subcategories(config), run.toolkit(),
                                   run.report, progress=config.progress)
    if config.categories or config.questions:
        await categories.synthesize(config.out, _category_config(config), run.category_writer(), run.report,
                                    questions=_questions(config, run.world), progress=config.progress)
    if run.world is not None and config.news:
        run.report.add_figures(**filter_check(run))


def _tasks(run: _Run, prompts: Sequence[records.Prompt]) -> tuple[list[core.Task], Path | None]:
    """The prompts as tasks: offline as a world of their own (`<run>/prompts_world`), live with their metadata."""
    if run.world is None:
        return [core.Task(p.id, p.prompt, metadata={"today": p.today, **p.meta()}) for p in prompts], None
    rows, missing = [], 0
    for prompt in prompts:
        try:
            rows.append(world_tasks.task_row(run.world, prompt))
        except world_tasks.NoGroundTruth:
            missing += 1
    run.report.add_counts("tasks", {"ground_truth": len(rows)}, {"no_ground_truth": missing} if missing else {})
    view = world_tasks.write_world_view(run.world.root, run.config.out / "prompts_world", rows)
    return world_lib.load_tasks(view), view


def _teacher_policy(run: _Run, tool_env: env_lib.ToolEnv, tokenizer: Any) -> policy_lib.Policy:
    config = run.config
    if config.teacher_policy == "harness" and run.world is None:
        model = run.services.spec("teacher").model
        return harness.HarnessPolicy(run.services.chat("teacher", "teacher"), tokenizer,
                                     tools=tool_env.tool_schemas(), name=f"harness:{model}")
    options = actor.PolicyOptions(tokenizer=tokenizer, env=tool_env, world=run.world, sglang_url=config.teacher_url,
                                  checkpoint=config.teacher_checkpoint)
    if config.teacher_policy == "expert" and run.world is not None:
        return policy_lib.ScriptedPolicy(agents.ExpertAgent(OracleDetector(run.world)), tokenizer, name="expert")
    return actor.build_policy(config.teacher_policy, options)


async def _teacher(run: _Run) -> None:
    config = run.config
    if config.tokenizer is None:
        raise ValueError("the teacher stage needs the policy model's tokenizer (RunConfig.tokenizer / --tokenizer)")
    tokenizer = tokenizer_lib.load_tokenizer(config.tokenizer)
    renderer = chat.ChatRenderer(tokenizer, merge_size=config.episode.vision.merge_size)
    prompts = run.prompts()
    tasks, view = _tasks(run, prompts)
    name = OFFLINE_ENV if view is not None else config.env
    options = {**({"world": str(view)} if view is not None else {}), **config.env_options}
    with env_lib.make(name, **options) as made:
        search, fetch = ("world", "world") if view is not None else ("serper", "web")
        backend = services.RecordingBackend(made.backend, run.recorder, stage="teacher", search_service=search,
                                            fetch_service=fetch)
        with tool_env_lib.ToolEnv(backend, made.config, rewards=made.rewards) as tool_env:
            await _roll_teacher(run, tool_env, tasks, prompts, view is not None, tokenizer, renderer)


async def _roll_teacher(run: _Run, tool_env: tool_env_lib.ToolEnv, tasks: list[core.Task],
                        prompts: list[records.Prompt], exact: bool, tokenizer: Any, renderer: chat.ChatRenderer
                        ) -> None:
    """The teacher stage inside its environment (whose backend records every search and fetch)."""
    config = run.config
    if exact:
        scorer, judge = scoring.make_scorer(tool_env, generate_images=False), teacher.ExactSearchJudge()
    else:
        scorer = None
        judge = teacher.LiveSearchJudge(run.services.chat("judge", "teacher"), {p.id: p.target for p in prompts})
    policy = _teacher_policy(run, tool_env, tokenizer)
    settings = teacher.TeacherConfig(batch_size=config.teacher_batch, concurrency=config.concurrency,
                                     seed=config.seed, episode=config.episode)
    await teacher.run_teacher(config.out, tool_env, policy, tasks, renderer=renderer, judge=judge, config=settings,
                              scorer=scorer, report=run.report, progress=config.progress)


async def _groundtruth(run: _Run) -> None:
    config = run.config
    prompts = {p.id: p for p in run.prompts()}
    kept = teacher.kept_trajectories(config.out)
    samples = [(prompts[i], t) for i, t in kept.items() if i in prompts]
    if run.world is not None:
        generator = services.RecordingGenerator(compositor.CompositorGenerator(), run.recorder, stage="groundtruth")
        quality: Any = groundtruth.ExactQuality(confusion.ExactConfusion(run.backend, run.recorder, config.rule))
    else:
        generator = run.services.generator("groundtruth")
        quality = groundtruth.JudgeQuality(run.services.chat("judge", "groundtruth"))
    await groundtruth.run_groundtruth(config.out, samples, generator=generator, quality=quality, rule=config.quality,
                                      seed=config.seed, concurrency=config.concurrency, report=run.report,
                                      progress=config.progress)


def _splits(run: _Run) -> None:
    config = run.config
    prompts = {p.id: p for p in run.prompts()}
    kept = teacher.kept_trajectories(config.out)
    gt = ledger.Ledger(config.out / "stages" / "groundtruth.jsonl")
    samples = [splits.Sample(prompts[e.key], config.out / e.record["image"], kept[e.key]) for e in gt.kept()
               if e.key in prompts and e.key in kept]
    summary = splits.write_splits(config.out, samples, config.split, world=run.world)
    run.report.add_figures(**{f"split_{k}": v for k, v in summary["sizes"].items()})


async def arun(config: RunConfig, stages_to_run: Sequence[str] = STAGES) -> dict[str, Any]:
    """Runs the named stages in order (module docstring); returns the run's report (also in `report.json`).

    Raises:
        ValueError: an unknown stage name, or a stage without what it needs (a tokenizer, a service).
    """
    unknown = [s for s in stages_to_run if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stages {unknown}; known stages: {list(STAGES)}")
    run = _Run(config)
    try:
        for stage in STAGES:
            if stage not in stages_to_run:
                continue
            if stage == "synthesize":
                await _synthesize(run)
            elif stage == "teacher":
                await _teacher(run)
            elif stage == "groundtruth":
                await _groundtruth(run)
            else:
                _splits(run)
            run.report.write()
            run.recorder.save()
    finally:
        await run.services.aclose()
        run.report.write()
        run.recorder.save()
    return {**run.report.to_dict(), "accounting": run.recorder.usage()}


def run(config: RunConfig, stages_to_run: Sequence[str] = STAGES) -> dict[str, Any]:
    """Sync twin of `arun` (must not be called from a running event loop)."""
    return asyncio.run(arun(config, stages_to_run))
