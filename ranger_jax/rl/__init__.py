"""Reinforcement learning for the policy.

- `grpo`: GRPO math as pure functions of arrays: `group_advantages` (group-normalised rewards) and `policy_loss`
  (clipped policy-gradient loss with dual clip, k3 KL, truncated importance weights, and its diagnostics).
"""

from ranger_jax.rl import grpo

__all__ = ["grpo"]
