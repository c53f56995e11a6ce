"""JsonCache and write_atomic."""
import json
import os
import stat

from ranger_jax.clients import cache


def test_request_key_is_canonical():
    assert cache.request_key("ns", {"a": 1, "b": [1, 2]}) == cache.request_key("ns", {"b": [1, 2], "a": 1})
    assert cache.request_key("ns", {"a": 1}) != cache.request_key("other", {"a": 1})
    assert len(cache.request_key("ns", "x")) == 64


def test_put_get_roundtrip_miss_and_disabled(tmp_path):
    store = cache.JsonCache(tmp_path, "chat")
    assert store.get({"q": 1}) is None
    store.put({"q": 1}, {"answer": [1, "two"]})
    assert store.get({"q": 1}) == {"answer": [1, "two"]}
    assert cache.JsonCache(tmp_path, "other").get({"q": 1}) is None
    disabled = cache.JsonCache(None, "chat")
    disabled.put({"q": 1}, {"x": 1})
    assert disabled.get({"q": 1}) is None


def test_corrupt_entry_is_a_miss_and_gets_replaced(tmp_path):
    store = cache.JsonCache(tmp_path, "chat")
    store.put({"q": 2}, {"v": 1})
    (entry,) = list(tmp_path.rglob("*.json"))
    entry.write_text("{not json")
    assert store.get({"q": 2}) is None
    store.put({"q": 2}, {"v": 2})
    assert json.loads(entry.read_text())["response"] == {"v": 2}


def test_write_atomic_leaves_no_temporary_and_readable_mode(tmp_path):
    target = tmp_path / "sub" / "file.bin"
    cache.write_atomic(target, b"abc")
    cache.write_atomic(str(target), b"def")
    assert target.read_bytes() == b"def"
    assert os.listdir(target.parent) == ["file.bin"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
