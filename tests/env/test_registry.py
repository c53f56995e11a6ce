import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ranger_jax import env
from ranger_jax.env import config as config_lib
from ranger_jax.env import registry
from ranger_jax.env.backends import live


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from ranger_jax.env.sim import build

    out = tmp_path_factory.mktemp("world")
    build.main(["--out", str(out), "--tasks", "2", "--seed", "3"])
    return out


def write(tmp_path, text, name="e.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_shipped_files_are_addressed_by_name_and_by_path():
    files = env.env_files()
    assert sorted(files) == ["knowgen_live", "savanna_live", "savanna_sim"]
    assert all(path.is_file() and path.parent.name == "configs" for path in files.values())
    assert registry.find_env_file("savanna_live") == files["savanna_live"]
    assert registry.find_env_file(str(files["savanna_live"])) == files["savanna_live"]
    with env.make(files["knowgen_live"], cache_dir=None) as by_path, env.make("knowgen_live", cache_dir=None) as named:
        assert by_path.config == named.config and by_path.rewards == named.rewards


def test_the_repository_keeps_no_second_copy_of_the_shipped_files():
    root = Path(__file__).resolve().parents[2]
    copies = [p for p in root.rglob("*.toml") if p.name in {f"{n}.toml" for n in env.env_files()}
              and ".venv" not in p.parts and p.parent != registry.CONFIGS_DIR]
    assert copies == []


def test_a_wheel_ships_the_environment_files(tmp_path):
    """`pip install .` (not editable) must carry the files `make("savanna_sim")` reads: they are package data."""
    root, source = Path(__file__).resolve().parents[2], tmp_path / "source"
    shutil.copytree(root / "ranger_jax", source / "ranger_jax", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):  # a copy: building in place would leave build/ in the checkout
        shutil.copy(root / name, source / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, cwd=tmp_path)
    if build.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {build.stderr[-300:]}")
    wheel, = (tmp_path / "dist").glob("ranger_jax-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"ranger_jax/env/configs/{n}.toml" for n in env.env_files()} <= names


@pytest.mark.parametrize("name", ["savanna_live", "knowgen_live"])
def test_shipped_live_files_load(name):
    with env.make(name, max_turns=4, cache_dir=None) as tool_env:
        assert isinstance(tool_env.backend, live.LiveBackend)
        assert tool_env.config.max_turns == 4 and tool_env.config.max_tool_calls == 8
        assert tool_env.rewards["kind"] == "judge"


def test_shipped_sim_file_and_offline_name(world):
    with env.make("savanna_sim", world=str(world)) as tool_env:
        task_row = json.loads((world / "tasks.jsonl").read_text().splitlines()[0])
        task = env.Task(task_row["id"], task_row["prompt"])
        assert tool_env.reset(task).today == tool_env.backend.today  # the world's own date
        assert tool_env.rewards["kind"] == "sim"
        state, obs = tool_env.step(tool_env.reset(task), '<tool_call>{"name": "image_search", "arguments": '
                                                        f'{{"query": "{task_row["target_name"]}"}}}}</tool_call>')
        assert obs.images and state.images["IMG_001"].root_url == state.images["IMG_001"].url
    with env.make("offline", world=str(world), max_tool_calls=3) as tool_env:
        assert tool_env.config.max_tool_calls == 3


def test_options_override_the_file(tmp_path):
    path = write(tmp_path, 'backend = "live"\n[backend_options]\nfetch_timeout_s = 9.0\n'
                           '[env]\nmax_turns = 3\ntools = ["text_search", "crop_image"]\n[rewards]\ntext_coef = 0.2\n')
    with env.make(path, max_turns=6, text_coef=0.7, fetch_timeout_s=2.0, max_image_bytes=12345) as tool_env:
        assert tool_env.config.max_turns == 6 and tool_env.config.tools == ("text_search", "crop_image")
        assert tool_env.rewards["text_coef"] == 0.7 and tool_env.backend.fetcher.timeout_s == 2.0
        assert tool_env.store.max_bytes == 12345 == tool_env.backend.fetcher.max_image_bytes
        assert [s["function"]["name"] for s in tool_env.tool_schemas()] == ["text_search", "crop_image"]


@pytest.mark.parametrize("text, match", [
    ('backend = "live"\nbackground = 1\n', r"unknown key 'background'; known top-level keys"),
    ('backend = "live"\n[env]\nmax_turn = 3\n', r"unknown key 'max_turn' in \[env\]; known keys: \['tools'"),
    ('backend = "live"\n[backend_options]\nworld = "x"\n',
     r"unknown key 'world' in \[backend_options\] for backend 'live'; known keys: \['serper_api_key'"),
    ('backend = "offline"\n[backend_options]\nserper_base_url = "x"\n', r"unknown key 'serper_base_url'"),
    ('backend = "live"\n[rewards]\nalpha = 0.5\n', r"unknown reward key 'alpha'; known keys"),
    ('backend = "live"\n[rewards]\ntext_coef = "high"\n', r"reward key 'text_coef' has the wrong type"),
    ('backend = "live"\n[env]\nmax_turns = 0\n', r"max_turns must be a positive integer; got 0"),
    ('backend = "live"\n[env]\ntools = ["search"]\n', r"must be a non-empty subset"),
    ('backend = "web"\n', r"unknown backend 'web'; known backends: \['live', 'offline'\]"),
    ('[env]\nmax_turns = 3\n', r"'backend' must name a backend"),
    ('backend = "live"\nenv = 3\n', r"'env' must be a table"),
    ('backend = "live"\n[env\n', r"not valid TOML"),
])
def test_bad_files_name_the_file_and_key(tmp_path, text, match):
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=match) as info:
        env.make(path)
    assert path in str(info.value)


def test_bad_names_and_options():
    with pytest.raises(ValueError, match=r"unknown environment 'web'; use a backend \['live', 'offline'\], a "
                                         r"shipped environment \['knowgen_live', 'savanna_live', 'savanna_sim'\]"):
        env.make("web")
    with pytest.raises(FileNotFoundError, match=r"envs/nope.toml does not exist; shipped environments: "
                                                r"\['knowgen_live'"):
        env.make("envs/nope.toml")
    with pytest.raises(ValueError, match=r"env 'live': unknown option 'wrld'"):
        env.make("live", wrld="x")
    with pytest.raises(ValueError, match=r"backend 'offline' needs option\(s\) \['world'\]"):
        env.make("offline")
    with pytest.raises(ValueError, match="max_tool_calls must be a positive integer"):
        env.make("live", max_tool_calls=-1)
    with pytest.raises(ValueError, match="allow_hosts entries"):
        env.make("live", allow_hosts=("",))


def test_world_must_be_a_world_folder(world, tmp_path):
    with pytest.raises(ValueError, match=rf"world '{world / 'tasks.jsonl'}' is a file, not a world folder; .* "
                                         rf"perhaps '{world}'"):
        env.make("savanna_sim", world=str(world / "tasks.jsonl"))
    with pytest.raises(FileNotFoundError, match=rf"world folder '{tmp_path / 'nope'}' does not exist"):
        env.make("offline", world=tmp_path / "nope")


def test_every_option_name_has_one_home():
    env_keys, reward_keys = set(config_lib.ENV_KEYS), set(config_lib.REWARD_KEYS)
    assert not env_keys & reward_keys
    assert set(live.LIVE_OPTIONS) & (env_keys | reward_keys) == {"max_image_bytes"}  # shared on purpose


@pytest.mark.parametrize("options, match", [
    ({"tools": "text_search"}, "tools must be a list of tool names"),
    ({"tools": ["text_search", "text_search"]}, "names a tool more than once"),
    ({"final_answer_turn": "no"}, "final_answer_turn must be true or false"),
    ({"image_store": 5}, "image_store must be a string or None; got 5"),
    ({"summarizer_url": 7}, "summarizer_url must be a string or None"),
    ({"summarizer_model": ""}, "summarizer_model must be a non-empty string"),
    ({"max_response_chars": True}, "max_response_chars must be a positive integer or None"),
    ({"kind": "vibes"}, r"reward kind 'vibes' is not one of \['sim', 'judge'\]"),
    ({"text_coef": 1.5}, r"'text_coef' must be in \[0, 1\]; got 1.5"),
    ({"coverage_min": 0}, r"'coverage_min' must be in \(0, 1\]; got 0"),
    ({"rival_max": 2.0}, r"'rival_max' must be in \(0, 1\]"),
    ({"min_references": -1}, "'min_references' must be >= 0; got -1"),
    ({"max_references": 4}, "unknown option 'max_references'"),
    ({"fetch_timeout_s": "x"}, "'fetch_timeout_s' must be a positive number of seconds"),
    ({"timeout_s": float("nan")}, "'timeout_s' must be a positive number of seconds"),
    ({"max_page_bytes": 0}, "'max_page_bytes' must be an integer >= 1"),
    ({"max_redirects": -1}, "'max_redirects' must be an integer >= 0"),
    ({"gl": 5}, "'gl' must be a string or None"),
    ({"serper_base_url": ""}, "'serper_base_url' must be a non-empty string"),
    ({"cache_dir": 3}, "'cache_dir' must be a path or None"),
    ({"allow_hosts": 5}, "'allow_hosts' must be a list"),
])
def test_option_values_are_checked_at_make(options, match):
    with pytest.raises(ValueError, match=match) as info:
        env.make("live", **options)
    assert str(info.value).startswith("env 'live': ")


def test_option_values_in_a_file_name_the_file(tmp_path):
    path = write(tmp_path, 'backend = "live"\n[backend_options]\nfetch_timeout_s = -1\n')
    with pytest.raises(ValueError, match=r"e\.toml: live backend option 'fetch_timeout_s'"):
        env.make(path)
    path = write(tmp_path, 'backend = "live"\n[rewards]\nshare_min = 1.2\n', name="r.toml")
    with pytest.raises(ValueError, match=r"r\.toml: reward key 'share_min' must be in \(0, 1\]"):
        env.make(path)
    for key in ("max_references", "max_ref_images"):  # the reference limit has one name: [env] max_answer_refs
        path = write(tmp_path, f'backend = "live"\n[rewards]\n{key} = 4\n', name="old.toml")
        with pytest.raises(ValueError, match=rf"old\.toml: reward key '{key}' is gone; the limit on an answer's "
                                             r"references is \[env\] max_answer_refs"):
            env.make(path)


def test_a_single_allowed_host_string_is_one_entry():
    with env.make("live", allow_hosts="127.0.0.1:8080") as tool_env:
        assert tool_env.backend.guard.allow_hosts == frozenset({("127.0.0.1", 8080)})
