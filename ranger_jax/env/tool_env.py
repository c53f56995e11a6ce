"""`ToolEnv`: the functional multi-turn tool environment, `step(state, text) -> (state, observation)`.

The state is a frozen value (tuples and `FrozenDict`s); `step` builds a new one and never edits the one it was
given. Policy mistakes (format errors, bad tool arguments, failed fetches) come back as observations; the episode
ends only with one of `core.TERMINATIONS`:

- `answer`: a valid `<answer>`; `answer_parse_failed`: an `<answer>` that cannot be used (bad JSON, unknown id);
- `no_answer`: the forced final turn produced no usable answer; `max_turns`: turns ran out with the final turn
  disabled; `repeated_response`: a turn identical to the previous one, or two truncated turns in a row;
- `context_exceeded`, `error`: reported by the rollout through `terminate`.

`score(state)` / `ascore(state)` is the reward of a finished episode — the one number rollouts (RL), the learner
and evaluations use — computed from the env's `[rewards]` settings and its `max_answer_refs`
(`ranger_jax.rewards.env_reward`). An offline-world score reads no image file, so it is the same before and after
`close`.

Text the env hands the policy (the task prompt, tool output, control messages) never spells a chat-control or
vision token (`prompts.strip_control_tokens`), so rendering it cannot add image placeholders or turn boundaries.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from typing import Any

from PIL import Image

from ranger_jax import background
from ranger_jax.clients import chat
from ranger_jax.env import config as config_lib
from ranger_jax.env import core, images, parsing, prompts, summarizer, tool_runner, tools
from ranger_jax.env import info as info_lib
from ranger_jax.env.backends import base

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EnvState:
    """One episode at one point in time.

    Attributes:
        task: the task being solved.
        messages: ChatML dicts `{"role", "content"}`; content is a str or a list of parts
            `{"type": "text", "text": …}` / `{"type": "image", "img_id": "IMG_001"}`. Treat as read-only.
        images: img_id → ImageRecord of every image shown so far.
        image_keys: de-duplication key (image url or crop identity) → img_id.
        next_image_index: the number of the next new image id.
        today: the date the episode lives in (system prompt, relative date filters).
        num_turns: policy turns taken.
        num_tool_calls: tool calls executed.
        num_truncated: consecutive truncated turns (two end the episode).
        final_turn: the next turn is the forced final-answer turn.
        done: the episode is over.
        termination: one of core.TERMINATIONS when done.
        answer: the parsed answer when it ended by `answer`.
    """

    task: core.Task
    messages: tuple[dict[str, Any], ...]
    images: core.FrozenDict
    image_keys: core.FrozenDict
    next_image_index: int
    today: dt.date
    num_turns: int = 0
    num_tool_calls: int = 0
    num_truncated: int = 0
    final_turn: bool = False
    done: bool = False
    termination: str | None = None
    answer: core.Answer | None = None

    @property
    def last_response(self) -> str | None:
        """The text of the latest assistant turn, or None before the first."""
        for message in reversed(self.messages):
            if message["role"] == "assistant":
                return message["content"]
        return None


def _today(task: core.Task, backend: base.Backend) -> dt.date:
    value = (task.metadata or {}).get("today")
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError as err:
            raise ValueError(f"task {task.id}: metadata['today'] must be YYYY-MM-DD; got {value!r}") from err
    backend_today = getattr(backend, "today", None)
    return backend_today if isinstance(backend_today, dt.date) else dt.date.today()


def _user_message(text: str, shown: tuple[str, ...]) -> dict[str, Any]:
    if not shown:
        return {"role": "user", "content": text}
    head, sep, tail = text.rpartition("</tool_response>")
    parts: list[dict[str, Any]] = [{"type": "text", "text": head if sep else text}]
    parts.extend({"type": "image", "img_id": img_id} for img_id in shown)
    if sep:  # images sit inside the tool response, before its closing tag
        parts.append({"type": "text", "text": sep + tail})
    return {"role": "user", "content": parts}


class ToolEnv:
    """The tool environment over one backend.

    Args:
        backend: search and fetch (`LiveBackend`, `OfflineBackend`, or any `base.Backend`).
        config: tools and limits.
        rewards: reward settings (see config.REWARD_KEYS).
        reward: what `score` computes: any object with `async ascore(state) -> Score`; None builds the one the
            settings ask for on first use (`rewards.env_reward.make_reward`).
    """

    def __init__(self, backend: base.Backend, config: config_lib.EnvConfig | None = None, *,
                 rewards: Mapping[str, Any] | None = None, reward: Any = None):
        self.backend = backend
        self._reward = reward
        self.config = config or config_lib.EnvConfig()
        if tools.FIND_OBJECT in self.config.tools and getattr(backend, "object_finder", None) is None:
            raise ValueError(f"tool {tools.FIND_OBJECT!r} needs a backend that recognises objects from pixels "
                             f"(an `object_finder`, as the offline world has); {type(backend).__name__} has none")
        self.rewards = core.FrozenDict(config_lib.check_rewards(dict(rewards or {}), "rewards"))
        self._owned_dir = None
        store_dir = self.config.image_store
        if store_dir is None:
            self._owned_dir = store_dir = tempfile.mkdtemp(prefix="ranger_images_")
            self._cleanup = weakref.finalize(self, shutil.rmtree, store_dir, ignore_errors=True)
        self.store = images.ImageStore(store_dir, max_bytes=self.config.max_image_bytes,
                                       max_pixels=self.config.max_image_pixels, min_side=self.config.min_image_side)
        reader = None
        if self.config.summarizer_url:
            client = chat.ChatClient(self.config.summarizer_url, model=self.config.summarizer_model,
                                     api_key=self.config.summarizer_api_key, cache_dir=self.config.summarizer_cache_dir,
                                     max_retries=self.config.summarizer_max_retries)
            reader = summarizer.PageSummarizer(client, max_tokens=self.config.summarizer_max_tokens,
                                               chunk_chars=self.config.summarizer_chunk_chars)
        self.runner = tool_runner.ToolRunner(backend, self.store, self.config, reader)
        self._background = background.BackgroundLoop("ToolEnv")

    @property
    def metadata(self) -> dict[str, Any]:
        """Facts about this env for logs and run records (plain JSON): the backend and what it reports of itself
        (a live backend: its search service and whether it has a key), the tools, the reward kind, and `problems`
        — what will make episodes fail (e.g. a live backend without a search key); empty when none."""
        facts = dict(getattr(self.backend, "metadata", None) or {})
        facts.setdefault("backend", type(self.backend).__name__)
        return {**facts, "tools": list(self.config.tools), "reward_kind": self.rewards.get("kind", "sim"),
                "problems": list(facts.get("problems", ()))}

    # ---- prompt side -------------------------------------------------------------------------------------

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function-calling schemas of the enabled tools."""
        return tools.tool_schemas(tools=self.config.tools, max_queries=self.config.max_queries,
                                  max_images=self.config.max_images_per_turn, news=self.runner.has_news)

    def system_prompt(self, task: core.Task) -> str:
        """The system prompt (style `config.prompt_style`): protocol, tools and today's date for `task`."""
        return prompts.PROMPT_STYLES[self.config.prompt_style](self.tool_schemas(), today=_today(task, self.backend),
                                     max_tool_calls=self.config.max_tool_calls, max_refs=self.config.max_answer_refs)

    def reset(self, task: core.Task) -> EnvState:
        """The initial state: system prompt and the task prompt as the first user message (`observe(state)` gives
        it as the first Observation).

        Raises:
            TypeError: `task` is not a Task with a str prompt and mapping (or None) metadata.
            ValueError: `task.metadata["today"]` is not a YYYY-MM-DD date.
        """
        if not isinstance(task, core.Task):
            raise TypeError(f"reset needs an env.Task; got {type(task).__name__}")
        if not isinstance(task.prompt, str):
            raise TypeError(f"task {task.id!r}: prompt must be a str; got {type(task.prompt).__name__}")
        if task.metadata is not None and not isinstance(task.metadata, Mapping):
            raise TypeError(f"task {task.id!r}: metadata must be a mapping or None; got {type(task.metadata).__name__}")
        messages = ({"role": "system", "content": self.system_prompt(task)},
                    {"role": "user", "content": prompts.renderable(task.prompt)})
        return EnvState(task=task, messages=messages, images=core.FrozenDict(), image_keys=core.FrozenDict(),
                        next_image_index=1, today=_today(task, self.backend))

    def observe(self, state: EnvState) -> core.Observation:
        """What the policy sees now, as an Observation: after `reset`, the task prompt (the first observation);
        after `step`, the text and images that step returned (its `info` stays with step's own observation); for a
        finished episode, `done` with its termination.

        Pure: reads `state` only, so it works on any state, e.g. one restored from a checkpoint.
        """
        if state.done:
            return core.Observation(text=prompts.renderable(f"Episode over ({state.termination})."), done=True,
                                    termination=state.termination)
        message = state.messages[-1]
        if isinstance(message["content"], str):
            return core.Observation(text=message["content"])
        text = "".join(part["text"] for part in message["content"] if part["type"] == "text")
        shown = tuple(core.ObservedImage(part["img_id"], self.store.pixels(state.images[part["img_id"]].path,
                                                                           state.images[part["img_id"]].sha256))
                      for part in message["content"] if part["type"] == "image")
        return core.Observation(text=text, images=shown)

    def image(self, record: core.ImageRecord) -> Image.Image:
        """The RGB pixels of an image of this env's store (shared; treat as read-only)."""
        return self.store.open(record.path, record.sha256)

    # ---- stepping ----------------------------------------------------------------------------------------

    def terminate(self, state: EnvState, reason: str) -> EnvState:
        """Ends the episode for a reason only the rollout can see (`context_exceeded`, `error`, …).

        Raises:
            ValueError: `reason` is not one of core.TERMINATIONS.
        """
        if reason not in core.TERMINATIONS:
            raise ValueError(f"unknown termination {reason!r}; known: {list(core.TERMINATIONS)}")
        return dataclasses.replace(state, done=True, termination=reason)

    def step(self, state: EnvState, assistant_text: str, *, truncated: bool = False
             ) -> tuple[EnvState, core.Observation]:
        """Applies one policy turn; see `astep`. Runs on the env's own background loop."""
        return self._background.run(self.astep(state, assistant_text, truncated=truncated))

    async def astep(self, state: EnvState, assistant_text: str, *, truncated: bool = False
                    ) -> tuple[EnvState, core.Observation]:
        """Applies one policy turn and returns the next state and what the policy sees next.

        Args:
            state: the current state (not modified).
            assistant_text: the policy's full turn.
            truncated: the turn hit the rollout's token cap.

        Raises:
            ValueError: `state` is already done.
        """
        if state.done:
            raise ValueError(f"episode {state.task.id!r} is already over ({state.termination}); call reset")
        if not isinstance(assistant_text, str):
            raise TypeError(f"assistant_text must be a str; got {type(assistant_text).__name__}")
        previous = state.last_response
        state = dataclasses.replace(state, num_turns=state.num_turns + 1,
                                    messages=state.messages + ({"role": "assistant", "content": assistant_text},))
        too_long = self.config.max_response_chars is not None and len(assistant_text) > self.config.max_response_chars
        if (truncated or too_long) and state.final_turn:
            return self._end(state, core.NO_ANSWER, "the final turn was cut off before a complete answer")
        if truncated or too_long:
            if state.num_truncated + 1 >= 2:
                return self._end(state, core.REPEATED_RESPONSE, "two truncated responses in a row")
            state = dataclasses.replace(state, num_truncated=state.num_truncated + 1)
            return self._reply(state, prompts.RESPONSE_TOO_LONG, info={"truncated": True})
        state = dataclasses.replace(state, num_truncated=0)
        if previous is not None and assistant_text.strip() == previous.strip():
            return self._end(state, core.REPEATED_RESPONSE, "the response repeats the previous one")
        try:
            turn = parsing.split_turn(assistant_text)
        except parsing.FormatError as err:
            if state.final_turn:
                return self._end(state, core.NO_ANSWER, f"the final turn is malformed: {err}")
            return self._format_error(state, str(err))
        if state.final_turn:
            return self._final(state, turn)
        if turn.calls and turn.answers:
            return self._format_error(state, "a tool call and an answer in one turn; give exactly one of them")
        if len(turn.calls) > 1:
            return self._format_error(state, f"{len(turn.calls)} tool calls in one turn; only one is allowed and "
                                             "none was run")
        if len(turn.answers) > 1:
            return self._format_error(state, f"{len(turn.answers)} answers in one turn; give exactly one")
        if turn.answers:
            return self._answer(state, turn.answers[0], drop_unknown=False)
        if turn.calls:
            return await self._tool_call(state, turn.calls[0])
        if turn.unclosed_call:
            return self._format_error(state, "<tool_call> was opened but never closed with </tool_call>")
        if turn.unclosed_answer:
            return self._format_error(state, "<answer> was opened but never closed with </answer>")
        return self._format_error(state, "no <tool_call> or <answer> found")

    def _answer(self, state: EnvState, body: str, *, drop_unknown: bool) -> tuple[EnvState, core.Observation]:
        try:
            answer = parsing.parse_answer(body, state.images, drop_unknown=drop_unknown,
                                          max_refs=self.config.max_answer_refs)
        except parsing.AnswerError as err:
            return self._end(state, core.ANSWER_PARSE_FAILED, f"the answer could not be used: {err}")
        state = dataclasses.replace(state, answer=answer)
        return self._end(state, core.ANSWER, "answer received",
                         info={"reference_images": [r.img_id for r in answer.reference_images]})

    def _final(self, state: EnvState, turn: parsing.Turn) -> tuple[EnvState, core.Observation]:
        """The forced final turn: tool calls are cut away, unknown image ids dropped."""
        if turn.answers:
            return self._answer(state, turn.answers[-1], drop_unknown=True)
        why = "tool calls are not allowed in the final turn" if turn.calls or turn.unclosed_call else \
            "the final turn has no complete <answer>"
        return self._end(state, core.NO_ANSWER, why)

    async def _tool_call(self, state: EnvState, body: str) -> tuple[EnvState, core.Observation]:
        try:
            parsed = parsing.parse_tool_call(body)
        except parsing.FormatError as err:
            return self._format_error(state, str(err))
        name = tools.ALIASES.get(parsed.name, parsed.name)  # info names the tool canonically (see env.info)
        info: dict[str, Any] = {"tool": name if name in tools.ALL_TOOL_NAMES else parsed.name,
                                "arguments": parsed.arguments, "error": None, "errors": []}
        if state.num_tool_calls >= self.config.max_tool_calls:
            state = dataclasses.replace(state, final_turn=True)
            text = prompts.tool_response(f"Tool call refused: all {self.config.max_tool_calls} tool calls are used.")
            return self._reply(state, f"{text}\n\n{prompts.FINAL_STEP}",
                               info={**info, "error": "budget", "errors": ["budget"]})
        try:
            call = tools.check_call(parsed, enabled=self.config.tools, today=state.today,
                                    max_queries=self.config.max_queries, max_images=self.config.max_images_per_turn,
                                    news=self.runner.has_news)
        except tools.ArgumentError as err:
            kind = "unknown_tool" if isinstance(err, tools.UnknownTool) else "arguments"
            return self._reply(state, prompts.tool_response(f"Error: {err}"),
                               info={**info, "error": kind, "errors": [kind]})
        ledger = tool_runner.Ledger(dict(state.images), dict(state.image_keys), state.next_image_index)
        try:
            result = await self.runner.run(call, ledger)
        except Exception as err:  # noqa: BLE001 — a tool bug must not crash the rollout; the policy is told
            log.exception("tool %s failed unexpectedly in episode %s", parsed.name, state.task.id)
            ledger = tool_runner.Ledger(dict(state.images), dict(state.image_keys), state.next_image_index)
            result = tool_runner.ToolResult(body=f"The tool failed with an internal error ({type(err).__name__}: "
                                                 f"{err}). Try again or use another tool.",
                                            info={"error": "internal", "errors": ["internal"]})
        state = dataclasses.replace(state, num_tool_calls=state.num_tool_calls + 1,
                                    images=core.FrozenDict(ledger.images), image_keys=core.FrozenDict(ledger.keys),
                                    next_image_index=ledger.next_index)
        text = prompts.tool_response(result.body)
        if state.num_tool_calls >= self.config.max_tool_calls:
            state = dataclasses.replace(state, final_turn=True)
            text = f"{text}\n\n{prompts.FINAL_STEP}"
        return self._reply(state, text, shown=result.shown, info={**info, **result.info})

    def _format_error(self, state: EnvState, problem: str) -> tuple[EnvState, core.Observation]:
        return self._reply(state, prompts.invalid_format(problem),
                           info={"error": "format", "errors": ["format"], "problem": problem})

    def _reply(self, state: EnvState, text: str, *, shown: tuple[str, ...] = (), info: dict[str, Any] | None = None
               ) -> tuple[EnvState, core.Observation]:
        """Continues the episode with a user message, entering the final turn when the turns run out."""
        info = {"error": None, **(info or {})}
        text = prompts.renderable(text)  # tool output is web text: it may spell special tokens
        if not state.final_turn and state.num_turns >= self.config.max_turns:
            if not self.config.final_answer_turn:
                return self._end(state, core.MAX_TURNS, f"all {self.config.max_turns} turns used", info=info)
            state = dataclasses.replace(state, final_turn=True)
            text = f"{text}\n\n{prompts.FINAL_STEP}"
        shown = shown[: self.config.max_images_per_turn]
        state = dataclasses.replace(state, messages=state.messages + (_user_message(text, shown),))
        observed = tuple(core.ObservedImage(img_id, self.store.pixels(state.images[img_id].path,
                                                                      state.images[img_id].sha256))
                         for img_id in shown)
        info["final_turn"] = state.final_turn
        return state, core.Observation(text=text, images=observed, info=info_lib.json_safe(info))

    @staticmethod
    def _end(state: EnvState, termination: str, reason: str, *, info: dict[str, Any] | None = None
             ) -> tuple[EnvState, core.Observation]:
        state = dataclasses.replace(state, done=True, termination=termination)
        info = {**(info or {}), "reason": reason}
        text = prompts.renderable(f"Episode over ({termination}): {reason}.")
        return state, core.Observation(text=text, done=True, termination=termination, info=info_lib.json_safe(info))

    # ---- reward ------------------------------------------------------------------------------------------

    @property
    def reward(self) -> Any:
        """The reward `score` computes (built from the settings on first use); assign to replace it."""
        if self._reward is None:
            from ranger_jax.rewards import env_reward  # the reward stack loads only when an episode is scored

            self._reward = env_reward.make_reward(self)
        return self._reward

    @reward.setter
    def reward(self, reward: Any) -> None:
        self._reward = reward

    def score(self, state: EnvState) -> core.Score:
        """The reward of a finished episode; see `ascore`. Runs on the env's own background loop."""
        return self._background.run(self.ascore(state))

    async def ascore(self, state: EnvState) -> core.Score:
        """The reward of the finished episode in `state`: the number rollouts, the learner and evaluations use.

        Returns:
            A `core.Score`: `reward` in [0, 1], `reason` (why it is zero or below 1), `zero_reason` (the hard-zero
            rule that fired, if any), `breakdown` (the parts), and `generation` for live rewards.

        Raises:
            ValueError: `state` is not finished, or the settings cannot make a reward (naming the key).
        """
        if not isinstance(state, EnvState):
            raise TypeError(f"score needs an EnvState; got {type(state).__name__}")
        if not state.done:
            raise ValueError(f"episode {state.task.id!r} is not over; score it once state.done is true")
        return await self.reward.ascore(state)

    # ---- lifecycle ---------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Closes the backend's and summariser's clients of the running loop."""
        await self.backend.aclose()
        if self.runner.reader is not None:
            await self.runner.reader.aclose()

    def close(self) -> None:
        """Closes clients, stops the background loop and removes the env-owned image folder."""
        self._background.close(self.aclose)
        if self._owned_dir is not None:
            self._cleanup()
            self._owned_dir = None

    def __enter__(self) -> "ToolEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
