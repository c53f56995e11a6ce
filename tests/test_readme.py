"""The README's promises: its install commands, the files it links, and every example of "Use it as a library"."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text("utf-8")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
LIBRARY_SECTION = "## Use it as a library"


def _section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def _examples() -> list[tuple[str, str]]:
    """(subsection title, code) of each python block in the library section."""
    examples = []
    for part in _section(README, LIBRARY_SECTION).split("\n### ")[1:]:
        title = part.splitlines()[0]
        examples += [(title, code) for lang, code in FENCE.findall(part) if lang == "python"]
    return examples


EXAMPLES = _examples()


def test_each_user_group_has_an_example():
    assert [title for title, _ in EXAMPLES] == [
        "Write your own agent", "Load, run and save the model", "Record trajectories: rollouts"]


def test_write_your_own_agent_is_a_short_loop_from_make_to_a_score():
    code = dict(EXAMPLES)["Write your own agent"]
    assert len(code.strip().splitlines()) <= 25
    for step in ("env.make(", ".reset(", ".observe(", ".step(", ".score("):
        assert step in code, step


@pytest.mark.parametrize("code", [code for _, code in EXAMPLES], ids=[title.split(":")[-1].strip().split()[-1]
                                                                    for title, _ in EXAMPLES])
def test_library_example_runs(code, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # "runs as written in an empty folder"
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out.strip()  # every example prints what it made


def test_install_commands_use_the_tested_pins():
    lang, block = FENCE.findall(README)[0]
    assert lang == "bash"
    first, second = block.strip().splitlines()
    for command in (first, second):
        words = shlex.split(command)
        assert words[:3] == ["python3.11", "-m", "venv"]
        assert "-c" in words and words[words.index("-c") + 1] == "constraints.txt"
    assert ".[test]" in shlex.split(second) and second.endswith(".venv/bin/python -m pytest -n 2 --dist loadfile")
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert pins["torch"] == "2.13.0" and pins["jax"] == "0.10.2"


DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_relative_links_resolve(document):
    text = (ROOT / document).read_text("utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (ROOT / document).parent.joinpath(target).exists(), f"{document} links to missing {target}"
