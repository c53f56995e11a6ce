"""Core value types of the tool environment: tasks, images, answers, observations.

Everything here is immutable: `ToolEnv.step(state, text)` returns new values and never edits old ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from PIL import Image

# Named terminations (reference/agent_protocol.md §8), also used as trajectory labels.
ANSWER = "answer"
ANSWER_PARSE_FAILED = "answer_parse_failed"
NO_ANSWER = "no_answer"
MAX_TURNS = "max_turns"
REPEATED_RESPONSE = "repeated_response"
CONTEXT_EXCEEDED = "context_exceeded"
ERROR = "error"
TERMINATIONS = (ANSWER, ANSWER_PARSE_FAILED, NO_ANSWER, MAX_TURNS, REPEATED_RESPONSE, CONTEXT_EXCEEDED, ERROR)


@dataclasses.dataclass(frozen=True)
class Task:
    """One request for a picture.

    Attributes:
        id: unique task id.
        prompt: the user's request, shown to the policy as the first user message.
        ground_truth: whatever the scorer needs (offline world: target id, GT image, bbox, attributes).
        metadata: free-form facts (domain, subcategory, `today` as YYYY-MM-DD for the system prompt).
    """

    id: str
    prompt: str
    _: dataclasses.KW_ONLY
    ground_truth: Any = None
    metadata: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class ImageRecord:
    """An image the policy has seen in this episode, addressed by its `IMG_###` id.

    Attributes:
        img_id: `IMG_001`, `IMG_002`, … stable within an episode.
        path: file in the content-addressed image store (RGB, verified).
        sha256: hex digest of the stored file's bytes.
        width, height: pixel size of the stored image.
        url: where the image was downloaded from (None for crops).
        page_url: the page that holds the image, when known.
        title: title or alt text from the search result, when known.
        parent_id: for a crop, the id it was cut from.
        root_url: the downloaded image this one derives from (its own url for downloads).
        root_box: for a crop, the pixel box [x0, y0, x1, y1] in the root image; None for downloads.
    """

    img_id: str
    path: str
    sha256: str
    width: int
    height: int
    url: str | None = None
    page_url: str | None = None
    title: str | None = None
    parent_id: str | None = None
    root_url: str | None = None
    root_box: tuple[float, float, float, float] | None = None


@dataclasses.dataclass(frozen=True)
class ObservedImage:
    """An image delivered to the policy with an observation."""

    img_id: str
    image: Image.Image


@dataclasses.dataclass(frozen=True)
class AnswerRef:
    img_id: str
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Answer:
    """The policy's final answer: a grounded generation prompt plus reference image ids."""

    gen_prompt: str
    reference_images: tuple[AnswerRef, ...]


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the environment returns after one policy turn.

    Attributes:
        text: the user-role message content for the policy (e.g. a `<tool_response>` block or an error).
        images: images attached to this message, in order (at most the per-turn image limit).
        done: the episode is over.
        termination: one of TERMINATIONS when done, else None.
        info: structured facts for logging (tool name, arguments, latency, error kind).
    """

    text: str
    images: tuple[ObservedImage, ...] = ()
    done: bool = False
    termination: str | None = None
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class FrozenDict(Mapping):
    """An immutable, hashable, picklable mapping (used for `EnvState.images` and other per-episode tables)."""

    __slots__ = ("_data",)

    def __init__(self, *args: Any, **kwargs: Any):
        object.__setattr__(self, "_data", dict(*args, **kwargs))

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"FrozenDict is immutable; cannot set {name!r}")

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"

    def __reduce__(self):
        return (FrozenDict, (self._data,))

    def set(self, key: Any, value: Any) -> "FrozenDict":
        """A copy with `key` bound to `value`."""
        return FrozenDict({**self._data, key: value})
