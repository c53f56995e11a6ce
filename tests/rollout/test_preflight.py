"""Live runs: each service has its own key, and a missing key or a service that does not answer stops the run at
start, naming it. One loopback server on 127.0.0.1 plays Serper, the judge, the SGLang image server and the SGLang
policy server; the production clients and the preflight probes run against it."""

import json

import pytest
from support import fixtures
from support.loopback import LoopbackServer, Reply
from support.tiny_tokenizer import qwen3_tokenizer_dir

from ranger_jax import env
from ranger_jax.clients import images
from ranger_jax.rewards import env_reward
from ranger_jax.rollout import actor, preflight, scoring

KEYS = {"SERPER_API_KEY": "serper-key", "OPENAI_API_KEY": "judge-key", "GEN_KEY": "gen-key", "POLICY_KEY": "pol"}


def _bearer(expected, reply):
    def handler(request):
        if request.headers.get("Authorization") != f"Bearer {expected}":
            return Reply.json({"error": {"message": "Incorrect API key provided"}}, status=401)
        return reply
    return handler


@pytest.fixture
def services():
    with LoopbackServer() as srv:
        srv.route("POST", "/search", lambda r: Reply.json({"organic": [{"title": "t", "link": "https://a.org"}]})
                  if r.headers.get("X-API-KEY") == "serper-key" else
                  Reply.json({"message": "Unauthorized.", "statusCode": 403}, status=403))
        srv.route("GET", "/v1/models", _bearer("judge-key", Reply.json({"object": "list", "data": [{"id": "j"}]})))
        srv.route("GET", "/health", lambda r: Reply())
        srv.route("POST", "/v1/images/generations",
                  _bearer("gen-key", Reply.json(fixtures.load("sglang_images_generations_response"))))
        yield srv


@pytest.fixture
def live_env(services, monkeypatch):
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    options = dict(serper_base_url=services.url, judge_url=f"{services.url}/v1", generator_url=services.url,
                   generator_api_key_env="GEN_KEY", cache_dir=None)
    with env.make("savanna_live", **options) as tool_env:
        yield tool_env


def test_shipped_live_files_name_every_service_and_its_key():
    for name, kind in (("savanna_live", "sglang"), ("knowgen_live", "gen_searcher")):
        settings = env.make(name, cache_dir=None)
        with settings:
            rewards = settings.rewards
            assert rewards["generator_kind"] == kind and rewards["judge_api_key_env"] == "OPENAI_API_KEY"
            assert rewards["judge_url"].endswith("/v1") and rewards["judge_model"] and rewards["generator_url"]
            assert settings.backend.search.api_key_env == "SERPER_API_KEY"
            roles = [s.role for s in preflight.live_services(settings)]
            assert roles == ["search", "judge", "generator"]


def test_generator_kind_selects_the_client_and_each_service_gets_its_own_key(live_env, services):
    reward = env_reward.make_reward(live_env)
    assert isinstance(reward.reward.generator, images.SGLangImageGenerator)
    result = reward.reward.generator.generate("a red lighthouse")
    assert result.ok, result.error
    assert services.requests[-1].headers["Authorization"] == "Bearer gen-key"  # not the judge's, not the policy's
    judge_client = reward.reward.image_judge.judge.client
    assert judge_client.session.headers["Authorization"] == "Bearer judge-key"
    with env.make("knowgen_live", cache_dir=None, generator_url=[services.url, services.url]) as knowgen:
        generator = env_reward.make_reward(knowgen).reward.generator
        assert isinstance(generator, images.GenSearcherGenerator) and len(generator.sessions) == 2
    with pytest.raises(ValueError, match=r"generator_kind 'gen_searcher' takes no API key"):
        env.make("knowgen_live", generator_api_key_env="GEN_KEY")
    with pytest.raises(ValueError, match=r"generator_kind 'sglang' takes one generator_url"):
        env.make("savanna_live", generator_url=["http://a", "http://b"])
    with pytest.raises(ValueError, match=r"generator_kind 'dalle' is not one of \['sglang', 'gen_searcher'\]"):
        env.make("savanna_live", generator_kind="dalle")


def test_an_unset_key_variable_fails_when_the_reward_is_made(live_env):
    with pytest.raises(ValueError, match=r"\$OPENAI_API_KEY is not set \(judge_api_key_env names it as the key of "
                                         r"the judge\)"):
        env_reward.make_reward(live_env, environ={})
    with pytest.raises(ValueError, match=r"\$GEN_KEY is not set \(generator_api_key_env"):
        env_reward.make_reward(live_env, environ={"OPENAI_API_KEY": "judge-key"})
    with env.make("savanna_live", cache_dir=None, judge_api_key_env="NO_SUCH_KEY_VARIABLE") as other:
        with pytest.raises(ValueError, match=r"\$NO_SUCH_KEY_VARIABLE is not set"):  # at the actor's start
            scoring.make_scorer(other, ground_truth=lambda task: None)


def test_preflight_passes_when_every_service_answers(live_env, services):
    checked = preflight.preflight(live_env, policy="sglang", policy_url=services.url, policy_key_env="POLICY_KEY")
    assert [s.role for s in checked] == ["policy", "search", "judge", "generator"]
    assert services.count("POST", "/search") == 1 and services.count("GET", "/v1/models") == 1
    assert services.count("GET", "/health") == 2  # the policy server and the image server
    assert all(r.headers.get("Host", "").startswith("127.0.0.1") for r in services.requests)


def test_missing_keys_are_named_and_their_services_not_contacted(live_env, services):
    with pytest.raises(preflight.PreflightError) as info:
        preflight.preflight(live_env, environ={"GEN_KEY": "gen-key"})
    assert info.value.problems == [f"judge ({services.url}/v1): $OPENAI_API_KEY is not set"]
    assert services.count("GET", "/v1/models") == 0 and services.count("GET", "/health") == 1


def test_refused_keys_and_dead_services_are_named(live_env, services, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "stale")
    services.fail_next("POST", "/search", Reply.json({"message": "Not enough credits"}))
    with LoopbackServer() as gone:
        dead = gone.url
    with pytest.raises(preflight.PreflightError) as info:
        preflight.preflight(live_env, policy="harness", policy_url=f"{dead}/v1")
    text = str(info.value)
    assert text.startswith("the run cannot start:\n- ")
    assert f"policy ({dead}/v1): unreachable" in text
    assert "search" in text and "answered without results (Not enough credits)" in text
    assert f"judge ({services.url}/v1): refused the key from $OPENAI_API_KEY (HTTP 401" in text
    assert len(info.value.problems) == 3  # the generator answered


def test_a_live_env_without_a_search_key_never_starts_a_run(services, monkeypatch, tmp_path):
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "judge-key")
    env_file = tmp_path / "live.toml"
    env_file.write_text(env.env_files()["savanna_live"].read_text()
                        .replace('"https://google.serper.dev"', json.dumps(services.url))
                        .replace('"https://api.openai.com/v1"', json.dumps(f"{services.url}/v1"))
                        .replace('"http://127.0.0.1:30010"', json.dumps(services.url)))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "k1", "prompt": "The new red lighthouse.", "gt_image": "gt.png"}\n')
    args = ["--env", str(env_file), "--tasks", str(tasks), "--policy", "sglang", "--sglang-url", services.url,
            "--tokenizer", str(qwen3_tokenizer_dir()), "--out", str(tmp_path / "out"), "--quiet"]
    with pytest.warns(UserWarning, match="no Serper API key"), pytest.raises(SystemExit) as info:
        actor.main(args)
    assert f"search ({services.url}): $SERPER_API_KEY is not set" in str(info.value.code)
    assert not (tmp_path / "out").exists() and services.count("POST", "/generate") == 0
