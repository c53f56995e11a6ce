"""The command line shared by the eval scripts (`evals/knowgen.py`, `savanna.py`, `mind_bench.py`, `wise.py`).

    python evals/knowgen.py --bench KnowGen-Bench.json --out runs/knowgen-qwen-image \\
        --generator-url http://10.0.0.8:30010 --judge-url https://api.openai.com/v1
    python evals/knowgen.py --bench KnowGen-Bench.json --out runs/knowgen-ranger --policy sglang \\
        --sglang-url http://10.0.0.5:30000 --tokenizer /ckpt/ranger-8b --generator-kind gen_searcher \\
        --generator-url http://10.0.0.8:8001 --t2i-generator-url http://10.0.0.9:30010 \\
        --judge-url https://api.openai.com/v1

Policies: `none` (the generator alone), `jax` (a ranger_jax checkpoint through the JAX sampler), `sglang` (an
SGLang server), `harness` (an OpenAI-compatible model with tool calling), and the offline world's scripted `expert`
/ `naive`. A policy acts in `--env` (default: the benchmark's live environment; each service reads its own key).
Generator and judge are options (`--generator-*`, `--judge-*`; keys from the variables `--*-api-key-env` name).
Before the run every remote service is checked (`rollout.preflight`) unless `--no-preflight`.

The run folder is resumable: rerun the same command to finish an interrupted run (`--retry-failed` also redoes
items whose generation or judge failed); `--report-only` rebuilds the reports from what is there.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ranger_jax import env as env_lib
from ranger_jax.clients import chat
from ranger_jax.clients import images as images_lib
from ranger_jax.evals import agent as agent_lib
from ranger_jax.evals import base, knowgen, mind_bench, report, runner, savanna, store, wise
from ranger_jax.evals import items as items_lib
from ranger_jax.rewards import env_reward
from ranger_jax.rollout import preflight

POLICIES = ("none", "jax", "sglang", "harness", "expert", "naive")
DEFAULT_KEY_ENV = "OPENAI_API_KEY"


@dataclasses.dataclass(frozen=True)
class Spec:
    """How one benchmark is read and judged from the command line."""

    name: str
    description: str
    env: str  # the environment a policy acts in by default
    judge_model: str  # the published judge
    load: Callable[[argparse.Namespace], list[items_lib.Item]]
    make: Callable[[chat.ChatClient | None, argparse.Namespace], base.Benchmark]  # None: reports only
    t2i_suffix: str = ""  # appended to prompts drawn without references, unless --t2i-suffix says otherwise


SPECS = {
    knowgen.NAME: Spec(
        knowgen.NAME, "KnowGen-Bench (Gen-Searcher): K-Score as KnowGen_Eval computes it", "knowgen_live", "gpt-4.1",
        lambda a: knowgen.load_items(a.bench[0]),
        lambda c, a: knowgen.KnowGen(c, prompt_path=a.judge_prompt, t2i_suffix=a.t2i_suffix), knowgen.T2I_SUFFIX),
    savanna.NAME: Spec(
        savanna.NAME, "Savanna (Ranger): search and generation scores by domain (unofficial judges)",
        "savanna_live", "gpt-4.1", lambda a: savanna.load_items(a.bench[0]),
        lambda c, a: savanna.Savanna(c, search_prompt=a.judge_prompt, generation_prompt=a.generation_judge_prompt,
                                     t2i_suffix=a.t2i_suffix)),
    mind_bench.NAME: Spec(
        mind_bench.NAME, "Mind-Bench (Mind-Brush): all-checks pass rate", "knowgen_live", "gemini-3-pro-preview",
        lambda a: mind_bench.load_items(a.bench[0], reference_root=a.reference_root, image_root=a.image_root),
        lambda c, a: mind_bench.MindBench(c, prompt_path=a.judge_prompt, t2i_suffix=a.t2i_suffix)),
    wise.NAME: Spec(
        wise.NAME, "WISE: WiScore by category", "knowgen_live", "gpt-4o-2024-05-13", lambda a: wise.load_items(a.bench),
        lambda c, a: wise.Wise(c, prompt_path=a.judge_prompt, t2i_suffix=a.t2i_suffix)),
}


def build_parser(spec: Spec) -> argparse.ArgumentParser:
    """The argument parser of one benchmark's script."""
    p = argparse.ArgumentParser(prog=f"evals/{spec.name}.py", description=spec.description,
                                epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", required=True, nargs="+" if spec.name == wise.NAME else 1,
                   help="the benchmark file" + ("s (the three WISE prompt files)" if spec.name == wise.NAME else ""))
    p.add_argument("--out", required=True, help="the run folder (resumed when it exists)")
    p.add_argument("--label", help="the run's name in tables (default: policy + generator)")
    p.add_argument("--limit", type=int, help="only the first N items")
    if spec.name == mind_bench.NAME:
        p.add_argument("--reference-root", help="folder of the World_Knowledge images (default: the bench folder)")
        p.add_argument("--image-root", help="folder of the Image_Name input images (default: the bench folder)")
    pol = p.add_argument_group("policy")
    pol.add_argument("--policy", default="none", choices=POLICIES)
    pol.add_argument("--env", default=spec.env, help="environment the policy acts in (a shipped name or a .toml)")
    pol.add_argument("--world", help="offline world folder (offline environments and the scripted policies)")
    pol.add_argument("--checkpoint", help="jax: an HF-layout Qwen3-VL checkpoint (also the default tokenizer)")
    pol.add_argument("--tokenizer", help="folder with tokenizer.json (default: --checkpoint, else the Qwen3 one)")
    pol.add_argument("--sglang-url", help="sglang: the server root")
    pol.add_argument("--chat-url", help="harness: OpenAI-compatible base URL incl. /v1")
    pol.add_argument("--chat-model", help="harness: the model name")
    pol.add_argument("--policy-api-key-env", default="RANGER_API_KEY", help="variable holding the policy's key")
    pol.add_argument("--temperature", type=float, default=0.0, help="policy sampling (default greedy)")
    pol.add_argument("--top-p", type=float, default=1.0)
    pol.add_argument("--max-new-tokens", type=int, help="tokens per turn (default: Gen-Searcher's 4096)")
    pol.add_argument("--max-context-tokens", type=int, help="tokens per episode (default: Gen-Searcher's 36000)")
    pol.add_argument("--seed", type=int, default=0, help="base seed of the policy's sampling")
    gen = p.add_argument_group("generator")
    gen.add_argument("--generator-url", nargs="+", help="image generator root(s)")
    gen.add_argument("--generator-kind", default="sglang", choices=("sglang", "gen_searcher"))
    gen.add_argument("--generator-model", help="sglang: the model name sent")
    gen.add_argument("--generator-api-key-env", help="variable holding the generator's key (default: none)")
    gen.add_argument("--t2i-generator-url", help="SGLang images API for prompts without any image (default: "
                                                 "the generator)")
    gen.add_argument("--t2i-suffix", help=f"appended to prompts drawn without references (default: "
                                          f"{spec.t2i_suffix!r})")
    gen.add_argument("--no-fallback", action="store_true",
                     help="an answer without references fails instead of drawing the prompt")
    jud = p.add_argument_group("judge")
    jud.add_argument("--judge-url", help="OpenAI-compatible base URL incl. /v1")
    jud.add_argument("--judge-model", default=spec.judge_model)
    jud.add_argument("--judge-api-key-env", default=DEFAULT_KEY_ENV, help="variable holding the judge's key ('' "
                                                                           "for none)")
    jud.add_argument("--judge-prompt", help="a rubric file replacing the packaged one")
    if spec.name == savanna.NAME:
        jud.add_argument("--generation-judge-prompt", help="a rubric file replacing the generation judge's")
    jud.add_argument("--judge-cache", help="replay cache folder for judge calls")
    run = p.add_argument_group("run")
    run.add_argument("--concurrency", type=int, default=4, help="items in flight")
    run.add_argument("--retry-failed", action="store_true", help="redo items whose generation or judge failed")
    run.add_argument("--report-only", action="store_true", help="only rebuild the reports of the run folder")
    run.add_argument("--no-preflight", action="store_true", help="skip the check of every remote service")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def settings_of(spec: Spec, args: argparse.Namespace) -> dict[str, Any]:
    """What `run.json` records (the fixed parts must match when the run resumes)."""
    policy = {"kind": args.policy, "name": None}
    if args.policy != "none":
        detail = {"jax": args.checkpoint, "sglang": args.sglang_url, "harness": args.chat_model}.get(args.policy)
        policy.update(name=f"{args.policy}:{Path(detail).name if args.policy == 'jax' and detail else detail}"
                      if detail else args.policy, env=args.env, checkpoint=args.checkpoint,
                      url=args.sglang_url or args.chat_url, model=args.chat_model,
                      sampling={"temperature": args.temperature, "top_p": args.top_p})
    return {"benchmark": spec.name, "bench": [str(Path(b).absolute()) for b in args.bench], "label": args.label,
            "policy": policy,
            "generator": {"kind": args.generator_kind, "url": args.generator_url, "model": args.generator_model,
                          "t2i_url": args.t2i_generator_url},
            "judge": {"url": args.judge_url, "model": args.judge_model, "prompt": args.judge_prompt},
            "run": {"fallback": not args.no_fallback, "t2i_suffix": args.t2i_suffix},
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _key(variable: str | None, what: str) -> str | None:
    if not variable:
        return None
    value = os.environ.get(variable)
    if not value:
        raise SystemExit(f"{what}: ${variable} is not set (pass --{what}-api-key-env '' for a service without key)")
    return value


def _services(args: argparse.Namespace, tool_env: env_lib.ToolEnv | None) -> list[preflight.Service]:
    services = [preflight.Service("judge", args.judge_url, "models", key_env=args.judge_api_key_env or None,
                                  key_required=bool(args.judge_api_key_env))]
    for url in [*args.generator_url, *([args.t2i_generator_url] if args.t2i_generator_url else [])]:
        services.append(preflight.Service("generator", url, "health", key_env=args.generator_api_key_env,
                                          key_required=bool(args.generator_api_key_env)))
    if tool_env is not None:  # the env's own reward services are not used: the benchmark judges
        services += [s for s in preflight.live_services(tool_env, policy=args.policy,
                                                        policy_url=args.sglang_url or args.chat_url,
                                                        policy_key_env=args.policy_api_key_env)
                     if s.role in ("policy", "search", "summariser")]
    return services


def _agent(args: argparse.Namespace, tool_env: env_lib.ToolEnv) -> agent_lib.Agent:
    from ranger_jax.env.sim import world as world_lib
    from ranger_jax.processing import chat as chat_lib
    from ranger_jax.processing import tokenizer as tokenizer_lib
    from ranger_jax.rollout import actor, episode, policy as policy_lib, sequence, trained_env

    tokenizer = tokenizer_lib.load_tokenizer(args.tokenizer or args.checkpoint or actor.default_tokenizer_dir())
    trained = trained_env.read(args.checkpoint) if args.checkpoint else None
    vision = sequence.VisionSettings(**(trained.image if trained is not None else {}))
    budgets = dict(trained.episode) if trained is not None else {}
    budgets.update({k: v for k, v in (("max_new_tokens", args.max_new_tokens),
                                      ("max_context_tokens", args.max_context_tokens)) if v is not None})
    policy = actor.build_policy(args.policy, actor.PolicyOptions(
        tokenizer=tokenizer, env=tool_env, world=world_lib.load_world(args.world) if args.world else None,
        checkpoint=args.checkpoint, num_rows=args.concurrency, sglang_url=args.sglang_url, chat_url=args.chat_url,
        chat_model=args.chat_model, api_key=os.environ.get(args.policy_api_key_env)))
    config = episode.EpisodeConfig(sampling=policy_lib.SamplingParams(temperature=args.temperature, top_p=args.top_p),
                                   vision=vision, **budgets)
    return agent_lib.Agent(tool_env, policy, chat_lib.ChatRenderer(tokenizer, merge_size=vision.merge_size),
                           episode=config, seed=args.seed)


async def _arun(run: runner.Runner, items: Sequence[items_lib.Item], closers: Sequence[Any],
                on_record: Callable[[Mapping[str, Any]], None] | None) -> dict[str, dict[str, Any]]:
    try:
        return await run.arun(items, on_record)
    finally:
        for closer in closers:  # their HTTP clients belong to this event loop
            await closer.aclose()


def main(name: str, argv: Sequence[str] | None = None, *,
         on_record: Callable[[Mapping[str, Any]], None] | None = None) -> dict[str, Any]:
    """Runs (or resumes) one benchmark's eval from the command line; returns the run's `summary.json`.

    Args:
        name: the benchmark (a key of SPECS).
        argv: the arguments (default: sys.argv).
        on_record: called with each item's record once it is saved (see `runner.Runner.arun`).
    """
    spec = SPECS[name]
    parser = build_parser(spec)
    args = parser.parse_args(argv)
    if args.generator_url is None:
        args.generator_url = []
    if args.t2i_suffix is None:
        args.t2i_suffix = spec.t2i_suffix
    try:
        items = spec.load(args)[:args.limit]
    except (ValueError, FileNotFoundError) as err:
        parser.error(str(err))
    run_store = store.RunStore(args.out)
    if args.report_only:
        try:
            settings = run_store.settings()
        except FileNotFoundError as err:
            parser.error(str(err))
        summary = report.write_reports(args.out, spec.make(None, args), items, run_store.records(), settings)
        print(Path(args.out, report.REPORT_FILE).read_text("utf-8"))
        return summary
    missing = [flag for flag, value in (("--generator-url", args.generator_url), ("--judge-url", args.judge_url))
               if not value]
    if missing:
        parser.error(f"the run needs {' and '.join(missing)}")
    generator_settings = {"generator_url": args.generator_url if args.generator_kind == "gen_searcher"
                          else args.generator_url[0], "generator_kind": args.generator_kind,
                          "generator_model": args.generator_model, "generator_api_key_env": args.generator_api_key_env}
    try:
        generator = env_reward.make_generator(generator_settings, where="--generator")
    except ValueError as err:
        parser.error(str(err))
    judge_client = chat.ChatClient(args.judge_url, model=args.judge_model, cache_dir=args.judge_cache,
                                   api_key=_key(args.judge_api_key_env, "judge"))
    benchmark = spec.make(judge_client, args)
    settings = run_store.start(settings_of(spec, args))
    t2i = images_lib.SGLangImageGenerator(args.t2i_generator_url) if args.t2i_generator_url else None
    tool_env = env_lib.make(args.env, **({"world": args.world} if args.world else {})) \
        if args.policy != "none" else None
    try:
        if not args.no_preflight:
            try:
                asyncio.run(preflight.apreflight(_services(args, tool_env)))
            except preflight.PreflightError as err:
                raise SystemExit(f"evals/{name}.py: {err}") from err
        agent = _agent(args, tool_env) if tool_env is not None else None
        config = runner.RunConfig(concurrency=args.concurrency, seed=runner.GENERATOR_SEED,
                                  fallback=not args.no_fallback, retry_failed=args.retry_failed,
                                  progress=not args.quiet)
        run = runner.Runner(benchmark, run_store, generator=generator, t2i_generator=t2i, agent=agent, config=config)
        closers = [c for c in (benchmark, generator, t2i, agent) if c is not None]
        records = asyncio.run(_arun(run, items, closers, on_record))
    finally:
        if tool_env is not None:
            tool_env.close()
    summary = report.write_reports(args.out, benchmark, items, records, settings)
    print(Path(args.out, report.REPORT_FILE).read_text("utf-8"))
    return summary
