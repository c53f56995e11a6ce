"""Okapi BM25 over a precomputed inverted index: the ranking behind the offline backend's searches.

    score(D, Q) = Σ_{t ∈ Q} IDF(t) · tf(t, D) · (k1 + 1) / (tf(t, D) + k1 · (1 − b + b · |D| / avgdl))
    IDF(t)      = ln(1 + (N − df(t) + 0.5) / (df(t) + 0.5))

(Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond", 2009, eq. 3.15, with the
non-negative IDF used by Lucene.) Query terms count once each. Fields are weighted BM25F-style by repeating
a field's tokens before indexing (the caller decides the weights). Ties break by document order, so rankings
are deterministic.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

K1 = 1.2  # term-frequency saturation
B = 0.75  # length normalisation

_TOKEN = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was were will with "
    "s which who".split()
)


def tokenize(text: str) -> list[str]:
    """Lower-cased alphanumeric runs of `text`, stopwords removed."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


@dataclasses.dataclass(frozen=True)
class Index:
    """An inverted index: for each term, the (document number, term frequency) pairs that contain it.

    Attributes:
        docs: document keys (URLs) by document number.
        doc_len: token count of each document.
        postings: term -> ((doc, tf), …) in increasing doc order.
        k1, b: BM25 parameters.
    """

    docs: tuple[str, ...]
    doc_len: tuple[int, ...]
    postings: Mapping[str, tuple[tuple[int, int], ...]]
    k1: float = K1
    b: float = B

    @property
    def avgdl(self) -> float:
        """Mean document length in tokens (BM25's avgdl)."""
        return sum(self.doc_len) / max(1, len(self.doc_len))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (terms sorted, so equal indexes serialise to equal bytes)."""
        return {"k1": self.k1, "b": self.b, "docs": list(self.docs), "doc_len": list(self.doc_len),
                "postings": {t: [list(p) for p in self.postings[t]] for t in sorted(self.postings)}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> Index:
        """Inverse of `to_json`.

        Raises:
            ValueError: naming `where` and the missing key, or when docs and doc_len disagree in length.
        """
        missing = [k for k in ("k1", "b", "docs", "doc_len", "postings") if k not in data]
        if missing:
            raise ValueError(f"index {where} lacks keys {missing}")
        if len(data["docs"]) != len(data["doc_len"]):
            raise ValueError(f"index {where} has {len(data['docs'])} docs but {len(data['doc_len'])} doc lengths")
        postings = {t: tuple((int(d), int(f)) for d, f in p) for t, p in data["postings"].items()}
        return cls(docs=tuple(data["docs"]), doc_len=tuple(int(n) for n in data["doc_len"]), postings=postings,
                   k1=float(data["k1"]), b=float(data["b"]))

    def scores(self, query: str) -> dict[int, float]:
        """BM25 score of every document that shares a term with `query` (others score 0)."""
        n = len(self.docs)
        avgdl = self.avgdl or 1.0
        acc: dict[int, float] = {}
        for term in dict.fromkeys(tokenize(query)):
            posting = self.postings.get(term)
            if not posting:
                continue
            idf = math.log(1.0 + (n - len(posting) + 0.5) / (len(posting) + 0.5))
            for doc, tf in posting:
                norm = self.k1 * (1.0 - self.b + self.b * self.doc_len[doc] / avgdl)
                acc[doc] = acc.get(doc, 0.0) + idf * tf * (self.k1 + 1.0) / (tf + norm)
        return acc

    def search(self, query: str, top_k: int, keep: Callable[[int], bool] | None = None) -> list[tuple[int, float]]:
        """The `top_k` best (doc, score) pairs for `query` among documents `keep` accepts, best first."""
        ranked = sorted(self.scores(query).items(), key=lambda item: (-item[1], item[0]))
        if keep is not None:
            ranked = [item for item in ranked if keep(item[0])]
        return ranked[:top_k]


def build_index(docs: Iterable[tuple[str, list[str]]], k1: float = K1, b: float = B) -> Index:
    """Indexes (key, tokens) documents in the given order."""
    keys, lengths = [], []
    postings: dict[str, list[tuple[int, int]]] = {}
    for number, (key, tokens) in enumerate(docs):
        keys.append(key)
        lengths.append(len(tokens))
        for term, tf in Counter(tokens).items():
            postings.setdefault(term, []).append((number, tf))
    return Index(docs=tuple(keys), doc_len=tuple(lengths), postings={t: tuple(p) for t, p in postings.items()},
                 k1=k1, b=b)
