"""Tool calls per second of `ToolEnv.step` on the offline backend (goal: ≥ 200 calls/s on one core).

    python benchmarks/env_tool_throughput.py [--world DIR | --tasks 40 --seed 0] [--repeats 3] [--json OUT]

Each task runs one episode of four tool calls — text_search, web_fetch of its first hit, image_search (5 images
fetched and stored), crop_image of the first image — through the public `step` API, so the figure includes
parsing, argument checks, BM25, the image store and crops. A warm-up pass over the first tasks is reported
apart; steady state is the median over `--repeats` passes, each with a fresh env (empty image store), followed
by a second pass on the same env (images already stored, as for the later episodes of a GRPO group).

World images are trusted by their build-time SHA-256, so `step` checks only their headers and the observation
decodes pixels on first access (`ObservedImage.image`). The "+ pixels" column is a third pass, on another fresh
env, that also reads the pixels of every observed image inside the timing, as a VLM rollout does.
Pinned to one CPU core.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

from ranger_jax import env, fileio
from ranger_jax.env.sim import agents, build, world

TARGET_CALLS_PER_S = 200.0
TOOLS = ("text_search", "web_fetch", "image_search", "crop_image")


def _episode(tool_env, task, timings: dict[str, list[float]], pixels: bool = False) -> None:
    state = tool_env.reset(task)
    subject = agents.subject_query(task.prompt)
    calls = [("text_search", {"queries": [subject], "top_k": 8})]
    for name in TOOLS:
        if name == "web_fetch":
            urls = re.findall(r"^\d+\. \[[^\]]*\]\(([^)\s]+)\)", state.messages[-1]["content"], re.MULTILINE)
            calls = [(name, {"url": urls[0] if urls else "https://none.sim/", "prompt": "facts"})]
        elif name == "image_search":
            calls = [(name, {"query": subject, "top_k": 5})]
        elif name == "crop_image":
            calls = [(name, {"img_id": min(state.images) if state.images else "IMG_001",
                             "bbox": [0.1, 0.1, 0.6, 0.7]})]
        for tool, arguments in calls:
            text = agents.tool_call(tool, arguments, "benchmark")
            start = time.perf_counter()
            state, observation = tool_env.step(state, text)
            if pixels:
                for shown in observation.images:
                    shown.image.getpixel((0, 0))
            timings[tool].append(time.perf_counter() - start)
            if observation.done:
                return


def _rates(timings: dict[str, list[float]]) -> dict[str, float]:
    rates = {tool: len(t) / sum(t) for tool, t in timings.items() if t}
    total = sum(len(t) for t in timings.values())
    rates["overall"] = total / sum(sum(t) for t in timings.values())
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--world", help="an existing world (default: build one in a temporary folder)")
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.world) if args.world else build.build_world(Path(tmp) / "world", args.tasks, args.seed)
        tasks = world.load_tasks(root)
        with env.make("offline", world=str(root)) as tool_env:  # imports, font and file caches
            warm: dict[str, list[float]] = collections.defaultdict(list)
            for task in tasks[:5]:
                _episode(tool_env, task, warm)
        cold, cached, decoded = [], [], []
        for _ in range(args.repeats):
            with env.make("offline", world=str(root)) as tool_env:  # a fresh, empty image store
                for runs in (cold, cached):  # second pass: every image is already in the store
                    timings: dict[str, list[float]] = collections.defaultdict(list)
                    for task in tasks:
                        _episode(tool_env, task, timings)
                    runs.append(_rates(timings))
            with env.make("offline", world=str(root)) as tool_env:  # fresh again, pixels read as a VLM would
                timings = collections.defaultdict(list)
                for task in tasks:
                    _episode(tool_env, task, timings, pixels=True)
                decoded.append(_rates(timings))
    warmup = _rates(warm)
    steady = {key: statistics.median(r[key] for r in cold) for key in cold[0]}
    repeat = {key: statistics.median(r[key] for r in cached) for key in cached[0]}
    with_pixels = {key: statistics.median(r[key] for r in decoded) for key in decoded[0]}
    print(f"offline ToolEnv tool throughput (calls/s), {len(tasks)} tasks x {args.repeats} repeats, one core")
    print(f"{'tool':<14}{'warm-up':>10}{'cold store':>12}{'warm store':>12}{'+ pixels':>10}{'target':>8}{'ratio':>8}")
    for key in (*TOOLS, "overall"):
        print(f"{key:<14}{warmup.get(key, 0.0):>10.1f}{steady[key]:>12.1f}{repeat[key]:>12.1f}"
              f"{with_pixels[key]:>10.1f}{TARGET_CALLS_PER_S:>8.0f}{steady[key] / TARGET_CALLS_PER_S:>8.2f}")
    if args.json:
        body = {"tasks": len(tasks), "repeats": args.repeats, "warmup_calls_per_s": warmup,
                "calls_per_s": steady, "calls_per_s_warm_store": repeat, "calls_per_s_with_pixels": with_pixels,
                "target_calls_per_s": TARGET_CALLS_PER_S}
        fileio.write_atomic(Path(args.json), json.dumps(body, indent=2).encode("utf-8"))


if __name__ == "__main__":
    main()
