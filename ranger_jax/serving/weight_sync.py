"""New policy weights for SGLang actors: the learner publishes an HF checkpoint to shared storage and every policy
server loads it with `/update_weights_from_disk`, labelled with the version number.

    sync = SGLangWeightSync(["http://10.0.0.5:30001", "http://10.0.0.6:30001"], server_path=mounts.on_servers)
    weights.publish(learner.params_model(), "/data/run1/weights", 12)     # or let grpo_loop do it
    result = sync.update(12, "/data/run1/weights/v000012")                # every server now reports "12"

Each server answers `/generate` with `meta_info.weight_version`; the SGLang policy records its number as the
trajectory's `policy_version`, so the learner's staleness rule sees which weights sampled each trajectory. A
server that answers the update with failure, or reports another version afterwards (`/model_info`), is a
`WeightSyncFailed` naming it. The update waits for requests in flight unless `abort_all_requests`; the radix cache is
flushed, so no prefix computed with old weights is reused.

Servers read the checkpoint from their own file system: `server_path` maps the learner's path to theirs (a shared
disk mounted at another place, a bucket mounted with gcsfuse), identity by default. Talk to the servers
themselves, not the router: the router balances `/generate`, while a weight update must reach every replica.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ranger_jax.clients import http, sglang

log = logging.getLogger(__name__)


class WeightSyncFailed(RuntimeError):
    """A server refused the new weights or reports another version after loading them (the message names it)."""


@dataclasses.dataclass(frozen=True)
class SyncResult:
    """One version pushed to every server."""

    version: int
    server_path: str  # the checkpoint folder as the servers read it
    reported: dict[str, str]  # server URL -> the weight_version it reports now
    seconds: float  # wall time of the whole update (the slowest server)


class SGLangWeightSync:
    """Pushes published weight versions to SGLang policy servers (see the module docstring).

    Args:
        endpoints: every policy server's root URL (not the router's).
        server_path: the published folder's path as the servers see it (default: the same path).
        api_key: for servers started with `--api-key`.
        abort_all_requests: abort generations in flight instead of waiting for them.
    """

    def __init__(self, endpoints: Sequence[str], *, server_path: Callable[[str], str] = str,
                 api_key: str | None = None, abort_all_requests: bool = False):
        if not endpoints:
            raise ValueError("SGLangWeightSync needs at least one server URL")
        self.endpoints = list(endpoints)
        self.server_path, self.api_key, self.abort_all_requests = server_path, api_key, abort_all_requests

    async def _update_one(self, url: str, path: str, label: str) -> str:
        async with sglang.SGLangClient(url, api_key=self.api_key) as client:
            try:
                await client.aupdate_weights_from_disk(path, weight_version=label,
                                                       abort_all_requests=self.abort_all_requests)
            except http.ClientError as err:
                raise WeightSyncFailed(f"{url} did not load {path} as version {label}: {err}") from err
            info = await client.aget_model_info()
        if info.weight_version != label:
            raise WeightSyncFailed(f"{url} reports weight_version {info.weight_version!r} after loading {path} as "
                                   f"version {label}")
        return info.weight_version

    async def aupdate(self, version: int, published: Any) -> SyncResult:
        """Makes every server load the published folder `published` as `version` (all at once)."""
        path = self.server_path(str(published))
        label = str(int(version))
        started = time.monotonic()
        results = await asyncio.gather(*(self._update_one(url, path, label) for url in self.endpoints),
                                       return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise WeightSyncFailed(f"{len(failures)} of {len(self.endpoints)} servers failed: "
                                   + "; ".join(str(f) for f in failures)) from failures[0]
        result = SyncResult(version=int(version), server_path=path, reported=dict(zip(self.endpoints, results)),
                            seconds=time.monotonic() - started)
        log.info("weights version %d loaded by %d servers in %.1f s", version, len(self.endpoints), result.seconds)
        return result

    def update(self, version: int, published: Any) -> SyncResult | None:
        """Sync twin of `aupdate` for the learner's loop: every learner process may call it, process 0 talks to the
        servers (the others get None)."""
        import jax

        if jax.process_index() != 0:
            return None
        return asyncio.run(self.aupdate(version, published))
