"""Training a compact Qwen3-style tokenizer on a domain's text, for small policies trained from scratch.

A 151k-row embedding and LM head dominate the cost of a policy with a few million parameters, and most of those
rows are never used by a narrow domain (the offline world's text uses about 1.2k distinct Qwen3 ids). This module
learns a byte-level BPE with Qwen3's normaliser and split regex from example texts, puts Qwen3-VL's chat, vision,
tool and think tokens at the lowest ids (so any text still encodes: unseen words fall back to bytes), and writes
`tokenizer.json` + `tokenizer_config.json` that `ranger_jax.processing.load_tokenizer` and transformers read like
Qwen3's. Everything downstream (chat rendering, sampler, trajectories, learner) takes its ids from the tokenizer,
so a compact policy runs through the same code as Qwen3-VL-8B.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from ranger_jax.processing import tokenizer as tokenizer_lib

# Qwen3's pre-tokenizer split (words with one leading non-letter, single digits, punctuation runs, newlines).
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# As in Qwen3, the tool and think tags are added tokens that decoding keeps (not "special").
NON_SPECIAL = frozenset({"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"})
NUM_BYTES = 256


def train_compact_tokenizer(texts: Iterable[str], directory: str | os.PathLike, *, vocab_size: int = 2048,
                            min_frequency: int = 2) -> Path:
    """Learns a byte-level BPE of `vocab_size` ids from `texts` and writes it to `directory`.

    Ids 0.. hold `tokenizer.SPECIAL_TOKENS` in order (`<|endoftext|>` = 0 is the pad, `<|im_end|>` the eos),
    then the 256 byte tokens, then the learned merges. The result is deterministic for the same texts.

    Args:
        texts: example texts of the domain (system prompts, requests, tool observations, answers).
        directory: created if missing; receives tokenizer.json and tokenizer_config.json.
        vocab_size: total ids, special tokens included.
        min_frequency: a merge must occur at least this often.

    Returns:
        Path of the written tokenizer.json.

    Raises:
        ValueError: a vocab_size with no room for the special and byte tokens (names both counts).
    """
    specials = tokenizer_lib.SPECIAL_TOKENS
    num_learned = vocab_size - len(specials)
    if num_learned < NUM_BYTES:
        raise ValueError(f"vocab_size={vocab_size} leaves {num_learned} ids after {len(specials)} special tokens; "
                         f"at least {NUM_BYTES} are needed for the byte tokens")
    normalizer = normalizers.NFC()
    pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(QWEN_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    learner = tokenizers.Tokenizer(models.BPE())
    learner.normalizer, learner.pre_tokenizer = normalizer, pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=num_learned, min_frequency=min_frequency, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    learner.train_from_iterator(texts, trainer=trainer)
    learned = json.loads(learner.to_str())["model"]

    vocab = {token: i for i, token in enumerate(specials)}
    for token, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                                  for t in specials if t not in NON_SPECIAL])
    tokenizer.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                          for t in specials if t in NON_SPECIAL])
    for i, token in enumerate(specials):
        if tokenizer.token_to_id(token) != i:  # the BPE model already holds them at these ids
            raise RuntimeError(f"special token {token!r} landed at id {tokenizer.token_to_id(token)}, not {i}")

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    tokenizer.save(str(path))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
              "eos_token": tokenizer_lib.DEFAULT_EOS_TOKEN, "pad_token": tokenizer_lib.DEFAULT_PAD_TOKEN,
              "unk_token": None, "model_max_length": 32768, "clean_up_tokenization_spaces": False}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", "utf-8")
    return path
