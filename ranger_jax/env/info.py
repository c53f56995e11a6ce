"""`Observation.info`: the keys an observation reports, the failure kinds, and the JSON-safe copy they pass through.

Every observation of a tool call carries the same keys, whichever tool ran:

- `tool`: the canonical tool name (`text_search`, …; an unknown name as the policy wrote it);
- `arguments`: the arguments as the policy wrote them, through `json_safe` (long strings cut, with their length);
- `error`: None, or the kind (a key of `ERROR_KINDS`) of the failure that left the call without a usable result;
- `errors`: the kinds of every failed part, in order (a query of `text_search`, a URL of `web_fetch`, a download
  of `image_search`); `[error]` for a tool with one part; empty when nothing failed;
- `latency_s`: the tool's wall time, when it ran; plus facts of the tool itself (`img_ids`, `new_img_id`, …).

A malformed turn reports `error: "format"` and the `problem`; every observation that continues the episode reports
`final_turn`. The same failure has the same kind in every tool: a backend that cannot be reached is `backend` for
text search, image search and page reading alike, and a host that does not resolve is `dns`, never `url_refused`.

`json_safe` makes every value JSON- and UTF-8-serialisable (`json.dumps(info, ensure_ascii=False,
allow_nan=False).encode()` never fails) and small: a 1 MB query is kept as its first `MAX_INFO_CHARS` characters
and its length.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ranger_jax.clients import http
from ranger_jax.env import images
from ranger_jax.env.backends import base, urlguard

MAX_INFO_CHARS = 200  # characters of one string kept in info
MAX_INFO_ITEMS = 20  # items of one list or keys of one mapping kept in info
MAX_INFO_DEPTH = 6  # nesting kept in info; deeper values become their (cut) repr
MAX_INFO_INT = 2**63  # larger integers are kept as cut strings

# The failure kinds of `info["error"]` and `info["errors"]`, and what each means.
ERROR_KINDS = {
    "format": "the turn does not follow the protocol (no or several tool calls, bad JSON)",
    "unknown_tool": "the tool does not exist or is not enabled in this environment",
    "arguments": "the tool's arguments are missing, mistyped or out of range",
    "budget": "every tool call of the episode is used",
    "search_unavailable": "the search service cannot be used (no API key, or the key was refused)",
    "url_refused": "the URL guard refused the URL (scheme, private or local address, malformed)",
    "dns": "the host name of the URL does not resolve",
    "backend": "the search or fetch failed (HTTP error, timeout, unreadable content)",
    "service": "a remote service (page reader, summariser) failed",
    "image_rejected": "the downloaded bytes are not an acceptable image",
    "image_unreadable": "an image file of the episode cannot be read",
    "unknown_img_id": "an image id the episode never showed",
    "bbox": "a crop box that is malformed or too small",
    "description": "a find_object description that names no known colour or pattern",
    "no_images": "find_object has no images to look in yet",
    "not_found": "find_object found nothing matching",
    "unavailable": "the tool needs something this backend does not have",
    "internal": "a bug in a tool (logged with its traceback)",
}
_SURROGATE = re.compile("[\ud800-\udfff]")


def error_kind(err: BaseException) -> str:
    """The `ERROR_KINDS` key of an exception a tool met (most specific class first)."""
    for cls, kind in ((base.SearchUnavailable, "search_unavailable"), (urlguard.HostUnresolved, "dns"),
                      (urlguard.UrlRefused, "url_refused"), (images.ImageRejected, "image_rejected"),
                      (base.BackendError, "backend"), (http.ClientError, "service")):
        if isinstance(err, cls):
            return kind
    return "internal"


def _text(value: str) -> str:
    if _SURROGATE.search(value):  # lone UTF-16 surrogates (JSON "\ud800") cannot be encoded as UTF-8
        value = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if len(value) <= MAX_INFO_CHARS:
        return value
    return f"{value[:MAX_INFO_CHARS]}… [{len(value)} characters]"


def json_safe(value: Any, depth: int = 0) -> Any:
    """A copy of `value` made of JSON types only, UTF-8-encodable and cut to the `MAX_INFO_*` limits.

    Strings longer than `MAX_INFO_CHARS` keep their start and say how long they were; lists and mappings keep
    their first `MAX_INFO_ITEMS` items and say how many there were; non-finite floats and huge integers become
    strings; any other object becomes its (cut) repr.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) < MAX_INFO_INT:
            return value
        return f"{'-' if value < 0 else ''}integer of {value.bit_length()} bits"  # str() of huge ints raises
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _text(value)
    if depth >= MAX_INFO_DEPTH:
        return _text(repr(value))
    if isinstance(value, Mapping):
        items = list(value.items())
        out = {_text(str(k)): json_safe(v, depth + 1) for k, v in items[:MAX_INFO_ITEMS]}
        if len(items) > MAX_INFO_ITEMS:
            out["…"] = f"{len(items)} keys in all"
        return out
    if isinstance(value, (list, tuple)):
        out = [json_safe(v, depth + 1) for v in value[:MAX_INFO_ITEMS]]
        if len(value) > MAX_INFO_ITEMS:
            out.append(f"… [{len(value)} items]")
        return out
    return _text(repr(value))
