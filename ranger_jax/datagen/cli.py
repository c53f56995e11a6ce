"""The data-generation command line (`recipes/datagen.py`, `python -m ranger_jax.datagen.cli`).

    datagen.py [STAGE ...] --out RUN --world WORLD --tokenizer TOK           # offline, every stage
    datagen.py synthesize --out RUN --services services.toml --days 1        # live prompts only
    datagen.py teacher groundtruth splits --out RUN --services services.toml --tokenizer TOK --teacher harness
    datagen.py --out RUN --services services.toml --dry-run                  # the plan and its call counts

Stages: `synthesize`, `teacher`, `groundtruth`, `splits` (all of them when none is named). A run with `--world` is
offline; with `--services` (the TOML file of `datagen.services`) it is live. Rerunning the same command resumes.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ranger_jax.datagen import confusion, groundtruth, pipeline, services, splits, taxonomy
from ranger_jax.rollout import episode, sequence


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--env-option takes KEY=VALUE (VALUE as JSON or a plain string), "
                                         f"got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def parser() -> argparse.ArgumentParser:
    """The argument parser."""
    p = argparse.ArgumentParser(prog="datagen", description=__doc__.split("\n", 1)[0])
    p.add_argument("stages", nargs="*", metavar="STAGE",
                   help=f"stages to run, in order (default: all of {', '.join(pipeline.STAGES)})")
    p.add_argument("--out", required=True, type=Path, help="the run's folder (rerun to resume)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--world", type=Path, help="offline run in this world (built by env.sim.build)")
    source.add_argument("--services", type=Path, help="live run with the services of this TOML file")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its call counts, call nothing")
    p.add_argument("--env", default="savanna_live", help="live teacher environment (name or file)")
    p.add_argument("--env-option", action="append", type=_option, default=[], metavar="KEY=VALUE",
                   help="override an environment setting (repeatable)")
    p.add_argument("--allow-host", action="append", default=[], metavar="HOST:PORT",
                   help="let downloads reach this loopback host (tests only; repeatable)")
    news = p.add_argument_group("news-driven synthesis")
    news.add_argument("--no-news", action="store_true", help="skip news-driven prompts")
    news.add_argument("--end", type=dt.date.fromisoformat, help="last news day, YYYY-MM-DD (default: today / the "
                                                                 "world's today)")
    news.add_argument("--days", type=int, default=7, help="days of news")
    news.add_argument("--subcategories", type=_csv, help="comma-separated subcategory names (default: all)")
    news.add_argument("--headlines-per-query", type=int, default=10)
    news.add_argument("--top-k", type=int, default=confusion.CrowdRule.top_k, help="image results the filter reads")
    news.add_argument("--min-confusable", type=int, default=confusion.CrowdRule.min_confusable)
    news.add_argument("--ratio", type=float, default=confusion.CrowdRule.ratio,
                      help="confusable results needed per clean target result")
    news.add_argument("--no-image-fallback", action="store_true", help="no image-oriented targets for easy requests")
    cats = p.add_argument_group("category-driven synthesis")
    cats.add_argument("--categories", type=_csv, default=(),
                      help="comma-separated Gen-Searcher categories, or 'all' (default: none)")
    cats.add_argument("--calls-per-category", type=int, default=2)
    cats.add_argument("--prompts-per-call", type=int, default=5)
    cats.add_argument("--questions", type=Path, help="JSON lines of {id, question, answer[, category]} to convert")
    t = p.add_argument_group("teacher")
    t.add_argument("--tokenizer", type=Path, help="the policy model's tokenizer folder")
    t.add_argument("--teacher", default=None, help="expert (offline default), harness (live default), sglang, jax")
    t.add_argument("--teacher-url", help="sglang: the server's URL")
    t.add_argument("--teacher-checkpoint", help="jax: the checkpoint folder")
    t.add_argument("--teacher-batch", type=int, default=32, help="episodes per shard")
    t.add_argument("--max-new-tokens", type=int, default=episode.GEN_SEARCHER_MAX_NEW_TOKENS)
    t.add_argument("--max-context-tokens", type=int, default=episode.GEN_SEARCHER_MAX_CONTEXT)
    t.add_argument("--min-pixels", type=int, default=sequence.VisionSettings.min_pixels)
    t.add_argument("--max-pixels", type=int, default=sequence.VisionSettings.max_pixels)
    g = p.add_argument_group("ground truth and splits")
    g.add_argument("--max-tokens", type=int, default=groundtruth.SFT_CUTOFF_TOKENS,
                   help="drop trajectories longer than this (the SFT cut-off)")
    g.add_argument("--benchmark-size", type=int, default=splits.SplitConfig.benchmark_size)
    g.add_argument("--rl-fraction", type=float, default=splits.SplitConfig.rl_fraction)
    p.add_argument("--concurrency", type=int, default=8, help="items in flight per stage")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def config_from_args(args: argparse.Namespace) -> pipeline.RunConfig:
    """The RunConfig the parsed arguments describe.

    Raises:
        ValueError / FileNotFoundError: a bad value or a missing file, naming it.
    """
    offline = args.world is not None
    categories = taxonomy.GEN_SEARCHER_CATEGORIES if args.categories == ("all",) else tuple(args.categories)
    unknown = [c for c in categories if c not in taxonomy.GEN_SEARCHER_CATEGORIES]
    if unknown:
        raise ValueError(f"unknown categories {unknown}; Gen-Searcher's are {list(taxonomy.GEN_SEARCHER_CATEGORIES)}")
    vision = dataclasses.replace(sequence.VisionSettings(), min_pixels=args.min_pixels, max_pixels=args.max_pixels)
    return pipeline.RunConfig(
        out=args.out, world=args.world,
        services=services.load_services(args.services) if args.services is not None else {},
        allow_hosts=tuple(args.allow_host), env=args.env, env_options=dict(args.env_option),
        news=not args.no_news, end=args.end, num_days=args.days, subcategories=args.subcategories,
        headlines_per_query=args.headlines_per_query,
        rule=confusion.CrowdRule(top_k=args.top_k, min_confusable=args.min_confusable, ratio=args.ratio),
        image_fallback=not args.no_image_fallback, categories=categories,
        calls_per_category=args.calls_per_category, prompts_per_call=args.prompts_per_call, questions=args.questions,
        tokenizer=args.tokenizer, teacher_policy=args.teacher or ("expert" if offline else "harness"),
        teacher_url=args.teacher_url, teacher_checkpoint=args.teacher_checkpoint,
        episode=episode.EpisodeConfig(max_new_tokens=args.max_new_tokens, max_context_tokens=args.max_context_tokens,
                                      vision=vision),
        teacher_batch=args.teacher_batch, quality=groundtruth.QualityRule(max_tokens=args.max_tokens),
        split=splits.SplitConfig(benchmark_size=args.benchmark_size, rl_fraction=args.rl_fraction, seed=args.seed),
        concurrency=args.concurrency, seed=args.seed, progress=not args.quiet)


def main(argv: Sequence[str] | None = None) -> int:
    """Parses `argv`, prints the plan (`--dry-run`) or runs the stages and prints the report; returns 0."""
    p = parser()
    args = p.parse_args(argv)
    unknown = [s for s in args.stages if s not in pipeline.STAGES]
    if unknown:
        p.error(f"unknown stages {unknown}; choose from {list(pipeline.STAGES)}")
    try:
        config = config_from_args(args)
    except (ValueError, FileNotFoundError) as err:
        p.error(str(err))
    print(pipeline.describe_plan(pipeline.plan(config)))
    if args.dry_run:
        return 0
    summary = pipeline.run(config, tuple(args.stages) or pipeline.STAGES)
    print((config.out / "report.md").read_text("utf-8"), end="")
    print(f"cost: ${summary['accounting']['total_cost_usd']:.4f}; report: {config.out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
