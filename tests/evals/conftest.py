"""Fixtures of the eval tests: one loopback server with a scripted judge and an SGLang images API
(`support.eval_services`)."""

import pytest

from support.eval_services import GeneratorServer, JudgeServer
from support.loopback import LoopbackServer, Reply


@pytest.fixture(scope="module")
def loopback():
    with LoopbackServer() as server:
        yield server


@pytest.fixture()
def services(loopback):
    """Fresh judge and generator handlers on the module's server: `services.judge`, `services.generator`,
    `services.judge_url`, `services.url`."""
    loopback.judge, loopback.generator = JudgeServer(), GeneratorServer()
    loopback.route("POST", "/v1/chat/completions", loopback.judge)
    loopback.route("GET", "/v1/models", lambda req: Reply.json({"object": "list", "data": []}))
    loopback.route("POST", "/v1/images/generations", loopback.generator.generations)
    loopback.route("POST", "/v1/images/edits", loopback.generator.edits)
    loopback.route("GET", "/health", lambda req: Reply.text("ok"))
    loopback.judge_url = f"{loopback.url}/v1"
    return loopback
