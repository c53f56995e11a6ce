"""Core value types of the tool environment: tasks, images, answers, observations.

Everything here is immutable: `ToolEnv.step(state, text)` returns new values and never edits old ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from PIL import Image

# How an episode can end (Gen-Searcher's termination labels plus ours), also used as trajectory labels.
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
        path: the image file: in the content-addressed image store (RGB, verified), or the backend's own trusted
            file (offline-world images whose SHA-256 matches the build; see `images.ImageStore.add`).
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


class ObservedImage:
    """An image delivered to the policy with an observation.

    Args:
        img_id: its `IMG_###` id in the episode.
        image: the RGB pixels, or a loader that returns them; a loader runs on the first access of `image`
            (the env passes loaders for pixels it has not decoded yet, e.g. trusted offline-world files).

    Attributes:
        img_id: its `IMG_###` id.
        image: the RGB pixels (shared with the env's image cache; treat as read-only).
    """

    __slots__ = ("img_id", "_image", "_load")

    def __init__(self, img_id: str, image: Image.Image | Callable[[], Image.Image]):
        object.__setattr__(self, "img_id", img_id)
        is_loader = callable(image) and not isinstance(image, Image.Image)
        object.__setattr__(self, "_image", None if is_loader else image)
        object.__setattr__(self, "_load", image if is_loader else None)

    @property
    def image(self) -> Image.Image:
        """The decoded image (decoded on first access)."""
        if self._image is None:  # two threads may both decode once; either result is the same pixels
            object.__setattr__(self, "_image", self._load())
            object.__setattr__(self, "_load", None)
        return self._image

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ObservedImage is immutable; cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ObservedImage):
            return NotImplemented
        return self.img_id == other.img_id and self.image == other.image

    __hash__ = None  # pixels are not hashable

    def __repr__(self) -> str:
        pixels = "not decoded yet" if self._image is None else f"{self._image.mode} {self._image.size}"
        return f"ObservedImage({self.img_id!r}, {pixels})"

    def __reduce__(self):
        return (ObservedImage, (self.img_id, self.image))


@dataclasses.dataclass(frozen=True)
class AnswerRef:
    """One reference image an answer selects: its `IMG_###` id and an optional note."""

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


@dataclasses.dataclass(frozen=True)
class Score:
    """The reward of one finished episode (`ToolEnv.score`): the number every consumer uses, and why.

    Attributes:
        reward: the reward in [0, 1].
        reason: why the reward is zero or below 1, in words (None at full reward).
        zero_reason: one of `rewards.combine.ZERO_REASONS` when a hard-zero rule fired, else None.
        breakdown: how the reward was reached (the kind, the parts and their weights, per-reference checks,
            judge outputs); plain JSON values.
        generation: the image the reward's generator made (`clients.images.GenerationResult`) when one ran
            (live judges); None otherwise. Not part of equality or `to_dict`.
    """

    reward: float
    reason: str | None
    zero_reason: str | None = None
    breakdown: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    generation: Any = dataclasses.field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The score as JSON-ready values (what a trajectory records as `reward_breakdown`)."""
        return {"reward": self.reward, "reason": self.reason, "zero_reason": self.zero_reason,
                "breakdown": dict(self.breakdown)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Score":
        """The inverse of `to_dict`.

        Raises:
            ValueError: a key other than reward, reason, zero_reason and breakdown, naming it.
        """
        known = ("reward", "reason", "zero_reason", "breakdown")
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"unknown Score keys {unknown}; known: {list(known)}")
        return cls(reward=data["reward"], reason=data.get("reason"), zero_reason=data.get("zero_reason"),
                   breakdown=dict(data.get("breakdown") or {}))


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
