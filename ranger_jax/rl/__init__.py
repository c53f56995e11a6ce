"""Reinforcement learning and supervised fine-tuning of the policy.

Modules:
- `grpo`: GRPO math as pure functions of arrays: `group_advantages` (group-normalised rewards) and `policy_loss`
  (clipped policy-gradient loss with dual clip, k3 KL, truncated importance weights, and its diagnostics);
- `objectives`: the "sft" and "grpo" objectives on the fused LM head, per microbatch;
- `train_step`: `TrainState` and the pure, jitted `train_step(state, batch) -> (state, metrics)`;
- `optim`: global-norm clipping and AdamW with a warmup + decay schedule;
- `learner_config`: `LearnerConfig`, the learner's settings;
- `learner`: `Learner`, the stateful shell that owns the mesh, the state and the checkpoints;
- `weights`: numbered HF checkpoints published for actors, and loading the newest;
- `metrics`: JSONL + TensorBoard metrics, PNG curves, staleness numbers;
- `sft`: the SFT loop over a Grain batch stream, resumable with the data iterator's state;
- `grpo_loop`: GRPO with decoupled actor processes: streams their rounds of shards, publishes weights per step;
- `tiny_policy`: a small Qwen3-VL-shaped policy with a compact tokenizer, trained from scratch on a CPU;
- `sim_tiny`: the `sim-tiny` main job (worlds, teacher data, SFT, GRPO, held-out evaluation, report);
- `presets`: the main job's presets (`sim-tiny`, `savanna-8b-tpu`, `savanna-8b-gpu`) and their checks.

`grpo` is imported here; the others are listed in `__all__` and imported by whoever uses them, so an actor that
only reads published weights does not load the learner.
"""

from ranger_jax.rl import grpo

__all__ = ["grpo", "grpo_loop", "learner", "learner_config", "metrics", "objectives", "optim", "presets", "sft",
           "sim_tiny", "tiny_policy", "train_step", "weights"]
