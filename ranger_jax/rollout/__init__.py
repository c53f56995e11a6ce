"""The multi-turn agent loop and the actor process: policies × `ToolEnv` → token-exact `Trajectory` shards.

    from ranger_jax.rollout import runner, scoring
    groups = runner.run(tool_env, policy, tasks, renderer=renderer, config=runner.RolloutConfig(group_size=6),
                        scorer=scoring.make_scorer(tool_env, world=world_dir))

Modules: `policy` (the interface and scripted agents), `sampler_policy` (in-process JAX sampler),
`sglang_policy` (SGLang `/generate`), `harness` (OpenAI-compatible chat with tools), `sequence` (token and
image record), `episode` (one episode), `runner` (many in flight, GRPO groups), `scoring` (rewards),
`actor` (shards + CLI).
"""

from ranger_jax.rollout import (
    actor,
    episode,
    harness,
    policy,
    runner,
    sampler_policy,
    scoring,
    sequence,
    sglang_policy,
)

__all__ = ["actor", "episode", "harness", "policy", "runner", "sampler_policy", "scoring", "sequence",
           "sglang_policy"]
