"""JsonCache: canonical request keys, round trips, misses and corrupt entries."""
import json

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

