"""Rewards: VLM judges, K-Score and its KnowGen aggregation, the text reward, Savanna-style judges, the combined RL reward."""
