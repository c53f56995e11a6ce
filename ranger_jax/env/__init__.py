"""ranger_jax.env: the functional tool environment (public API for library users).

    from ranger_jax import env
    tool_env = env.make("savanna_sim", world="/data/world")   # or "savanna_live", "knowgen_live", a .toml path
    state = tool_env.reset(env.Task("t1", "A photo of …"))
    observation = tool_env.observe(state)                      # the first observation: the task prompt
    while not state.done:
        state, observation = tool_env.step(state, my_agent(observation, state))
    score = tool_env.score(state)        # the episode's reward (env.Score: reward, reason, breakdown)

`format_tool_call` / `format_answer` write the blocks the parser reads; `openai_messages` / `hf_messages` give an
episode as chat messages; `env_files()` lists the shipped environments; `ToolEnv.metadata` says what the env can do
and what will fail (a live env without a search key). `Observation.info` has the same keys for the same failure in
every tool (`env.info`).

States, threads and async: an `EnvState` is an immutable value — `step` returns a new one and never changes the one
it was given, so states can be kept, compared, pickled and branched. One `ToolEnv` may be used from many threads at
once: the sync methods (`step`, `score`) run their async twins on the env's own event-loop thread. In async code
use `astep` / `ascore` (many episodes run concurrently in one event loop, as rollouts do); never call the sync
methods from a coroutine. `close()` (or `with`) releases clients and the env-owned image folder.

Determinism: in the offline world an episode is a function of the world's seed and the agent's text — search
ranking (ties by document order), image ids (assigned in result order), pixels, crops and the exact reward repeat on
every run and machine; the system prompt's date is the task's `metadata["today"]` (else today's date). On the live
web, `cache_dir` replays a run's searches, pages and images exactly; judged rewards pin the generator's seed and
run temperature-0 judges: repeatable, not bit-exact.
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
