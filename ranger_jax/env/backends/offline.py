"""The offline corpus backend: search and fetch over a world directory built by `ranger_jax.env.sim.build`.

Text search ranks pages by Okapi BM25 over their title and text; image search ranks images by BM25 over
their title, alt text and page context (BM25F-style field weights baked into the precomputed index, see
`ranger_jax.env.sim.build`). Both honour Google-style `tbs` date filters, read relative to the world's own
`today`, against each page's publication date (an image carries its page's date). Pages and images are
fetched by the world's URLs. Everything is deterministic: ties break by document order.

Version-2 worlds add the web's failures, each fixed at build time so every run sees the same ones: a dead
link is still listed by search but fetching it fails with what the world recorded ("HTTP 404 Not Found"), a
picture that fails to download does the same, and search scores carry seeded noise: each score is multiplied by
exp(σ·z), z a standard normal drawn from a hash of the world's seed, the query's words and the document, with σ
the world's `ranking_noise` (0 in version 1: exact BM25 order). Pictures are served as the world stores them
(PNG in version 1, JPEG in version 2).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
import statistics
from pathlib import Path

from ranger_jax.env.backends.base import BackendError, FetchedImage, ImageHit, Page, TextHit, parse_tbs
from ranger_jax.env import perception
from ranger_jax.env.sim import bm25, catalog, render, world

MAX_TOP_K = 20
SNIPPET_CHARS = 220
_CONTENT_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
_NORMAL = statistics.NormalDist()

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
# Version 2: no break after the abbreviations of edition names ("Vol. 3", "Ref. 7"), and the lines of its page
# layouts that are not prose (headers, datelines, picture and link lists) are no snippet either.
_SENTENCE_V2 = re.compile(r"(?<!\bVol\.)(?<!\bRef\.)(?<=[.!?])\s+|\n+")
_NOT_PROSE = ("#", "![", "- [", "Related:", "Published ")
_NOT_PROSE_V2 = _NOT_PROSE + ("Posted ", "See also:", "More:", "[image:", "Media:", "PRESS RELEASE", "*", "=")


def _normalise_url(url: str) -> str:
    return url.strip().split("#", 1)[0].rstrip("/")


def _snippet_units(text: str, version: int = 1) -> list[tuple[str, frozenset[str]]]:
    """Sentences and fact-sheet lines of a page body (headline, dateline, images and links left out)."""
    splitter, skip = (_SENTENCE, _NOT_PROSE) if version < 2 else (_SENTENCE_V2, _NOT_PROSE_V2)
    units = []
    for part in splitter.split(text):
        part = part.strip()
        if not part or part.startswith(skip) or (version >= 2 and part.isupper()):
            continue
        units.append((part, frozenset(bm25.tokenize(part))))
    return units


class OfflineBackend:
    """Search and fetch over an offline world; implements `ranger_jax.env.backends.base.Backend`.

    Attributes:
        root: the world directory.
        today: the world's own date; relative date filters (`qdr:w`) count back from it.
        world: the loaded `ranger_jax.env.sim.world.World`.
    """

    def __init__(self, world_dir: str | Path):
        """Loads the world and its precomputed BM25 indexes.

        Raises:
            FileNotFoundError: when `world_dir` holds no world or its index is missing.
            ValueError: when the index does not cover exactly the world's pages and images.
        """
        self.root = Path(world_dir)
        self._root_abs = self.root.resolve()
        self.world = world.load_world(self.root)
        # Pixel-only recognition of the world's painted objects, for the optional find_object tool.
        self.object_finder = perception.ObjectFinder(palette=catalog.COLOURS, patterns=render.pattern_drawers(),
                                                     trim_inset=render.trim_width)
        self.today: dt.date = self.world.today
        index_path = self.root / world.INDEX_FILE
        try:
            data = json.loads(index_path.read_text("utf-8"))
        except FileNotFoundError as err:
            raise FileNotFoundError(f"{index_path} not found; rebuild the world with ranger_jax.env.sim.build") from err
        self._pages = bm25.Index.from_json(data["pages"], f"{index_path}#pages")
        self._images = bm25.Index.from_json(data["images"], f"{index_path}#images")
        for name, index, items in (("pages", self._pages, self.world.pages),
                                   ("images", self._images, self.world.images)):
            if set(index.docs) != set(items):
                raise ValueError(f"{index_path} indexes {len(index.docs)} {name} but the world has {len(items)}; "
                                 "rebuild the world")
        self._page_dates = tuple(self.world.pages[u].date for u in self._pages.docs)
        self._image_dates = tuple(self.world.images[u].date for u in self._images.docs)
        self._units = {u: _snippet_units(p.text, self.world.version) for u, p in self.world.pages.items()}
        self._page_urls = {_normalise_url(u): u for u in self.world.pages}
        self._image_urls = {_normalise_url(u): u for u in self.world.images}

    def _date_filter(self, tbs: str | None, dates: tuple[str, ...]):
        if tbs is None or not tbs.strip():
            return None
        try:
            start, end = parse_tbs(tbs, self.today)
        except ValueError as err:
            raise BackendError(str(err)) from err
        low, high = start.isoformat(), end.isoformat()
        return lambda doc: low <= dates[doc] <= high

    @staticmethod
    def _check(kind: str, query: str, top_k: int) -> None:
        if not isinstance(query, str) or not query.strip():
            raise BackendError(f"{kind} query is empty; give a few words to search for")
        if not bm25.tokenize(query):
            raise BackendError(f"{kind} query {query!r} has no searchable words")
        if not 1 <= top_k <= MAX_TOP_K:
            raise BackendError(f"{kind} top_k must be in 1..{MAX_TOP_K}, got {top_k}")

    def _snippet(self, url: str, query: str) -> str:
        terms = set(bm25.tokenize(query))
        units = self._units[url]
        if not units:
            return ""
        best = max(range(len(units)), key=lambda i: (len(units[i][1] & terms), -i))
        text = units[best][0]
        if len(text) < SNIPPET_CHARS // 2 and best + 1 < len(units):
            text = f"{text} {units[best + 1][0]}"
        return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1].rstrip() + "…"

    def _noise(self, query: str, key: str) -> float:
        """The seeded factor exp(σ·z) on one document's score for `query` (1 when the world has no noise)."""
        sigma = self.world.ranking_noise
        if sigma <= 0:
            return 1.0
        words = " ".join(sorted(set(bm25.tokenize(query))))
        digest = hashlib.sha256(f"{self.world.seed}|{words}|{key}".encode()).digest()
        u = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64
        return math.exp(sigma * _NORMAL.inv_cdf(u))

    def _rank(self, index: bm25.Index, query: str, top_k: int, keep) -> list[tuple[int, float]]:
        """The `top_k` best (doc, score) pairs, scores with the world's ranking noise, ties by document order."""
        if self.world.ranking_noise <= 0:
            return index.search(query, top_k, keep)
        scored = [(doc, score * self._noise(query, index.docs[doc])) for doc, score in index.scores(query).items()
                  if keep is None or keep(doc)]
        return sorted(scored, key=lambda item: (-item[1], item[0]))[:top_k]

    async def text_search(self, query: str, *, top_k: int, tbs: str | None = None) -> list[TextHit]:
        """Pages ranked by BM25 for `query`, best first, within the `tbs` date range if given.

        Raises:
            BackendError: for an empty query, a `top_k` outside 1..MAX_TOP_K, or an unreadable `tbs`.
        """
        self._check("text_search", query, top_k)
        ranked = self._rank(self._pages, query, top_k, self._date_filter(tbs, self._page_dates))
        hits = []
        for position, (doc, _) in enumerate(ranked, start=1):
            page = self.world.pages[self._pages.docs[doc]]
            hits.append(TextHit(title=page.title, url=page.url, snippet=self._snippet(page.url, query),
                                date=page.date, position=position))
        return hits

    async def image_search(self, query: str, *, top_k: int, tbs: str | None = None) -> list[ImageHit]:
        """Images ranked by BM25 over title, alt text and page context, within the `tbs` date range if given.

        Raises:
            BackendError: for an empty query, a `top_k` outside 1..MAX_TOP_K, or an unreadable `tbs`.
        """
        self._check("image_search", query, top_k)
        ranked = self._rank(self._images, query, top_k, self._date_filter(tbs, self._image_dates))
        hits = []
        for position, (doc, _) in enumerate(ranked, start=1):
            image = self.world.images[self._images.docs[doc]]
            hits.append(ImageHit(title=image.title, image_url=image.url, page_url=image.page_url,
                                 source=image.page_url.split("/")[2], width=image.width, height=image.height,
                                 position=position))
        return hits

    async def fetch_page(self, url: str) -> Page:
        """The page at `url` as markdown-ish text.

        Raises:
            BackendError: naming the URL when the world has no such page (or it is an image), or when the page is
                a dead link (with what the world recorded, e.g. "HTTP 404 Not Found").
        """
        key = self._page_urls.get(_normalise_url(url)) if isinstance(url, str) else None
        if key is None:
            if isinstance(url, str) and _normalise_url(url) in self._image_urls:
                raise BackendError(f"{url!r} is an image, not a page; image_search returns images by id")
            raise BackendError(f"no page at {url!r} in the offline world (404)")
        page = self.world.pages[key]
        if page.error is not None:
            raise BackendError(f"{page.error} from {page.url}")
        return Page(url=page.url, title=page.title, text=page.text, date=page.date)

    async def fetch_image(self, url: str, *, page_url: str | None = None) -> FetchedImage:
        """The bytes behind an image URL; `trusted_file` is set when they hash to the SHA-256 recorded at build.

        Raises:
            BackendError: naming the URL when the world has no such image or its file is missing, or when its
                download fails in this world (with what the world recorded, e.g. "HTTP 403 Forbidden").
        """
        key = self._image_urls.get(_normalise_url(url)) if isinstance(url, str) else None
        if key is None:
            raise BackendError(f"no image at {url!r} in the offline world (404)")
        image = self.world.images[key]
        if image.error is not None:
            raise BackendError(f"{image.error} from {image.url}")
        path = self._root_abs / image.file
        try:
            data = path.read_bytes()
        except FileNotFoundError as err:
            raise BackendError(f"image {url!r} is missing its file {path}") from err
        # a file that is still exactly what the builder wrote needs no decoding to be trusted
        trusted = image.sha256 is not None and hashlib.sha256(data).hexdigest() == image.sha256
        content_type = _CONTENT_TYPES.get(path.suffix.lower(), "application/octet-stream")
        return FetchedImage(url=image.url, data=data, content_type=content_type, page_url=page_url or image.page_url,
                            trusted_file=str(path) if trusted else None)

    async def aclose(self) -> None:
        """Nothing to release: the backend holds no sockets or open files."""
