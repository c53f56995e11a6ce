"""The tools: their JSON schemas, Gen-Searcher aliases, and argument checking into typed calls.

`text_search(queries, top_k)`, `image_search(query, top_k)`, `web_fetch(url, prompt)`, `crop_image(img_id, bbox)`,
and the optional perception aid `find_object(description)` (offered only by backends that can recognise objects
from pixels, see `env.perception`; not in the default set).
Gen-Searcher's `search` (`query`/`queries`, str or list) and `browse`/`visit` (`url` or a list of ≤ 5 urls,
`query`/`goal`) map onto them, so their trajectories replay. Optional date filters: `time_range`
(hour|day|week|month|year) or a raw Google `tbs`, checked with `base.parse_tbs`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Any

from ranger_jax.env import parsing
from ranger_jax.env.backends import base

TEXT_SEARCH = "text_search"
IMAGE_SEARCH = "image_search"
WEB_FETCH = "web_fetch"
CROP_IMAGE = "crop_image"
FIND_OBJECT = "find_object"
TOOL_NAMES = (TEXT_SEARCH, IMAGE_SEARCH, WEB_FETCH, CROP_IMAGE)  # the default tool set
ALL_TOOL_NAMES = TOOL_NAMES + (FIND_OBJECT,)
ALIASES = {"search": TEXT_SEARCH, "browse": WEB_FETCH, "visit": WEB_FETCH}
TIME_RANGES = {"hour": "qdr:h", "day": "qdr:d", "week": "qdr:w", "month": "qdr:m", "year": "qdr:y"}
MAX_TEXT_TOP_K = 10
MAX_FETCH_URLS = 5
# Longest argument strings: Google cuts queries at 2048 characters, servers refuse URLs past ~8 KB, and a page
# reader's question needs no more than a paragraph.
MAX_CHARS = {"queries": 2048, "query": 2048, "url": 8192, "prompt": 4096, "tbs": 200, "description": 512}


class ArgumentError(ValueError):
    """Tool arguments the policy got wrong; the message says what and how to fix it."""


class UnknownTool(ArgumentError):
    """A tool name that is neither a tool nor an alias of one enabled in this environment."""


@dataclasses.dataclass(frozen=True)
class TextSearch:
    """A checked `text_search` call: up to `max_queries` queries, `top_k` hits each."""

    queries: tuple[str, ...]
    top_k: int
    tbs: str | None = None
    news: bool = False


@dataclasses.dataclass(frozen=True)
class ImageSearch:
    """A checked `image_search` call."""

    query: str
    top_k: int
    tbs: str | None = None


@dataclasses.dataclass(frozen=True)
class WebFetch:
    """A checked `web_fetch` call: the pages to read and what to look for in them."""

    urls: tuple[str, ...]
    prompt: str


@dataclasses.dataclass(frozen=True)
class CropImage:
    """A checked `crop_image` call: the image to crop and the box (checked against its size)."""

    img_id: str
    bbox: Any  # checked against the image size by images.check_bbox


@dataclasses.dataclass(frozen=True)
class FindObject:
    """A checked `find_object` call: what to look for and in which images."""

    description: str
    img_ids: tuple[str, ...] = ()  # empty: every searched image of the episode


Call = TextSearch | ImageSearch | WebFetch | CropImage | FindObject

_TIME_PROPS = {
    "time_range": {"type": "string", "enum": list(TIME_RANGES),
                   "description": "Only results published within the last hour/day/week/month/year."},
}


def tool_schemas(*, tools: tuple[str, ...] = TOOL_NAMES, max_queries: int = 3, max_images: int = 5,
                 news: bool = False) -> list[dict[str, Any]]:
    """OpenAI function-calling schemas of the enabled tools, in `TOOL_NAMES` order."""
    text_props: dict[str, Any] = {
        "queries": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": max_queries,
                    "description": f"1 to {max_queries} distinct search queries."},
        "top_k": {"type": "integer", "minimum": 1, "maximum": MAX_TEXT_TOP_K, "default": 5,
                  "description": "Results per query."},
        **_TIME_PROPS,
    }
    if news:
        text_props["news"] = {"type": "boolean", "default": False, "description": "Search news articles only."}
    schemas = {
        TEXT_SEARCH: ("Search the web. Returns titles, links, dates and snippets for each query.",
                      text_props, ["queries"]),
        IMAGE_SEARCH: (
            "Search for images. Each shown image gets an id IMG_### that you can cite"
            + (" or crop." if CROP_IMAGE in tools else "."),
            {"query": {"type": "string", "description": "A short image query (a few words)."},
             "top_k": {"type": "integer", "minimum": 1, "maximum": max_images, "default": max_images,
                       "description": "Images to show."},
             **_TIME_PROPS},
            ["query"],
        ),
        WEB_FETCH: (
            "Read a web page and return its text, or the answer to `prompt` found in it.",
            {"url": {"type": "string", "description": "The page URL (http or https)."},
             "prompt": {"type": "string", "description": "What you want to learn from the page."}},
            ["url", "prompt"],
        ),
        CROP_IMAGE: (
            "Crop an image you have seen to a box and get the crop as a new image id.",
            {"img_id": {"type": "string", "description": "The image to crop, e.g. IMG_003."},
             "bbox": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1},
                      "minItems": 4, "maxItems": 4,
                      "description": "[x0, y0, x1, y1] as fractions (0-1) of width and height; x0 < x1, y0 < y1."}},
            ["img_id", "bbox"],
        ),
        FIND_OBJECT: (
            "Find the object that matches a description of its colours and pattern (e.g. \"green with orange "
            "dots\") in the images you have seen, and get a clean crop of the best match as a new image id.",
            {"description": {"type": "string",
                             "description": "Ground colour, then motif colour and pattern, e.g. \"navy with white "
                                            "stripes\"."},
             "img_ids": {"type": "array", "items": {"type": "string"},
                         "description": "Only look in these images (default: every image from image_search)."}},
            ["description"],
        ),
    }
    out = []
    for name in ALL_TOOL_NAMES:
        if name in tools:
            description, props, required = schemas[name]
            out.append({"type": "function", "function": {
                "name": name, "description": description,
                "parameters": {"type": "object", "properties": props, "required": required},
            }})
    return out


def _check_keys(tool: str, args: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(args) - set(allowed))
    if unknown:
        raise ArgumentError(f"{tool} got unknown argument(s) {unknown}; it takes {list(allowed)}")


def _text(tool: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ArgumentError(f"{tool}: {key!r} must be a non-empty string; got {value!r}")
    limit = MAX_CHARS.get(key.split("[", 1)[0])
    if limit is not None and len(value.strip()) > limit:
        raise ArgumentError(f"{tool}: {key!r} is {len(value.strip())} characters long; at most {limit} are allowed "
                            f"(got {value[:80]!r}…)")
    return value.strip()


def _top_k(tool: str, value: Any, default: int, maximum: int) -> int:
    """`top_k` checked to be a whole number in [1, maximum]; out of range is an error the policy reads, so it
    learns the limit instead of getting silently fewer (or more) results than it asked for."""
    if value is None:
        return default
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentError(f"{tool}: 'top_k' must be a whole number; got {value!r}")
    if not 1 <= value <= maximum:
        shown = value if abs(value) < 10**12 else f"a {'negative ' if value < 0 else ''}{value.bit_length()}-bit number"
        raise ArgumentError(f"{tool}: 'top_k' must be between 1 and {maximum}; got {shown}. Ask for at most "
                            f"{maximum} results.")
    return value


def _tbs(tool: str, args: dict[str, Any], today: dt.date) -> str | None:
    time_range, tbs = args.get("time_range"), args.get("tbs")
    if time_range is not None and tbs is not None:
        raise ArgumentError(f"{tool}: give either 'time_range' or 'tbs', not both")
    if time_range is not None:
        key = str(time_range).strip().lower().removeprefix("past").removeprefix("last").strip(" _-")
        if key not in TIME_RANGES:
            raise ArgumentError(f"{tool}: 'time_range' must be one of {list(TIME_RANGES)}; got {time_range!r}")
        return TIME_RANGES[key]
    if tbs is not None:
        tbs = _text(tool, "tbs", tbs)
        try:
            base.parse_tbs(tbs, today)
        except ValueError as err:
            raise ArgumentError(f"{tool}: {err}") from err
        return tbs
    return None


def _string_list(tool: str, key: str, value: Any, maximum: int) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise ArgumentError(f"{tool}: {key!r} must be a string or a list of 1-{maximum} strings; got {value!r}")
    out = tuple(_text(tool, f"{key}[{i}]", item) for i, item in enumerate(items))
    if len(out) > maximum:
        raise ArgumentError(f"{tool}: at most {maximum} {key} per call; got {len(out)}. Split them over calls.")
    return tuple(dict.fromkeys(out))


def _pick(tool: str, args: dict[str, Any], *keys: str) -> Any:
    """The value of the first of `keys` present (aliases), or None; two aliases at once is an error."""
    present = [k for k in keys if args.get(k) is not None]
    if len(present) > 1:
        raise ArgumentError(f"{tool}: give only one of {present}")
    return args[present[0]] if present else None


def resolve_name(name: str, enabled: tuple[str, ...]) -> str:
    """The canonical tool for `name` (aliases included).

    Raises:
        UnknownTool: an unknown or disabled tool, listing the available ones.
    """
    canonical = ALIASES.get(name, name)
    if canonical not in enabled:
        raise UnknownTool(f"unknown tool {name[:100]!r}; available tools: {list(enabled)}")
    return canonical


def check_call(call: parsing.ToolCall, *, enabled: tuple[str, ...] = TOOL_NAMES, today: dt.date,
               max_queries: int = 3, max_images: int = 5, news: bool = False) -> Call:
    """Validates a parsed tool call into a typed call.

    Args:
        call: name and arguments as the policy wrote them.
        enabled: tools this environment offers.
        today: the date relative filters count from.
        max_queries: queries per text search.
        max_images: images per turn (the image_search top_k cap).
        news: whether the backend offers news search.

    Raises:
        ArgumentError: unknown tool, unknown/missing/mistyped arguments.
    """
    tool = resolve_name(call.name, enabled)
    args = call.arguments
    if tool == TEXT_SEARCH:
        _check_keys(call.name, args, ("queries", "query", "top_k", "time_range", "tbs") + (("news",) if news else ()))
        queries = _pick(call.name, args, "queries", "query")
        if queries is None:
            raise ArgumentError(f"{call.name} needs 'queries': a list of 1-{max_queries} search strings")
        is_news = args.get("news", False)
        if not isinstance(is_news, bool):
            raise ArgumentError(f"{call.name}: 'news' must be true or false; got {is_news!r}")
        return TextSearch(queries=_string_list(call.name, "queries", queries, max_queries),
                          top_k=_top_k(call.name, args.get("top_k"), 5, MAX_TEXT_TOP_K),
                          tbs=_tbs(call.name, args, today), news=is_news)
    if tool == IMAGE_SEARCH:
        _check_keys(call.name, args, ("query", "queries", "top_k", "time_range", "tbs"))
        query = _pick(call.name, args, "query", "queries")
        if query is None:
            raise ArgumentError(f"{call.name} needs 'query': one short image search string")
        if isinstance(query, list):
            if len(query) != 1:
                raise ArgumentError(f"{call.name} takes one query per call; got {len(query)}")
            query = query[0]
        return ImageSearch(query=_text(call.name, "query", query),
                           top_k=_top_k(call.name, args.get("top_k"), max_images, max_images),
                           tbs=_tbs(call.name, args, today))
    if tool == WEB_FETCH:
        _check_keys(call.name, args, ("url", "urls", "prompt", "query", "goal"))
        urls = _pick(call.name, args, "url", "urls")
        if urls is None:
            raise ArgumentError(f"{call.name} needs 'url': the page to read")
        prompt = _pick(call.name, args, "prompt", "query", "goal")
        if prompt is None:
            raise ArgumentError(f"{call.name} needs 'prompt': what to look for on the page")
        return WebFetch(urls=_string_list(call.name, "url", urls, MAX_FETCH_URLS),
                        prompt=_text(call.name, "prompt", prompt))
    if tool == FIND_OBJECT:
        _check_keys(call.name, args, ("description", "query", "img_ids"))
        description = _pick(call.name, args, "description", "query")
        if description is None:
            raise ArgumentError(f"{call.name} needs 'description': the object's colours and pattern")
        raw_ids = args.get("img_ids") or []
        if isinstance(raw_ids, str):
            raw_ids = [raw_ids]
        if not isinstance(raw_ids, list):
            raise ArgumentError(f"{call.name}: 'img_ids' must be a list of ids like \"IMG_003\"; got {raw_ids!r}")
        ids = []
        for raw in raw_ids:
            img_id = parsing.normalise_img_id(raw)
            if img_id is None:
                raise ArgumentError(f"{call.name}: 'img_ids' entries must look like \"IMG_003\"; got {raw!r}")
            ids.append(img_id)
        return FindObject(description=_text(call.name, "description", description), img_ids=tuple(ids))
    _check_keys(call.name, args, ("img_id", "image_id", "bbox", "box"))
    raw_id = _pick(call.name, args, "img_id", "image_id")
    if raw_id is None:
        raise ArgumentError(f"{call.name} needs 'img_id', e.g. \"IMG_003\"")
    img_id = parsing.normalise_img_id(raw_id)
    if img_id is None:
        raise ArgumentError(f"{call.name}: 'img_id' must look like \"IMG_003\"; got {raw_id!r}")
    bbox = _pick(call.name, args, "bbox", "box")
    if bbox is None:
        raise ArgumentError(f"{call.name} needs 'bbox': [x0, y0, x1, y1] as fractions 0-1 of width and height")
    return CropImage(img_id=img_id, bbox=bbox)
