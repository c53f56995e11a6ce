"""Every request a data-generation run makes, recorded with its response, and what the calls cost.

`Recorder.record(...)` appends one JSON line per call to `<run>/calls/<service>.jsonl` — the stage, the endpoint,
the request and the response (or the error), the latency and the token usage — and adds the call to the run's
accounting: requests, failures, prompt and completion tokens and US dollars per stage and service, priced with the
service's `Price`. Images never go into the log as pixels: `data:` URLs, base64 payloads and raw bytes are replaced
by their SHA-256 and size (`compact`), so the log stays small but says exactly which image was sent. The accounting
is written atomically to `<run>/accounting.json` by `save()`; a resumed run starts from the saved totals, so the
figures cover the whole run, reruns included.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ranger_jax.datagen import ledger

ACCOUNTING_FILE = "accounting.json"
CALLS_DIR = "calls"
_BASE64 = re.compile(r"^[A-Za-z0-9+/=\s]{512,}$")  # a long run of base64 characters: an encoded image
COUNTERS = ("requests", "failed", "prompt_tokens", "completion_tokens")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Price:
    """What one service charges (US dollars); all zero for self-hosted servers and the offline world."""

    per_request: float = 0.0  # e.g. Serper's price per query, a generator's per image
    per_million_input_tokens: float = 0.0
    per_million_output_tokens: float = 0.0

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"Price.{field.name} must be a number >= 0, got {value!r}")

    def cost(self, *, requests: int, prompt_tokens: int, completion_tokens: int) -> float:
        """Dollars for that many requests and tokens."""
        return (requests * self.per_request + prompt_tokens * self.per_million_input_tokens / 1e6
                + completion_tokens * self.per_million_output_tokens / 1e6)


def _digest(data: bytes, what: str) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()} ({len(data)} {what})"


def compact(value: Any) -> Any:
    """`value` as JSON with every image replaced by its SHA-256 and size (data URLs, base64 runs, bytes)."""
    if isinstance(value, (bytes, bytearray)):
        return _digest(bytes(value), "bytes")
    if isinstance(value, str):
        if value.startswith("data:") or _BASE64.match(value):
            return _digest(value.encode("utf-8"), "chars")
        return value
    if isinstance(value, Mapping):
        return {str(k): compact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [compact(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return repr(value)


class Recorder:
    """The call log and the accounting of one run (see the module docstring).

    Args:
        run_dir: the run's folder (`calls/` and `accounting.json` live in it); None keeps counts in memory only
            (dry runs and tests).
        prices: each service's price by service name (services not listed are free).
    """

    def __init__(self, run_dir: str | os.PathLike | None, prices: Mapping[str, Price] | None = None):
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.prices = dict(prices or {})
        self._lock = threading.Lock()
        # (stage, service) -> counters
        self._usage: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
        self._cost: dict[tuple[str, str], float] = collections.defaultdict(float)
        if self.run_dir is not None and (self.run_dir / ACCOUNTING_FILE).is_file():
            saved = json.loads((self.run_dir / ACCOUNTING_FILE).read_text("utf-8"))
            for stage, services in saved.get("stages", {}).items():
                for service, row in services.items():
                    self._usage[(stage, service)].update({k: int(row.get(k, 0)) for k in COUNTERS})
                    self._cost[(stage, service)] += float(row.get("cost_usd", 0.0))

    def record(self, *, stage: str, service: str, endpoint: str, request: Any, response: Any = None,
               error: str | None = None, latency_s: float = 0.0, usage: Mapping[str, int] | None = None) -> None:
        """Logs one call and adds it to the accounting.

        Args:
            stage: the stage that made it.
            service: the service's name (`llm`, `judge`, `serper`, `generator`, `world`, …).
            endpoint: what was called (URL or a name).
            request / response: the bodies (compacted before logging).
            error: why the call failed (None when it succeeded).
            latency_s: wall time of the call, retries included.
            usage: token counts (`prompt_tokens`, `completion_tokens`) the service reported.
        """
        usage = dict(usage or {})
        prompt_tokens, completion_tokens = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
        cost = self.prices.get(service, Price()).cost(requests=1, prompt_tokens=prompt_tokens,
                                                      completion_tokens=completion_tokens)
        row = {"time": round(time.time(), 3), "stage": stage, "service": service, "endpoint": endpoint,
               "request": compact(request), "response": compact(response), "error": error,
               "latency_s": round(latency_s, 4), "usage": usage}
        with self._lock:
            counter = self._usage[(stage, service)]
            counter.update(requests=1, failed=int(error is not None), prompt_tokens=prompt_tokens,
                           completion_tokens=completion_tokens)
            self._cost[(stage, service)] += cost
            if self.run_dir is not None:
                path = self.run_dir / CALLS_DIR / f"{service}.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "a", encoding="utf-8") as f:
                    f.write(ledger.dumps(row) + "\n")

    def usage(self) -> dict[str, Any]:
        """{"stages": {stage: {service: counters + cost_usd}}, "services": {service: totals},
        "total_cost_usd": …}."""
        with self._lock:
            stages: dict[str, dict[str, Any]] = collections.defaultdict(dict)
            services: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
            service_cost: dict[str, float] = collections.defaultdict(float)
            for (stage, service), counter in sorted(self._usage.items()):
                cost = self._cost[(stage, service)]
                stages[stage][service] = {**{k: counter.get(k, 0) for k in COUNTERS}, "cost_usd": round(cost, 6)}
                services[service].update(counter)
                service_cost[service] += cost
            return {"stages": dict(stages),
                    "services": {s: {**{k: c.get(k, 0) for k in COUNTERS}, "cost_usd": round(service_cost[s], 6)}
                                 for s, c in sorted(services.items())},
                    "total_cost_usd": round(sum(service_cost.values()), 6)}

    def save(self) -> Path | None:
        """Writes the accounting to `<run>/accounting.json` (atomically); None without a run folder."""
        if self.run_dir is None:
            return None
        return ledger.write_json(self.run_dir / ACCOUNTING_FILE, self.usage())
