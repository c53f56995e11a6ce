"""SFT data augmentation by consistent permutation: every occurrence of a word (or name piece) in an episode becomes
another.

A small policy trained from scratch on a few hundred teacher episodes learns to *recall* a look ("green with orange
dots") from the names around it instead of *copying* it from the observation it just read: on unseen tasks it then
writes plausible but wrong colours. Swapping interchangeable words consistently through a whole episode — every
"green" in the request, the search results, the tool calls and the answer becomes, say, "navy" — keeps the episode
coherent (the call still repeats what the observation said) while making recall useless, so the only way to predict
the call is to copy. This is the entity-anonymisation idea of reading-comprehension training applied to tokens.

Names need it most. A few hundred episodes repeat a few dozen product names, and a small model memorises
"request -> the whole episode" (training loss 0.07, loss on the same teacher's episodes in an unseen world 0.60):
at test time it writes a training request's names into its search. `name_pieces` finds the tokens that only ever
occur inside names (sub-word pieces such as " Tr", "cro") and permutes them in classes of the same shape (leading
space, capital letter), so every row shows names the model has never seen, spelled consistently through the episode.
That is not enough: the policy then memorises the request *templates* around the names and still does not copy
(score 0 on unseen tasks). `content_words` permutes every word token except the system prompt and the
tool-call scaffolding (`protected_ids`), so nothing but the structure stays fixed and copying is the only way to
predict a request, a name or a look; after a copy warm-up the policy learns it (measured in `docs/sim_tiny.md`).

It works on token ids, so only words that are a single token (with and without a leading space, as variants) take
part, and the recorded sequence keeps its length and image runs. Pixels are not recoloured: use it for a policy
whose decisions are made from text (the offline world's `find_object` does the pixel work).

GRPO can take it too (`per_unit=True`: one permutation for all the rows of a group, so they keep one shared
context). The learner then scores the permuted tokens: the update raises (or lowers) the probability of writing
*the permuted* sampled turn after *the permuted* context, with the advantage the real rollout earned. What earned
the reward (which snippet's look was copied, and how faithfully) survives the permutation; the words themselves do
not, so the update cannot make the policy recall a training task's look and has to act through copying. The
tokens are no longer the sampled ones: use the learner's own log-probs as π_old (`old_logp="learner"`) and no
sampler correction (`tis_cap=None`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


class TokenPermutation:
    """A Grain random map: rows of examples -> the same rows with each word group permuted (picklable).

    Args:
        groups: word groups; each group is a list of *variants*, each variant the token ids of the group's words in
            one spelling (e.g. [" red", " navy", …] and ["red", "navy", …]), all variants of a group the same length
            and aligned word for word. One permutation per group is drawn per row and applied to every variant.
        per_unit: draw one table per call (a unit: a GRPO group's rows) instead of one per row.
    """

    def __init__(self, groups: Sequence[Sequence[Sequence[int]]], *, per_unit: bool = False):
        self.per_unit = per_unit
        self.groups = []
        for g, variants in enumerate(groups):
            arrays = [np.asarray(v, np.int64) for v in variants]
            if not arrays:
                raise ValueError(f"TokenPermutation group {g} has no variants")
            sizes = {a.size for a in arrays}
            if len(sizes) != 1 or arrays[0].size < 2:
                raise ValueError(f"TokenPermutation group {g}: variants must list the same >= 2 words; "
                                 f"got sizes {sorted(sizes)}")
            ids = np.concatenate(arrays)
            if np.unique(ids).size != ids.size:
                raise ValueError(f"TokenPermutation group {g} repeats a token id")
            self.groups.append(arrays)
        every = np.concatenate([a for variants in self.groups for a in variants])
        if np.unique(every).size != every.size:
            raise ValueError("TokenPermutation groups share a token id")
        self.table_size = int(every.max()) + 1

    def table(self, rng: np.random.Generator) -> np.ndarray:
        """One draw: a lookup table old id -> new id (identity outside the groups)."""
        table = np.arange(self.table_size, dtype=np.int64)
        for variants in self.groups:
            order = rng.permutation(variants[0].size)
            for ids in variants:
                table[ids] = ids[order]
        return table

    def apply(self, input_ids: np.ndarray, table: np.ndarray) -> np.ndarray:
        """`input_ids` with the table applied (ids beyond the table are unchanged)."""
        out = input_ids.copy()
        inside = out < table.size
        out[inside] = table[out[inside]]
        return out

    def __call__(self, rows: list[dict[str, Any]], rng: np.random.Generator) -> list[dict[str, Any]]:
        out = []
        shared = self.table(rng) if self.per_unit else None
        for row in rows:
            row = dict(row)
            table = self.table(rng) if shared is None else shared
            row["input_ids"] = self.apply(np.asarray(row["input_ids"]), table).astype(np.asarray(row["input_ids"]).dtype)
            out.append(row)
        return out


def name_pieces(tokenizer: Any, names: Iterable[str], texts: Iterable[str], *, min_class: int = 2
                ) -> list[list[np.ndarray]]:
    """Permutation groups of the tokens that only ever occur inside the name words `names`.

    A token counts when it appears in the tokenization of some name (spelled with and without a leading space) and
    never in `texts` once every name word is cut out of them (so pieces shared with ordinary words, e.g. "in", stay
    put). The tokens are grouped by shape — leading space or not, first letter capital or not — so a permuted name
    keeps its word boundaries and capitals; a shape with fewer than `min_class` tokens is left out.

    Args:
        tokenizer: has `encode(text) -> ids` and `decode(ids) -> text`.
        names: the proper names of the data, as single words (e.g. "Trincro"; a name with spaces counts word by word).
        texts: the data's texts (e.g. decoded episodes), to find the tokens ordinary words use.

    Returns:
        Groups for `TokenPermutation` (one spelling each); empty when no token qualifies.
    """
    words = {w for name in names for w in _WORD.findall(name)}
    if not words:
        raise ValueError("name_pieces needs at least one name with a letter or digit in it")
    inside: set[int] = set()
    for word in words:
        for spelling in (" " + word, word):
            inside.update(int(i) for i in tokenizer.encode(spelling))
    outside: set[int] = set()
    for text in texts:
        cut = _WORD.sub(lambda m: " " if m.group(0) in words else m.group(0), text)
        outside.update(int(i) for i in tokenizer.encode(cut))
    classes: dict[tuple[bool, bool], list[int]] = {}
    for token in sorted(inside - outside):
        piece = tokenizer.decode([token])
        if not piece.strip():
            continue
        classes.setdefault((piece.startswith(" "), piece.strip()[0].isupper()), []).append(token)
    return [[np.asarray(ids, np.int64)] for _, ids in sorted(classes.items()) if len(ids) >= min_class]


_WORD = re.compile(r"[A-Za-z0-9]+")
_WORD_TOKEN = re.compile(r"( ?)([A-Za-z][a-z]*)")


def protected_ids(episodes: Iterable[tuple[np.ndarray, np.ndarray]], *, end_of_turn_id: int,
                  fraction: float = 0.15) -> set[int]:
    """The tokens a content-word permutation must leave alone, found in the data:

    - every token of each episode's first message (the system prompt);
    - every token in the assistant turns of at least `fraction` of the episodes: the tool-call and answer
      scaffolding, and the words of the templates the policy writes (e.g. a look's "pairs a … base with …");
    - every token the episodes contain but no assistant turn ever writes: what the policy only reads (e.g. a
      search result's "now discounted"), the cues it decides by.

    What is left — names, colours, scene words: what the policy writes and could only know by copying — is what
    `content_words` permutes.

    Args:
        episodes: (token_ids, loss_mask) per episode, the mask 1 on assistant tokens.
        end_of_turn_id: the id that closes a message (`<|im_end|>`).
        fraction: how common an assistant token must be to count as scaffolding, in (0, 1].
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"protected_ids fraction must be in (0, 1]; got {fraction}")
    first_message: set[int] = set()
    seen: set[int] = set()
    counts: dict[int, int] = {}
    total = 0
    for ids, mask in episodes:
        ids, mask = np.asarray(ids, np.int64), np.asarray(mask)
        if ids.shape != mask.shape:
            raise ValueError(f"episode {total}: token_ids {ids.shape} and loss_mask {mask.shape} differ in shape")
        ends = np.nonzero(ids == end_of_turn_id)[0]
        first_message.update(int(i) for i in ids[:ends[0] if ends.size else ids.size])
        seen.update(int(i) for i in np.unique(ids))
        for token in np.unique(ids[mask > 0]):
            counts[int(token)] = counts.get(int(token), 0) + 1
        total += 1
    if not total:
        raise ValueError("protected_ids needs at least one episode")
    scaffolding = {token for token, count in counts.items() if count >= fraction * total}
    return first_message | scaffolding | (seen - set(counts))


def content_words(tokenizer: Any, *, protected: Iterable[int], min_class: int = 2) -> list[list[np.ndarray]]:
    """Permutation groups of every word token of the vocabulary (letters, with or without a leading space: whole
    words and word pieces) outside `protected`.

    Permuting them consistently through an episode keeps its structure (the scaffolding and the system prompt are
    protected) and turns every request, name, scene and look into a fresh string the policy can only get right by
    copying it from where it was read: a small policy trained from scratch on a few hundred episodes otherwise
    memorises their templates and never learns to copy (see `docs/sim_tiny.md`). Tokens are grouped by shape —
    leading space, capital first letter, length 1, 2, 3 or more — so a permuted text keeps its word boundaries and
    capitals; a shape with fewer than `min_class` tokens is left out.

    Returns:
        Groups for `TokenPermutation` (one spelling each); empty when no token qualifies.
    """
    protected = {int(i) for i in protected}
    classes: dict[tuple[bool, bool, int], list[int]] = {}
    for token in range(tokenizer.vocab_size):
        if token in protected:
            continue
        match = _WORD_TOKEN.fullmatch(tokenizer.decode([token]))
        if match is None:
            continue
        space, word = match.groups()
        classes.setdefault((bool(space), word[0].isupper(), min(len(word), 4)), []).append(token)
    return [[np.asarray(ids, np.int64)] for _, ids in sorted(classes.items()) if len(ids) >= min_class]


def word_groups(tokenizer: Any, words: Sequence[Sequence[str]], *,
                skip_unusable: bool = False) -> list[list[list[int]]]:
    """Permutation groups of interchangeable words (e.g. colour names, pattern names).

    For each group, the spellings " word" and "word" are variants when every word of the group is a single token in
    that spelling. A group with no such spelling is an error naming it, or is left out with `skip_unusable` (e.g. a
    very small vocabulary that splits every colour name).
    """
    groups = []
    for group in words:
        variants = []
        for prefix in (" ", ""):
            ids = [tokenizer.encode(prefix + w) for w in group]
            if all(len(i) == 1 for i in ids):
                variants.append([i[0] for i in ids])
        if not variants and skip_unusable:
            continue
        if not variants:
            raise ValueError(f"no spelling of the words {list(group)} is one token each in this tokenizer; "
                             "they cannot be permuted")
        groups.append(variants)
    return groups


def word_permutation(tokenizer: Any, words: Sequence[Sequence[str]], *,
                     skip_unusable: bool = False) -> TokenPermutation | None:
    """A `TokenPermutation` over `word_groups(tokenizer, words)`; None when no group is usable (`skip_unusable`)."""
    groups = word_groups(tokenizer, words, skip_unusable=skip_unusable)
    return TokenPermutation(groups) if groups else None
