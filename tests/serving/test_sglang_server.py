"""SGLang servers as managed subprocesses: the flags each kind is started with, the real process management run
against a stand-in `sglang` executable on PATH (health, logs, stop), the errors for a missing executable, a
server that exits and one that never becomes healthy, replicas behind the router, and the clients over them."""

from __future__ import annotations

import os

import numpy as np
import pytest
from support import sglang_standin

from ranger_jax.clients import images, sglang, sglang_pool
from ranger_jax.parallel.distributed import free_port
from ranger_jax.serving import sglang_server as srv


@pytest.fixture(scope="module")
def path_env(tmp_path_factory):
    """PATH with the stand-in `sglang` first, and PYTHONPATH with the stand-in router package."""
    root = tmp_path_factory.mktemp("standin")
    sglang_standin.install(root / "bin")
    sglang_standin.install_router(root / "py")
    return {"PATH": f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": f"{root / 'py'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_commands_carry_the_flags_that_matter():
    policy = srv.PolicyServer(model_path="/w/v000003", host="0.0.0.0", port=30001, tp_size=2, mem_fraction_static=0.7,
                              load_format="dummy", deterministic=True, context_length=40960, api_key="k",
                              extra_args=("--chunked-prefill-size", "8192"))
    assert policy.args() == ["serve", "--model-type", "llm", "--model-path", "/w/v000003", "--host", "0.0.0.0",
                             "--port", "30001", "--tp-size", "2", "--mem-fraction-static", "0.7", "--load-format",
                             "dummy", "--enable-deterministic-inference", "--context-length", "40960", "--api-key", "k",
                             "--chunked-prefill-size", "8192"]
    diffusion = srv.DiffusionServer(model_path="Qwen/Qwen-Image-Edit-2511", port=30010, num_gpus=2, sp_degree=2)
    assert diffusion.args() == ["serve", "--model-type", "diffusion", "--model-path", "Qwen/Qwen-Image-Edit-2511",
                                "--host", "127.0.0.1", "--port", "30010", "--num-gpus", "2", "--sp-degree", "2"]
    router = srv.RouterServer(worker_urls=("http://a:1", "http://b:1"), port=30000)
    assert router.args() == ["-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", "30000",
                             "--worker-urls", "http://a:1", "http://b:1", "--policy", "cache_aware"]
    with pytest.raises(ValueError, match="mem_fraction_static must be in"):
        srv.PolicyServer(model_path="m", mem_fraction_static=1.5)
    with pytest.raises(ValueError, match="policy='fastest'; known policies"):
        srv.RouterServer(worker_urls=("http://a:1",), policy="fastest")


def test_a_missing_executable_says_where_it_looked_and_how_to_install(tmp_path):
    spec = srv.PolicyServer(model_path="m")
    with pytest.raises(srv.ExecutableNotFound, match=r"no `sglang` executable on PATH and \$RANGER_SGLANG_BIN is not "
                                                     r"set; install SGLang in its own virtual environment"):
        srv.find_executable(spec, environ={"PATH": str(tmp_path)})
    with pytest.raises(srv.ExecutableNotFound, match=f"SGLang executable {tmp_path}/nope does not exist"):
        srv.ManagedServer(spec, log_path=tmp_path / "log", env={"RANGER_SGLANG_BIN": str(tmp_path / "nope")})


def test_policy_server_starts_answers_logs_and_stops(path_env, tmp_path):
    spec = srv.PolicyServer(model_path="/models/tiny", port=free_port(), load_format="dummy", deterministic=True)
    server = srv.ManagedServer(spec, log_path=tmp_path / "policy.log", env=path_env, poll_s=0.1)
    with server:
        assert server.healthy()
        with sglang.SGLangClient(server.url) as client:
            result = client.generate([1, 2, 3], sampling_params={"max_new_tokens": 8})
            info = client.get_server_info()
        assert result.output_ids.tolist() == [4, 5, 6] and result.weight_version == "default"
        assert info.deterministic_inference is True and "--load-format" in info.raw["flags"]
    assert server.process.returncode is not None and not server.healthy()
    text = (tmp_path / "policy.log").read_text()
    assert "serve --model-type llm --model-path /models/tiny" in text and "POST /generate" in text


def test_a_server_that_exits_during_start_up_is_reported_with_its_log(path_env, tmp_path):
    spec = srv.PolicyServer(model_path="m", port=free_port())
    server = srv.ManagedServer(spec, log_path=tmp_path / "p.log", env={**path_env, "STANDIN_EXIT": "3"}, poll_s=0.1)
    with pytest.raises(srv.ServerExited, match=r"exited with status 3 during start-up(.|\n)*CUDA out of memory") as err:
        server.__enter__()
    assert err.value.returncode == 3


def test_a_server_never_healthy_is_stopped_and_reported(path_env, tmp_path):
    spec = srv.PolicyServer(model_path="m", port=free_port())
    server = srv.ManagedServer(spec, log_path=tmp_path / "p.log", env={**path_env, "STANDIN_NEVER_HEALTHY": "1"},
                               startup_timeout_s=1.5, poll_s=0.2)
    with pytest.raises(srv.ServerNotHealthy, match=r"/health did not answer 200 within 2 s \(server stopped\)"
                                                   r"(.|\n)*GET /health -> 503"):
        server.__enter__()
    assert server.process.poll() is not None


def test_diffusion_server_and_the_image_client(path_env, tmp_path):
    spec = srv.DiffusionServer(model_path="Qwen/Qwen-Image", port=free_port())
    with srv.ManagedServer(spec, log_path=tmp_path / "d.log", env={**path_env, "STANDIN_WARMUP_S": "0.5"},
                           poll_s=0.1) as server:
        result = images.SGLangImageGenerator(server.url, size="96x64").generate("a lighthouse")
    assert result.ok and result.image.startswith(b"\x89PNG")


def test_replicas_behind_the_router_and_as_a_pool(path_env, tmp_path):
    ports = [free_port(), free_port()]
    replicas = srv.start_replicas([srv.PolicyServer(model_path="m", port=p) for p in ports], log_dir=tmp_path,
                                  envs=[path_env, path_env])
    urls = [r.url for r in replicas]
    router = srv.ManagedServer(srv.RouterServer(worker_urls=tuple(urls), port=free_port()),
                               log_path=tmp_path / "router.log", env=path_env, poll_s=0.1)
    try:
        with router:
            with sglang_pool.connect(router.url) as client:  # one URL: a plain client
                served = [client.generate([7, i]).meta_info["served_by"] for i in range(4)]
            assert sorted(served) == sorted(ports * 2)  # the router spread the requests over both replicas
        with sglang_pool.connect(",".join(urls)) as pool:
            by_episode = {e: {pool.generate([7], rid=f"ep{e}#{t}").meta_info["served_by"] for t in range(3)}
                          for e in range(4)}
            assert all(len(s) == 1 for s in by_episode.values())  # every turn of an episode on one server
            assert pool.sent == [6, 6] and pool.health()
            updates = pool.update_weights_from_disk(str(tmp_path / "none"))
    except sglang.WeightUpdateFailed as err:
        assert "no config.json" in str(err)
    else:
        pytest.fail(f"an update from a folder without config.json succeeded: {updates}")
    finally:
        for server in replicas:
            server.stop()
    assert np.all([r.process.returncode is not None for r in replicas])


def test_the_command_line_runs_replicas_until_terminated(path_env, tmp_path):
    import signal
    import subprocess
    import sys

    port = free_port()
    env = {**os.environ, **path_env}
    proc = subprocess.Popen([sys.executable, "-m", "ranger_jax.serving.sglang_server", "policy", "--model-path", "m",
                             "--host", "127.0.0.1", "--port", str(port), "--replicas", "2", "--gpus", "2", "--log-dir",
                             str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        urls = proc.stdout.readline().split()
        assert urls == [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
        with sglang.SGLangClient(urls[1]) as client:
            assert client.health()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    log = (tmp_path / f"policyserver-{port + 1}.log").read_text()
    assert "--tp-size 2" in log and "CUDA_VISIBLE_DEVICES=2,3" in log  # the second replica owns GPUs 2 and 3
