"""ranger_jax.env: the functional tool environment (public API for library users).

    from ranger_jax import env
    tool_env = env.make("savanna_sim", world="/data/world")
    state = tool_env.reset(env.Task("t1", "A photo of …"))
    state, observation = tool_env.step(state, policy_text)
    score = tool_env.score(state)        # the episode's reward (env.Score: reward, reason, breakdown)
"""

from ranger_jax.env.config import EnvConfig
from ranger_jax.env.core import (
    ANSWER,
    ANSWER_PARSE_FAILED,
    CONTEXT_EXCEEDED,
    ERROR,
    MAX_TURNS,
    NO_ANSWER,
    REPEATED_RESPONSE,
    TERMINATIONS,
    Answer,
    AnswerRef,
    FrozenDict,
    ImageRecord,
    Observation,
    ObservedImage,
    Score,
    Task,
)
from ranger_jax.env.messages import hf_messages, openai_messages
from ranger_jax.env.parsing import format_answer, format_tool_call
from ranger_jax.env.registry import env_files, make
from ranger_jax.env.tool_env import EnvState, ToolEnv

__all__ = [
    "ANSWER", "ANSWER_PARSE_FAILED", "CONTEXT_EXCEEDED", "ERROR", "MAX_TURNS", "NO_ANSWER", "REPEATED_RESPONSE",
    "TERMINATIONS", "Answer", "AnswerRef", "EnvConfig", "EnvState", "FrozenDict", "ImageRecord", "Observation",
    "ObservedImage", "Score", "Task", "ToolEnv", "env_files", "format_answer", "format_tool_call", "hf_messages",
    "make", "openai_messages",
]
