"""The `ranger` command.

`ranger demo` runs the library end to end on embedded defaults: it builds a tiny random Qwen3-VL checkpoint, saves
it in the Hugging Face layout, loads it back, runs it on text and an image; builds a small offline "wild web" world
and scores the scripted Locate–Corroborate–Isolate expert against the naive agent; then runs rollouts (the expert,
whose token-exact trajectories are SFT data, and the tiny random policy through the in-process KV-cache sampler),
writes them to trajectory shards and renders an HTML viewer of the expert's shard.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

DEMO_TASKS = 10
DEMO_SEED = 0


def _demo_image():
    """A deterministic 180×260 test card (shapes and text), so the demo needs no files."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (260, 180), (236, 231, 220))
    draw = ImageDraw.Draw(image)
    draw.rectangle((20, 30, 120, 150), fill=(190, 30, 45))
    draw.ellipse((140, 40, 240, 140), fill=(20, 90, 170))
    draw.text((30, 8), "RANGER 2026", fill=(10, 10, 10))
    return image


def demo_model(workdir: Path) -> dict:
    """Tiny random checkpoint → HF layout → load → forward on text + one image. Returns what it did."""
    import jax.numpy as jnp
    import numpy as np

    from ranger_jax.models import qwen3_vl
    from ranger_jax.processing import image_token_count, preprocess_image

    config = qwen3_vl.Qwen3VLConfig.tiny()
    started = time.perf_counter()
    model = qwen3_vl.init(config, seed=DEMO_SEED)
    ckpt = workdir / "tiny-qwen3-vl"
    qwen3_vl.save(model, ckpt)
    loaded = qwen3_vl.load(ckpt, dtype=jnp.float32)

    vision = config.vision_config
    pixel_values, grid_thw = preprocess_image(
        _demo_image(), min_pixels=32 * 32, max_pixels=128 * 128, patch_size=vision.patch_size,
        merge_size=vision.spatial_merge_size, temporal_patch_size=vision.temporal_patch_size)
    num_pads = image_token_count(grid_thw, merge_size=vision.spatial_merge_size)
    rng = np.random.default_rng(DEMO_SEED)
    text = rng.integers(16, config.text_config.vocab_size, size=12).tolist()
    ids = (text[:6] + [config.vision_start_token_id] + [config.image_token_id] * num_pads
           + [config.vision_end_token_id] + text[6:])
    logits = loaded(jnp.asarray([ids], jnp.int32), pixel_values=jnp.asarray(pixel_values),
                    image_grid_thw=jnp.asarray([grid_thw], jnp.int32))
    logits = np.asarray(logits)
    same = np.allclose(np.asarray(model(jnp.asarray([ids], jnp.int32), pixel_values=jnp.asarray(pixel_values),
                                        image_grid_thw=jnp.asarray([grid_thw], jnp.int32))), logits, atol=1e-6)
    return {
        "checkpoint": str(ckpt),
        "files": sorted(p.name for p in ckpt.iterdir()),
        "num_params": int(sum(np.prod(x.shape) for x in _param_leaves(loaded))),
        "image_grid_thw": [int(g) for g in grid_thw],
        "image_tokens": num_pads,
        "sequence_length": len(ids),
        "logits_shape": list(logits.shape),
        "next_token": int(logits[0, -1].argmax()),
        "reloaded_equals_original": bool(same),
        "seconds": round(time.perf_counter() - started, 2),
    }


def _param_leaves(model):
    import jax
    from flax import nnx

    return jax.tree.leaves(nnx.state(model, nnx.Param))


def demo_world(workdir: Path, *, num_tasks: int = DEMO_TASKS, seed: int = DEMO_SEED) -> dict:
    """Builds an offline world and scores the scripted expert and the naive agent on it."""
    from ranger_jax.env.sim import build, savanna

    started = time.perf_counter()
    world_dir = build.build_world(workdir / "world", num_tasks, seed)
    scores = {}
    for policy in ("expert", "naive"):
        summary = savanna.evaluate(world_dir, policy)
        scores[policy] = {"search_score": summary["search_score"],
                          "search_score_by_domain": summary["search_score_by_domain"]}
    return {"world": str(world_dir), "num_tasks": num_tasks, "seed": seed, "policies": scores,
            "seconds": round(time.perf_counter() - started, 2)}


def demo_rollouts(workdir: Path, world_dir: Path, *, num_tasks: int = 3, group_size: int = 2) -> dict:
    """Expert and tiny-random-policy rollouts on the world → shards (+ an HTML viewer of the expert's)."""
    import dataclasses

    from ranger_jax import env as env_lib
    from ranger_jax.data import viewer
    from ranger_jax.env.sim import world as world_lib
    from ranger_jax.processing import chat, tokenizer as tokenizer_lib
    from ranger_jax.rollout import actor, episode, runner, scoring

    tokenizer_dir = actor.default_tokenizer_dir()
    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_dir)
    renderer = chat.ChatRenderer(tokenizer)
    world = world_lib.load_world(world_dir)
    tasks = world_lib.load_tasks(world_dir)[:num_tasks]
    checkpoint = actor.write_tiny_checkpoint(workdir / "tiny-policy", tokenizer_dir, seed=DEMO_SEED)
    results = {}
    with env_lib.make("offline", world=world_dir) as tool_env:
        scorer = scoring.make_scorer(tool_env, world=world)
        for name, max_new_tokens in (("expert", 4096), ("jax", 48)):
            policy = actor.build_policy(name, actor.PolicyOptions(
                tokenizer=tokenizer, env=tool_env, world=world, checkpoint=str(checkpoint),
                num_rows=num_tasks * group_size))
            config = runner.RolloutConfig(group_size=group_size, concurrency=num_tasks * group_size, seed=DEMO_SEED,
                                          run_id=f"demo-{name}",
                                          episode=dataclasses.replace(episode.EpisodeConfig(),
                                                                      max_new_tokens=max_new_tokens))
            summary = actor.run_actor(tool_env, policy, tasks, renderer=renderer, out_dir=workdir / "shards",
                                      prefix=name, config=config, scorer=scorer)
            results[name] = summary.to_dict()
    expert_shard = results["expert"]["shards"][0]
    page = workdir / "expert_trajectories.html"
    viewer.write_viewer(expert_shard, page)
    return {"policies": results, "viewer": str(page)}


def run_demo(args: argparse.Namespace) -> int:
    """Runs `ranger demo`: model round trip, offline world and agents, rollouts, viewer; returns 0."""
    workdir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ranger-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"ranger demo: working in {workdir}")

    model = demo_model(workdir)
    print(f"[model] tiny random Qwen3-VL ({model['num_params']:,} params) saved to {model['checkpoint']} "
          f"as {', '.join(model['files'])}; loaded back; forward on {model['sequence_length']} tokens with one "
          f"image (grid {model['image_grid_thw']}, {model['image_tokens']} image tokens) -> logits "
          f"{model['logits_shape']}, next token {model['next_token']}, reload identical: "
          f"{model['reloaded_equals_original']} ({model['seconds']} s)")

    world = demo_world(workdir, num_tasks=args.tasks, seed=args.seed)
    print(f"[env] offline world with {world['num_tasks']} tasks (seed {world['seed']}) at {world['world']}")
    for policy, result in world["policies"].items():
        domains = ", ".join(f"{d} {s:.2f}" for d, s in result["search_score_by_domain"].items())
        print(f"[env] {policy:6s} search_score {result['search_score']:.2f}  ({domains})")
    print(f"[env] done in {world['seconds']} s")

    started = time.perf_counter()
    rollouts = demo_rollouts(workdir, Path(world["world"]), num_tasks=min(args.rollout_tasks, args.tasks))
    for name, summary in rollouts["policies"].items():
        print(f"[rollout] {name:6s} {summary['num_trajectories']} trajectories in {summary['num_groups']} GRPO "
              f"groups, mean reward {summary['reward_mean']:.3f}, terminations {summary['terminations']}, "
              f"shards {', '.join(summary['shards'])}")
    print(f"[rollout] viewer: {rollouts['viewer']} ({time.perf_counter() - started:.1f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The `ranger` command line: parses `argv` and runs the chosen subcommand; returns its exit code."""
    parser = argparse.ArgumentParser(prog="ranger", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the main job on embedded defaults")
    demo.add_argument("--out", help="working folder (default: a new temporary folder)")
    demo.add_argument("--tasks", type=int, default=DEMO_TASKS, help="tasks in the offline world")
    demo.add_argument("--seed", type=int, default=DEMO_SEED, help="world seed")
    demo.add_argument("--rollout-tasks", type=int, default=3, help="tasks rolled out (x2 samples) per policy")
    demo.set_defaults(func=run_demo)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
