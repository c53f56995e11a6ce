"""Rewards: VLM judges, K-Score and its KnowGen aggregation, the text reward, Savanna judges, the combined RL reward.

Modules: `judge` (rubric loading, the judging loop, `KScoreJudge`), `kscore` (per-sample K-Score and `aggregate`),
`text_reward` (the 5-level R_text), `savanna` (search and generation judges), `mind_bench` (Mind-Bench's checklist
judge and pass rate), `wise` (WISE's judge and WiScore), `combine` (hard-zero rules and the
α-weighted combination), `live` (generator + judges for one episode), `offline` (the offline world's exact
reward) and `env_reward` (the reward an environment's settings ask for: what `ToolEnv.score` computes).
"""

from ranger_jax.rewards import combine, env_reward, judge, kscore, live, mind_bench, offline, savanna, text_reward, wise

__all__ = ["combine", "env_reward", "judge", "kscore", "live", "mind_bench", "offline", "savanna", "text_reward",
           "wise"]
