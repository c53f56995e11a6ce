"""Near-duplicate removal of prompts: the same target asked twice, or nearly the same words.

Two prompts are near-duplicates when the Jaccard similarity of their word 3-shingles (lower-cased alphanumeric
words) is at least `threshold` (default 0.7). Candidates are found with MinHash locality-sensitive hashing:
`NUM_PERM` hash functions in `BANDS` bands, and two prompts that agree on all rows of some band are compared
exactly, so a run of tens of thousands of prompts is checked without comparing every pair. A prompt whose
normalised target (its name, words only) was already taken is a duplicate too: two headlines about one release give
one prompt. `Deduper` is incremental: prompts are offered in order and the first of a group stays.
"""

from __future__ import annotations

import collections
import hashlib
import re

import numpy as np

NUM_PERM = 64
BANDS = 16  # rows per band = NUM_PERM / BANDS = 4: pairs above ~0.6 Jaccard almost always share a band
SHINGLE = 3
_WORD = re.compile(r"[a-z0-9]+")
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def words(text: str) -> list[str]:
    """The lower-cased alphanumeric words of `text`."""
    return _WORD.findall(text.lower())


def shingles(text: str, size: int = SHINGLE) -> frozenset[str]:
    """The word `size`-grams of `text` (the whole text as one shingle when it is shorter)."""
    w = words(text)
    if len(w) <= size:
        return frozenset([" ".join(w)])
    return frozenset(" ".join(w[i:i + size]) for i in range(len(w) - size + 1))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a ∩ b| / |a ∪ b| (1 for two empty sets)."""
    union = len(a | b)
    return len(a & b) / union if union else 1.0


def _hash64(shingle: str) -> int:
    return int.from_bytes(hashlib.blake2b(shingle.encode("utf-8"), digest_size=8).digest(), "little")


_RNG = np.random.default_rng(20240611)  # fixed: signatures must not change between runs
_A = _RNG.integers(1, 2**63 - 1, NUM_PERM, dtype=np.uint64) | np.uint64(1)
_B = _RNG.integers(0, 2**63 - 1, NUM_PERM, dtype=np.uint64)


def signature(items: frozenset[str]) -> np.ndarray:
    """[NUM_PERM] uint64 MinHash signature of a shingle set (a·h + b mod 2⁶⁴ per permutation)."""
    hashes = np.array(sorted(_hash64(s) for s in items), dtype=np.uint64)
    with np.errstate(over="ignore"):
        permuted = (hashes[:, None] * _A[None, :] + _B[None, :]) & _MASK  # [S, NUM_PERM]
    return permuted.min(axis=0)


class Deduper:
    """Incremental near-duplicate filter (see the module docstring).

    Args:
        threshold: Jaccard similarity at or above which two prompts are near-duplicates.
    """

    def __init__(self, threshold: float = 0.7):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
        self.threshold = threshold
        self._shingles: dict[str, frozenset[str]] = {}
        self._buckets: dict[tuple[int, bytes], list[str]] = collections.defaultdict(list)
        self._targets: dict[str, str] = {}

    def _bands(self, sig: np.ndarray) -> list[tuple[int, bytes]]:
        rows = NUM_PERM // BANDS
        return [(b, sig[b * rows:(b + 1) * rows].tobytes()) for b in range(BANDS)]

    def check(self, key: str, text: str, target: str = "") -> tuple[str, str] | None:
        """(reason, key of the earlier prompt) when `text` duplicates one already added, else None."""
        norm = " ".join(words(target))
        if norm and norm in self._targets:
            return "duplicate_target", self._targets[norm]
        items = shingles(text)
        seen: set[str] = set()
        for band in self._bands(signature(items)):
            for other in self._buckets.get(band, ()):
                if other not in seen:
                    seen.add(other)
                    if jaccard(items, self._shingles[other]) >= self.threshold:
                        return "near_duplicate", other
        return None

    def add(self, key: str, text: str, target: str = "") -> None:
        """Registers a kept prompt so later ones are checked against it."""
        items = shingles(text)
        self._shingles[key] = items
        for band in self._bands(signature(items)):
            self._buckets[band].append(key)
        norm = " ".join(words(target))
        if norm:
            self._targets.setdefault(norm, key)

    def offer(self, key: str, text: str, target: str = "") -> tuple[str, str] | None:
        """`check`, then `add` when it is no duplicate; returns what `check` returned."""
        duplicate = self.check(key, text, target)
        if duplicate is None:
            self.add(key, text, target)
        return duplicate
