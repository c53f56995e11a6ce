"""Before a live run: every remote service it needs has its key and answers, or the run stops naming each problem.

A live run depends on up to five services: the policy (an SGLang server or an OpenAI-compatible chat model), web
search (Serper), the page summariser, the reward's image generator and its judge. Each has its own key, read from
the environment variable its settings name (the actor's `--policy-api-key-env`; the env file's
`serper_api_key_env`, `judge_api_key_env`, `generator_api_key_env`). Without this check a missing or refused key
shows only as "Search failed" observations and zero rewards, and a run would train on them.

`live_services(tool_env, ...)` lists the services of a run; `preflight(...)` checks that every key is set and that
each service answers one cheap request (no retries, short timeouts), and raises `PreflightError` listing every
problem at once. The probes: `GET {url}/health` (SGLang policy, SGLang and Gen-Searcher generators), `GET
{url}/models` (OpenAI-compatible judge, summariser and chat policy: a refused key answers 401), and one
one-result Serper query (it spends one search credit; Serper has no free key check).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from ranger_jax.clients import http
from ranger_jax.env import tool_env as tool_env_lib
from ranger_jax.env.backends import live

PROBE_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
PROBE_RETRIES = 1  # one retry: a run should not fail on one dropped packet, nor wait minutes on a dead host
SERPER_PROBE = {"q": "weather", "num": 1}


@dataclasses.dataclass(frozen=True)
class Service:
    """One remote service a run depends on and how to check it.

    Attributes:
        role: what it is for ("policy", "search", "summariser", "generator", "judge").
        url: its base URL.
        probe: the path of the cheap request that shows it answers (relative to `url`).
        method: `GET`, or `POST` with `body` as JSON.
        key: its key when one was given directly (not through a variable).
        key_env: the environment variable its key is read from (None: it takes no key, or was given one).
        key_required: a missing key is a problem (search always needs one; others when a variable is named).
        key_header: how the key is sent (`Authorization: Bearer …`, or Serper's `X-API-KEY`).
        body: the JSON body of a POST probe.
    """

    role: str
    url: str
    probe: str
    method: str = "GET"
    key: str | None = None
    key_env: str | None = None
    key_required: bool = False
    key_header: str = "Authorization"
    body: Any = None

    def resolve_key(self, environ: Mapping[str, str]) -> str | None:
        """The key to send: the one given, else the value of `key_env` in `environ`."""
        return self.key or (environ.get(self.key_env) if self.key_env else None)


class PreflightError(RuntimeError):
    """A live run cannot start; `problems` names each missing key and each service that did not answer."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("the run cannot start:\n" + "\n".join(f"- {p}" for p in self.problems))


def _openai(role: str, url: str, key_env: str | None, key: str | None = None) -> Service:
    return Service(role, url, "models", key=key, key_env=key_env, key_required=bool(key_env))


def live_services(tool_env: tool_env_lib.ToolEnv, *, policy: str | None = None, policy_url: str | None = None,
                  policy_key_env: str | None = None) -> list[Service]:
    """The remote services a run of `tool_env` with `policy` depends on (empty for an offline run).

    Args:
        tool_env: the environment: its live backend (search), summariser and judged reward settings.
        policy: the actor's policy backend; "sglang" and "harness" are remote, others local.
        policy_url: the SGLang server root (or several, comma-separated: each is probed), or the chat model's base
            URL incl. /v1.
        policy_key_env: the environment variable holding the policy server's key (None: no key).
    """
    services = []
    if policy in ("sglang", "harness") and policy_url:
        if policy == "sglang":
            services += [Service("policy", url.strip(), "health", key_env=policy_key_env)
                         for url in policy_url.split(",") if url.strip()]
        else:
            services.append(_openai("policy", policy_url, policy_key_env))
    backend, tools = tool_env.backend, tool_env.config.tools
    if isinstance(backend, live.LiveBackend) and {"text_search", "image_search"} & set(tools):
        services.append(Service("search", backend.search.session.base_url, "search", method="POST",
                                key=backend.search.api_key, key_env=backend.search.api_key_env, key_required=True,
                                key_header="X-API-KEY", body=SERPER_PROBE))
    if tool_env.config.summarizer_url and "web_fetch" in tools:
        services.append(_openai("summariser", tool_env.config.summarizer_url, None, tool_env.config.summarizer_api_key))
    rewards = tool_env.rewards
    if rewards.get("kind") == "judge":
        if rewards.get("judge_url"):
            services.append(_openai("judge", rewards["judge_url"], rewards.get("judge_api_key_env")))
        urls = rewards.get("generator_url") or []
        for url in [urls] if isinstance(urls, str) else urls:
            services.append(Service("generator", url, "health", key_env=rewards.get("generator_api_key_env"),
                                    key_required=bool(rewards.get("generator_api_key_env"))))
    return services


def _keyless(services: Sequence[Service], environ: Mapping[str, str]) -> list[Service]:
    return [s for s in services if s.key_required and not s.resolve_key(environ)]


def key_problems(services: Sequence[Service], environ: Mapping[str, str] | None = None) -> list[str]:
    """The services whose required key is missing, each named with the variable to set."""
    environ = os.environ if environ is None else environ
    return [f"{s.role} ({s.url}): {f'${s.key_env}' if s.key_env else 'its key'} is not set"
            for s in _keyless(services, environ)]


async def _probe(service: Service, environ: Mapping[str, str]) -> str | None:
    key = service.resolve_key(environ)
    headers = {}
    if key:
        headers = {"X-API-KEY": key} if service.key_header == "X-API-KEY" else {"Authorization": f"Bearer {key}"}
    where = f"{service.role} ({service.url})"
    try:
        session = http.Session(service.url, timeout=PROBE_TIMEOUT, max_retries=PROBE_RETRIES)
    except ValueError as err:
        return f"{where}: {err}"
    try:
        response = await session.arequest(service.method, service.probe, json=service.body, headers=headers)
        if service.role == "search":
            data = http.json_body(response)
            if not isinstance(data, dict) or "organic" not in data:
                message = data.get("message") or data.get("error") if isinstance(data, dict) else data
                return f"{where}: answered without results ({str(message)[:200]})"
    except http.StatusError as err:
        message = http.error_message(err.body)[:200]
        if err.status in (401, 403):
            source = f"${service.key_env}" if service.key_env and not service.key else "the key given"
            return f"{where}: refused the key from {source} (HTTP {err.status} from {err.url}: {message})"
        return f"{where}: HTTP {err.status} from {err.url}: {message}"
    except http.ClientError as err:
        return f"{where}: unreachable ({err})"
    finally:
        await session.aclose()
    return None


async def apreflight(services: Sequence[Service], *, environ: Mapping[str, str] | None = None) -> None:
    """Checks `services` (keys, then one probe each, concurrently).

    Raises:
        PreflightError: listing every missing key and every service that did not answer as it should.
    """
    environ = os.environ if environ is None else environ
    keyless = _keyless(services, environ)
    problems = key_problems(keyless, environ)
    probed = [s for s in services if s not in keyless]  # a service without its key is not worth a request
    problems += [p for p in await asyncio.gather(*(_probe(s, environ) for s in probed)) if p]
    if problems:
        raise PreflightError(problems)


def preflight(tool_env: tool_env_lib.ToolEnv, *, policy: str | None = None, policy_url: str | None = None,
              policy_key_env: str | None = None, environ: Mapping[str, str] | None = None) -> list[Service]:
    """Checks every remote service of a run before it starts; returns the services checked.

    Must not be called from a running event loop (use `apreflight(live_services(...))` there).

    Raises:
        PreflightError: listing every missing key and every service that did not answer as it should.
    """
    services = live_services(tool_env, policy=policy, policy_url=policy_url, policy_key_env=policy_key_env)
    if services:
        asyncio.run(apreflight(services, environ=environ))
    return services
