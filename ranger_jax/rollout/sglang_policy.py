"""An SGLang server as the policy: token ids in, token ids and log-probs out (`/generate`).

Every turn sends the full, already processor-expanded `input_ids` (each image is its `<|image_pad|>` run) and the
CUMULATIVE list of the episode's images as `image_data`, with `return_logprob` (the multi-turn VLM pattern of
slime's SGLang rollouts). Images go as lossless PNG data URLs of the PREPARED pixels (already at the processor's
grid size), so the server's own resize is the identity and its placeholder count equals ours: the server never
expands anything twice (a double expansion gives empty or garbled rollouts).
"""

from __future__ import annotations

import base64
import re
from typing import Any

from ranger_jax.clients import sglang
from ranger_jax.rollout import policy as policy_lib

_TRAILING_NUMBER = re.compile(r"(\d+)$")


def png_data_url(png: bytes) -> str:
    """PNG bytes as a `data:image/png;base64,` URL."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def sampling_params(request: policy_lib.TurnRequest) -> dict[str, Any]:
    """SGLang `sampling_params` of a turn (greedy = temperature 0; top_k -1 = all)."""
    sampling = request.sampling
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
    """Policy backend over one SGLang server (or router).

    Args:
        client: the server's client (its own concurrency limit applies).
        name: label recorded on trajectories.
        policy_version: the version recorded when the server's `weight_version` is not an integer.
    """

    token_exact = True
    has_logprobs = True

    def __init__(self, client: sglang.SGLangClient, *, name: str = "sglang", policy_version: int = 0):
        self.client, self.name, self.policy_version = client, name, policy_version
        self._images: dict[str, list[str]] = {}  # rid -> data URLs of every image so far, in token order

    async def generate(self, request: policy_lib.TurnRequest) -> policy_lib.Generation:
        """One `/generate` call with the episode's whole history.

        Raises:
            ClientError (and subclasses): the server failed after retries.
        """
        images = self._images.setdefault(request.rid, [])
        images.extend(png_data_url(image.png) for image in request.new_images)
        result = await self.client.agenerate(request.prompt_ids, image_data=list(images) or None,
                                             sampling_params=sampling_params(request), return_logprob=True,
                                             rid=f"{request.rid}#{request.turn}")
        info: dict[str, Any] = {"prompt_tokens": result.prompt_tokens, "cached_tokens": result.cached_tokens}
        if result.abort_message:
            info["abort_message"] = result.abort_message
        return policy_lib.Generation(token_ids=result.output_ids, logprobs=result.output_logprobs,
                                     finish_reason=result.finish_reason,
                                     policy_version=version_number(result.weight_version, self.policy_version),
                                     weight_version=result.weight_version, info=info)

    async def release(self, rid: str) -> None:
        """Forgets the episode's image list."""
        self._images.pop(rid, None)

    async def aclose(self) -> None:
        """Closes the SGLang client."""
        await self.client.aclose()
