"""The multi-turn agent loop and the actor process: policies × `ToolEnv` → token-exact `Trajectory` shards.

    from ranger_jax.rollout import runner, scoring
    groups = runner.run(tool_env, policy, tasks, renderer=renderer, config=runner.RolloutConfig(group_size=6),
                        scorer=scoring.make_scorer(tool_env))

Modules: `policy` (the interface and scripted agents), `sampler_policy` (in-process JAX sampler),
`sglang_policy` (SGLang `/generate`), `harness` (OpenAI-compatible chat with tools), `sequence` (token and
image record), `episode` (one episode), `runner` (many in flight, GRPO groups), `scoring` (the env's reward for
the loop), `actor` (shards + CLI), `trained_env` (a checkpoint's `ranger_env.json`), `evaluate` (Savanna-style
evaluation of agents and checkpoints in the offline world).
"""

from ranger_jax.rollout import (
    actor,
    episode,
    evaluate,
    harness,
    policy,
    runner,
    sampler_policy,
    scoring,
    sequence,
    sglang_policy,
    trained_env,
)

__all__ = ["actor", "episode", "evaluate", "harness", "policy", "runner", "sampler_policy", "scoring", "sequence",
           "sglang_policy", "trained_env"]
