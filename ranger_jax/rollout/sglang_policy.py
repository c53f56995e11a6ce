"""An SGLang server as the policy: token ids in, token ids and log-probs out (`/generate`).

Every turn sends the episode's whole token history with ONE `<|image_pad|>` per image (SGLang's convention for
pre-tokenised image prompts: the server expands each placeholder to the image's run itself and keeps every other id
verbatim; expanded runs would make it decode and re-tokenise the prompt) and the CUMULATIVE list of the episode's
images as `image_data`, with `return_logprob` (the multi-turn VLM pattern of slime's SGLang rollouts). Images go as
lossless PNG data URLs of the PREPARED pixels (already at the processor's grid size), so the server's own resize is
the identity and its expansion equals our runs. The answer is mapped back onto the trajectory's expanded prompt
(`clients.sglang_mm`): the server's `prompt_tokens` must equal our prompt length, else the turn fails with
`PromptMismatch` rather than record tokens and log-probs of a prompt the server did not run.

Seeds: each turn's `sampling_seed` is honoured only by a server launched with `--enable-deterministic-inference`.
The policy asks the server once (`/server_info`), warns when seeds are ignored, and records it on every turn
(`info["seed_honoured"]`: True, False, or None when the server does not say).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
from collections.abc import Sequence
from typing import Any

from ranger_jax.clients import http, sglang, sglang_mm
from ranger_jax.rollout import policy as policy_lib

log = logging.getLogger(__name__)
_TRAILING_NUMBER = re.compile(r"(\d+)$")


def png_data_url(png: bytes) -> str:
    """PNG bytes as a `data:image/png;base64,` URL."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def sampling_params(request: policy_lib.TurnRequest) -> dict[str, Any]:
    """SGLang `sampling_params` of a turn (greedy = temperature 0; top_k -1 = all; `sampling_seed` is honoured
    only with `--enable-deterministic-inference`)."""
    sampling = request.sampling
    if sampling.limits_draws:
        raise ValueError(f"draw_below={sampling.draw_below} / max_draws={sampling.max_draws} (decision sampling) "
                         "need the JAX sampler; SGLang samples every token")
    return {"max_new_tokens": request.max_new_tokens, "temperature": float(sampling.temperature),
            "top_p": float(sampling.top_p), "top_k": int(sampling.top_k),
            "stop_token_ids": list(request.stop_token_ids), "sampling_seed": int(request.seed),
            "skip_special_tokens": False}


def version_number(weight_version: str, default: int) -> int:
    """An integer policy version from SGLang's `weight_version` label: its trailing number ("12" → 12,
    "step_3" → 3), else `default` ("default" → `default`)."""
    match = _TRAILING_NUMBER.search(weight_version.strip())
    return int(match.group(1)) if match else default


class SGLangPolicy:
    """Policy backend over one SGLang server, the router, or several servers (`clients.sglang_pool.connect`).

    Args:
        client: the server's client, or a pool of servers (its own concurrency limit applies).
        image_pad_id: the tokenizer's `<|image_pad|>` id (each image's run is sent as one of these).
        name: label recorded on trajectories.
        policy_version: the version recorded when the server's `weight_version` is not an integer.
    """

    token_exact = True
    has_logprobs = True

    def __init__(self, client: sglang.SGLangClient, *, image_pad_id: int, name: str = "sglang",
                 policy_version: int = 0):
        self.client, self.image_pad_id, self.name, self.policy_version = client, image_pad_id, name, policy_version
        self._images: dict[str, list[tuple[str, int]]] = {}  # rid -> (data URL, placeholder tokens) so far, in order
        self._seed_answer: asyncio.Future | None = None  # the one /server_info question, shared by all episodes

    async def _ask_server(self) -> bool | None:
        url = self.client.base_url
        try:
            info = await self.client.aget_server_info()
        except http.ClientError as err:
            log.warning("cannot tell whether %s honours sampling seeds (%s); recorded as unknown", url, err)
            return None
        if info.deterministic_inference is False:
            log.warning("%s runs without --enable-deterministic-inference: it ignores sampling_seed, so rollouts "
                        "are not reproducible from their seeds", url)
        return info.deterministic_inference

    async def seed_honoured(self) -> bool | None:
        """Whether the server honours `sampling_seed` (asked once; None when it does not say)."""
        if self._seed_answer is None:
            self._seed_answer = asyncio.ensure_future(self._ask_server())
        return await self._seed_answer

    async def generate(self, request: policy_lib.TurnRequest) -> policy_lib.Generation:
        """One `/generate` call with the episode's whole history (one placeholder per image).

        Raises:
            ValueError: the prompt's image runs disagree with the episode's images.
            PromptMismatch: the server expanded the prompt to another length than ours.
            ClientError (and subclasses): the server failed after retries.
        """
        images = self._images.setdefault(request.rid, [])
        images.extend((png_data_url(image.png), image.num_tokens) for image in request.new_images)
        counts = [count for _, count in images]
        try:
            sent = sglang_mm.collapse_image_runs(request.prompt_ids, self.image_pad_id, counts)
        except ValueError as err:
            raise ValueError(f"episode {request.rid} turn {request.turn}: {err}") from err
        honoured = await self.seed_honoured()
        rid = f"{request.rid}#{request.turn}"
        result = await self.client.agenerate(sent, image_data=[url for url, _ in images] or None,
                                             sampling_params=sampling_params(request), return_logprob=True, rid=rid)
        sglang_mm.check_prompt_tokens(result.prompt_tokens, int(request.prompt_ids.size), rid=rid,
                                      num_images=len(images))
        info: dict[str, Any] = {"prompt_tokens": result.prompt_tokens, "sent_tokens": int(sent.size),
                                "cached_tokens": result.cached_tokens, "sampling_seed": int(request.seed),
                                "seed_honoured": honoured}
        if result.abort_message:
            info["abort_message"] = result.abort_message
        return policy_lib.Generation(token_ids=result.output_ids, logprobs=result.output_logprobs,
                                     finish_reason=result.finish_reason,
                                     policy_version=version_number(result.weight_version, self.policy_version),
                                     weight_version=result.weight_version, info=info)

    async def fork(self, rid: str, into: Sequence[str]) -> None:
        """Each of `into` starts with `rid`'s image list (the server's prefix cache shares their common tokens)."""
        images = self._images.get(rid, [])
        for other in into:
            self._images[other] = list(images)

    async def release(self, rid: str) -> None:
        """Forgets the episode's image list."""
        self._images.pop(rid, None)

    async def aclose(self) -> None:
        """Closes the SGLang client."""
        await self.client.aclose()
