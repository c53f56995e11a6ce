"""The main job: SFT then GRPO of a Qwen3-VL policy for agentic image search.

    python recipes/grpo_savanna.py                          # sim-tiny: the whole method on a CPU, ~20-34 min on 2 cores
    python recipes/grpo_savanna.py --out runs/a --seed 1    # another seed, another folder
    python recipes/grpo_savanna.py --blind                  # the control run: observations blanked
    python recipes/grpo_savanna.py --grpo-schedule short --out runs/short   # 1/8 of the GRPO episodes, ~10 min less
    python recipes/grpo_savanna.py --set grpo_learning_rate=2e-4 --set group_size=4   # any SimTinyConfig field
    python recipes/grpo_savanna.py --preset savanna-8b-tpu --checkpoint CKPT --tasks rl_data.json --dry-run

sim-tiny writes OUT/summary.json, OUT/policy/, OUT/curves.png and OUT/viewer.html (ranger_jax.rl.sim_tiny);
the 8B presets check everything they need first and name what is missing (ranger_jax.rl.presets).
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    from ranger_jax.rl import presets

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--preset", default="sim-tiny", choices=presets.NAMES)
    parser.add_argument("--out", default=None, help="output folder (default: runs/<preset>)")
    parser.add_argument("--dry-run", action="store_true", help="check the configuration and print the plan")
    tiny = parser.add_argument_group("sim-tiny")
    tiny.add_argument("--seed", type=int, default=0, help="run seed (world seeds derive from it)")
    tiny.add_argument("--blind", action="store_true", help="control: the policy sees every observation blank")
    tiny.add_argument("--sft-steps", type=int, help="override the SFT steps")
    tiny.add_argument("--grpo-steps", type=int, help="override the GRPO steps")
    tiny.add_argument("--grpo-schedule", default="default",
                      help="named GRPO settings: default (= long: 8 steps of 960 decision-sampled episodes in "
                           "groups of 8 over 960 tasks, half the groups sampling the find_object turn and half the "
                           "answer, attention trained alone), find-object-turn (the default before, every group "
                           "sampling the find_object turn; GRPO - SFT held-out reward on two fresh worlds +0.034 "
                           "over nineteen seeds), short (the default before that: 4 steps of 240, ~10 min less, "
                           "the find_object turn alone; on the fresh worlds +0.008, +0.006, "
                           "-0.006, -0.009, +0.029), groups-of-4 (short's steps in groups of 4), three-steps (three "
                           "steps of groups of 4), small-steps (6 steps of 32 episodes: -0.017 to -0.000), "
                           "large-batch (12 steps of 240 episodes, every token drawn) or decision-batch (four steps "
                           "with every parameter trained: -0.210 on seed 2); all but the first three were "
                           "measured only on the evaluation worlds they were chosen on (docs/sim_tiny.md)")
    tiny.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="any SimTinyConfig field, value as JSON (repeatable), e.g. --set grpo_learning_rate=2e-4")
    scale = parser.add_argument_group("8B presets")
    scale.add_argument("--checkpoint", help="HF Qwen3-VL-8B folder to start from (after SFT)")
    scale.add_argument("--tasks", help="RL task file")
    scale.add_argument("--sglang-url", action="append", default=[], help="SGLang policy server (repeatable)")
    scale.add_argument("--env-file", help="environment settings (.toml) instead of the preset's savanna_live, e.g. "
                                          "with the judge's and the generator's URLs")
    args = parser.parse_args(argv)
    out = args.out or f"runs/{args.preset}"
    if args.preset == "sim-tiny":
        import dataclasses

        from ranger_jax.rl import sim_tiny

        try:
            overrides = sim_tiny.config_overrides(args.set)
            overrides.update({k: v for k, v in (("sft_steps", args.sft_steps), ("grpo_steps", args.grpo_steps))
                              if v is not None})
            config = sim_tiny.configure(seed=args.seed, blind=args.blind, grpo_schedule=args.grpo_schedule,
                                        overrides=overrides)
        except (ValueError, TypeError) as error:
            parser.error(str(error))
        if args.dry_run:
            print(json.dumps(dataclasses.asdict(config), indent=2))
            return 0
        summary = sim_tiny.run(config, out)
        keys = [k for k in summary if k.endswith(("_search_score", "_reward"))] + ["num_eval_tasks", "wall_seconds"]
        print(json.dumps({k: summary[k] for k in keys}, indent=2))
        print(f"wrote {out}/summary.json, {out}/policy/, {out}/curves.png, {out}/viewer.html")
        return 0
    from ranger_jax.parallel import distributed

    distributed.initialize()  # every worker of a TPU slice or GPU cluster joins one SPMD learner; alone: nothing
    preset = presets.PRESETS[args.preset]
    if args.env_file:
        import dataclasses

        preset = dataclasses.replace(preset, env_file=args.env_file)
    options = presets.ScaleOptions(checkpoint=args.checkpoint, tasks=args.tasks, out=out,
                                   sglang_urls=tuple(args.sglang_url))
    problems = presets.check(preset, options)
    print(presets.plan(preset, options))
    if problems:
        print("\ncannot run yet:\n" + "\n".join(f"  - {p}" for p in problems), file=sys.stderr)
        return 2
    if args.dry_run:
        print("\nready to run")
        return 0
    print(json.dumps(presets.run_scale(preset, options), indent=2, default=str))
    return 0


if __name__ == "__main__":
    from ranger_jax import host_memory

    host_memory.retain_freed_memory()  # before JAX runs anything: each step reuses the last one's pages
    sys.exit(main())
