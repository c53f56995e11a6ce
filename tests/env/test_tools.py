import datetime as dt

import pytest

from ranger_jax.env import parsing, tools
from ranger_jax.env.backends import base

TODAY = dt.date(2025, 12, 1)


def check(name, **arguments):
    return tools.check_call(parsing.ToolCall(name, arguments), today=TODAY, news=True)


def test_canonical_calls():
    assert check("text_search", queries=["a", "b", "a"], top_k=3) == tools.TextSearch(("a", "b"), 3)
    assert check("image_search", query=" red tower ") == tools.ImageSearch("red tower", 5)
    assert check("web_fetch", url="https://x.org/a", prompt="when?") == tools.WebFetch(("https://x.org/a",), "when?")
    assert check("crop_image", img_id="img_3", bbox=[0, 0, 0.5, 0.5]) == tools.CropImage("IMG_003", [0, 0, 0.5, 0.5])


def test_gen_searcher_aliases():
    assert check("search", query="a") == tools.TextSearch(("a",), 5)
    assert check("search", queries="a b", top_k=10.0) == tools.TextSearch(("a b",), tools.MAX_TEXT_TOP_K)
    assert check("browse", url=["https://a.org", "https://b.org"], goal="g") == tools.WebFetch(
        ("https://a.org", "https://b.org"), "g")
    assert check("visit", url="https://a.org", query="q") == tools.WebFetch(("https://a.org",), "q")
    assert check("image_search", queries=["tower"], top_k=5) == tools.ImageSearch("tower", 5)


def test_date_filters():
    assert check("text_search", queries=["a"], time_range="past week").tbs == "qdr:w"
    assert check("image_search", query="a", time_range="month").tbs == "qdr:m"
    tbs = "cdr:1,cd_min:11/01/2025,cd_max:11/30/2025"
    assert check("text_search", queries=["a"], tbs=tbs, news=True) == tools.TextSearch(("a",), 5, tbs, True)


@pytest.mark.parametrize("name, arguments, match", [
    ("fly", {}, "unknown tool 'fly'.*text_search"),
    ("text_search", {}, "needs 'queries'"),
    ("text_search", {"queries": []}, "list of 1-3"),
    ("text_search", {"queries": ["a", "b", "c", "d"]}, "at most 3"),
    ("text_search", {"queries": [1]}, "non-empty string"),
    ("text_search", {"queries": ["a"], "top_k": "five"}, "whole number"),
    ("text_search", {"queries": ["a"], "top_k": True}, "whole number"),
    ("text_search", {"queries": ["a"], "top_k": 20}, "'top_k' must be between 1 and 10; got 20"),
    ("search", {"queries": "a", "top_k": 20.0}, "'top_k' must be between 1 and 10; got 20"),
    ("image_search", {"query": "a", "top_k": 0}, "'top_k' must be between 1 and 5; got 0"),
    ("image_search", {"query": "a", "top_k": 99}, "'top_k' must be between 1 and 5; got 99"),
    ("text_search", {"queries": ["a"], "colour": "red"}, r"unknown argument\(s\) \['colour'\]"),
    ("text_search", {"queries": ["a"], "query": "b"}, "only one of"),
    ("text_search", {"queries": ["a"], "time_range": "decade"}, "time_range"),
    ("text_search", {"queries": ["a"], "tbs": "2025-01-01"}, "not a date filter"),
    ("text_search", {"queries": ["a"], "tbs": "qdr:w", "time_range": "day"}, "either"),
    ("text_search", {"queries": ["a"], "news": "yes"}, "true or false"),
    ("text_search", {"queries": ["a"], "top_k": float("nan")}, "whole number"),
    ("text_search", {"queries": ["a"], "top_k": float("inf")}, "whole number"),
    ("text_search", {"queries": ["a"], "top_k": 2.5}, "whole number"),
    ("text_search", {"queries": ["a"], "tbs": "qdr:d99999999999"}, "not a date filter"),
    ("text_search", {"queries": ["a"], "tbs": "cdr:1,cd_min:12/01/2025,cd_max:11/01/2025"}, "after it ends"),
    ("text_search", {"queries": ["a"], "tbs": "cdr:1,cd_min:02/30/2025,cd_max:03/01/2025"}, "impossible date"),
    ("crop_image", {"img_id": "IMG_" + "1" * 5000, "bbox": [0, 0, 1, 1]}, "IMG_003"),
    ("text_search", {"queries": ["a", "x " * 2000]}, r"'queries\[1\]' is 3999 characters long; at most 2048"),
    ("image_search", {"query": "x" * 3000}, "'query' is 3000 characters long"),
    ("web_fetch", {"url": "https://a.org/" + "x" * 9000, "prompt": "p"}, r"'url\[0\]' is 9014 characters long"),
    ("web_fetch", {"url": "https://a.org/", "prompt": "p" * 5000}, "'prompt' is 5000 characters long; at most 4096"),
    ("image_search", {"query": ["a", "b"]}, "one query"),
    ("image_search", {"top_k": 3}, "needs 'query'"),
    ("web_fetch", {"prompt": "x"}, "needs 'url'"),
    ("web_fetch", {"url": "https://a.org"}, "needs 'prompt'"),
    ("web_fetch", {"url": ["https://a.org"] * 6, "prompt": "x"}, "at most 5"),
    ("crop_image", {"bbox": [0, 0, 1, 1]}, "needs 'img_id'"),
    ("crop_image", {"img_id": "the cat", "bbox": [0, 0, 1, 1]}, "IMG_003"),
    ("crop_image", {"img_id": "IMG_001"}, "needs 'bbox'"),
])
def test_argument_errors(name, arguments, match):
    with pytest.raises(tools.ArgumentError, match=match):
        check(name, **arguments)


def test_top_k_and_date_filter_edges():
    assert check("text_search", queries=["a"], top_k=10).top_k == tools.MAX_TEXT_TOP_K
    with pytest.raises(tools.ArgumentError, match="'top_k' must be between 1 and 10; got a 1329-bit number"):
        check("text_search", queries=["a"], top_k=10 ** 400)
    with pytest.raises(tools.ArgumentError, match="'top_k' must be between 1 and 5; got -3"):
        check("image_search", query="a", top_k=-3)
    assert base.parse_tbs("qdr:y9999", TODAY) == (dt.date.min, TODAY)  # before year 1: everything up to today
    assert base.parse_tbs(" qdr:m6 ", TODAY) == (TODAY - dt.timedelta(days=186), TODAY)


def test_disabled_tool_is_unknown():
    with pytest.raises(tools.UnknownTool, match="available tools"):
        tools.check_call(parsing.ToolCall("crop_image", {}), enabled=("text_search",), today=TODAY)


def test_schemas_are_openai_function_tools():
    schemas = tools.tool_schemas(news=False)
    assert [s["function"]["name"] for s in schemas] == list(tools.TOOL_NAMES)
    for schema in schemas:
        assert schema["type"] == "function"
        params = schema["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
    assert "news" not in schemas[0]["function"]["parameters"]["properties"]
    assert "news" in tools.tool_schemas(news=True)[0]["function"]["parameters"]["properties"]
    assert [s["function"]["name"] for s in tools.tool_schemas(tools=("crop_image",))] == ["crop_image"]
