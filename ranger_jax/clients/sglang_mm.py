"""SGLang's convention for pre-tokenised image prompts, and how its answer maps onto our token-exact prompt.

SGLang keeps the ids of a `/generate` request with `input_ids` and `image_data` verbatim only when the prompt holds
exactly ONE image placeholder (`<|image_pad|>`) per image: it expands the i-th placeholder to image i's token count
itself (sglang `srt/multimodal/processors/base_processor.py`, `_expand_input_ids`, on by default through
`SGLANG_MM_AVOID_RETOKENIZE`). With any other count — runs already expanded by the processor, as our trajectories
hold them — it logs a warning and falls back to decoding the ids to text and re-tokenising that text with the HF
processor. Ids the tokenizer would not produce from their own text (a sampled " q"+"uick" where it writes " quick",
or two segments encoded apart that merge when encoded together) come back different: the server then runs, and
scores, a prompt that is not the one recorded, and the turn's log-probs belong to another context.

Our trajectories keep the expanded runs (the learner needs one position per image token), so a request sends
`collapse_image_runs(prompt_ids, …)` and the answer is read back in expanded positions: SGLang's `prompt_tokens`
counts the expanded prompt, so it must equal our prompt length (`check_prompt_tokens`; a difference means the
server sized an image differently, e.g. other `min_pixels`/`max_pixels`, or re-tokenised the prompt);
`cached_tokens` and prompt log-probs (`logprob_start_len`) are positions of that same expanded prompt; output ids
and their log-probs follow it one to one (a policy never emits an image placeholder).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class PromptMismatch(ValueError):
    """SGLang's expanded prompt is not the prompt we recorded (see `check_prompt_tokens`)."""


def image_runs(ids: np.ndarray | Sequence[int], pad_id: int) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of `pad_id` in `ids`, in order.

    Args:
        ids: [T] token ids.
        pad_id: the image placeholder id (`<|image_pad|>`).
    """
    is_pad = np.asarray(ids).reshape(-1) == pad_id  # [T]
    edges = np.flatnonzero(np.diff(np.concatenate([[False], is_pad, [False]]).astype(np.int8)))
    return [(int(start), int(end - start)) for start, end in zip(edges[0::2], edges[1::2])]


def collapse_image_runs(ids: np.ndarray | Sequence[int], pad_id: int, counts: Sequence[int]) -> np.ndarray:
    """The prompt as SGLang wants it: each image's placeholder run replaced by a single placeholder.

    Args:
        ids: [T] expanded prompt ids (each image a run of `counts[i]` placeholders).
        pad_id: the image placeholder id.
        counts: placeholder tokens of each image, in prompt order.

    Returns:
        [T - sum(counts) + len(counts)] int64 ids.

    Raises:
        ValueError: the runs disagree with `counts` (a different number of runs, or a run of another length),
            naming the run, its position and both lengths.
    """
    ids = np.asarray(ids, np.int64).reshape(-1)
    runs = image_runs(ids, pad_id)
    if len(runs) != len(counts):
        raise ValueError(f"the prompt holds {len(runs)} image placeholder runs but {len(counts)} images were given")
    keep = np.ones(ids.size, bool)
    for index, ((start, length), count) in enumerate(zip(runs, counts)):
        if length != count:
            raise ValueError(f"image {index}: the placeholder run at position {start} has {length} tokens but the "
                             f"image has {count}")
        keep[start + 1:start + length] = False
    return ids[keep]


def check_prompt_tokens(reported: int, expected: int, *, rid: str, num_images: int) -> None:
    """Checks SGLang's `prompt_tokens` against our expanded prompt length.

    Raises:
        PromptMismatch: they differ (the message names the request, both counts and the likely causes).
    """
    if reported != expected:
        raise PromptMismatch(
            f"request {rid}: SGLang ran a {reported}-token prompt but the trajectory's prompt has {expected} tokens "
            f"({num_images} images); the server sizes images differently (its min/max pixels) or re-tokenised the "
            "prompt, so its tokens and log-probs cannot be recorded")
