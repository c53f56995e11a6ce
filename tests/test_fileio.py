"""write_atomic: the destination holds exactly the new bytes, no temporary is left, the mode is 0o644."""

import os
import stat

import pytest

from ranger_jax import fileio


def test_write_atomic_leaves_no_temporary_and_readable_mode(tmp_path):
    target = tmp_path / "sub" / "file.bin"
    fileio.write_atomic(target, b"abc")
    fileio.write_atomic(str(target), b"def")
    assert target.read_bytes() == b"def"
    assert os.listdir(target.parent) == ["file.bin"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    target = tmp_path / "file.bin"
    fileio.write_atomic(target, b"old")
    with pytest.raises(TypeError):
        fileio.write_atomic(target, "not bytes")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["file.bin"]
