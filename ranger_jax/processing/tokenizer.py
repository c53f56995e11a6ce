"""The Qwen3 tokenizer of a checkpoint directory, read from its `tokenizer.json` with `tokenizers` alone.

Encoding never adds special tokens on its own; chat structure comes from `ranger_jax.processing.chat`.
Added tokens (`<|im_start|>`, `<|image_pad|>`, `<think>`, …) in text are matched as single ids, exactly
as transformers' fast tokenizer does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import tokenizers

# Added tokens the chat renderer and the rollout rely on (ids of the real Qwen3 vocabulary in comments).
SPECIAL_TOKENS = (
    "<|endoftext|>",  # 151643, pad
    "<|im_start|>",  # 151644
    "<|im_end|>",  # 151645, eos of chat turns
    "<|vision_start|>",  # 151652
    "<|vision_end|>",  # 151653
    "<|vision_pad|>",  # 151654
    "<|image_pad|>",  # 151655
    "<|video_pad|>",  # 151656
    "<tool_call>",  # 151657
    "</tool_call>",  # 151658
    "<tool_response>",  # 151665
    "</tool_response>",  # 151666
    "<think>",  # 151667
    "</think>",  # 151668
)
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
# Files of an HF model folder besides the weights that tokenizers and processors read.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
                   "video_preprocessor_config.json", "processor_config.json", "generation_config.json")
DEFAULT_EOS_TOKEN = "<|im_end|>"
DEFAULT_PAD_TOKEN = "<|endoftext|>"


def _token_name(value: object) -> str | None:
    """A token string from a tokenizer_config.json entry (a string or an AddedToken dict)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """A thin wrapper around `tokenizers.Tokenizer` with the Qwen3-VL special-token ids resolved.

    Attributes:
        backend: the underlying `tokenizers.Tokenizer`.
        vocab_size: number of ids the tokenizer can emit, added tokens included (151669 for Qwen3; the
            model's embedding table may be larger).
        eos_id: id of the eos token (tokenizer_config.json `eos_token`, else `<|im_end|>`).
        pad_id: id of the pad token (tokenizer_config.json `pad_token`, else `<|endoftext|>`).
        im_start_id, im_end_id, endoftext_id, vision_start_id, vision_end_id, vision_pad_id, image_pad_id,
        video_pad_id, tool_call_id, tool_call_end_id, tool_response_id, tool_response_end_id, think_id,
        think_end_id: ids of the tokens in `SPECIAL_TOKENS`.
    """

    def __init__(self, backend: tokenizers.Tokenizer, *, eos_token: str = DEFAULT_EOS_TOKEN,
                 pad_token: str = DEFAULT_PAD_TOKEN, source: str = "<in memory>"):
        self.backend = backend
        self.source = source
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        ids = {token: self._required_id(token) for token in SPECIAL_TOKENS}
        self.endoftext_id = ids["<|endoftext|>"]
        self.im_start_id = ids["<|im_start|>"]
        self.im_end_id = ids["<|im_end|>"]
        self.vision_start_id = ids["<|vision_start|>"]
        self.vision_end_id = ids["<|vision_end|>"]
        self.vision_pad_id = ids["<|vision_pad|>"]
        self.image_pad_id = ids["<|image_pad|>"]
        self.video_pad_id = ids["<|video_pad|>"]
        self.tool_call_id = ids["<tool_call>"]
        self.tool_call_end_id = ids["</tool_call>"]
        self.tool_response_id = ids["<tool_response>"]
        self.tool_response_end_id = ids["</tool_response>"]
        self.think_id = ids["<think>"]
        self.think_end_id = ids["</think>"]
        self.eos_id = self._required_id(eos_token)
        self.pad_id = self._required_id(pad_token)
        self.vision_ids = frozenset(ids[token] for token in VISION_TOKENS)

    def _required_id(self, token: str) -> int:
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise ValueError(
                f"tokenizer from {self.source} has no token {token!r}, which Qwen3-VL chat rendering needs "
                f"(required: {', '.join(SPECIAL_TOKENS)})"
            )
        return token_id

    def token_to_id(self, token: str) -> int:
        """Id of `token`; KeyError naming the token if the vocabulary lacks it."""
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise KeyError(f"token {token!r} is not in the vocabulary of {self.source}")
        return token_id

    def id_to_token(self, token_id: int) -> str:
        """Token string of `token_id`; KeyError naming the id if it is out of the vocabulary."""
        token = self.backend.id_to_token(int(token_id))
        if token is None:
            raise KeyError(f"id {token_id} is not in the vocabulary of {self.source} (size {self.vocab_size})")
        return token

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; no special tokens are added (added tokens written in `text` are matched)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` over several texts (parallel inside `tokenizers`)."""
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of `ids`. Special tokens are kept unless `skip_special_tokens` (`<think>` and the tool tags
        are not special in Qwen3, so they are always kept)."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        return f"Tokenizer(source={self.source!r}, vocab_size={self.vocab_size})"


def load_tokenizer(checkpoint_dir: str | os.PathLike) -> Tokenizer:
    """Loads `tokenizer.json` (and eos/pad names from `tokenizer_config.json`, if present) of a checkpoint.

    Args:
        checkpoint_dir: an HF checkpoint directory (or any directory holding `tokenizer.json`).

    Returns:
        The wrapped tokenizer.

    Raises:
        FileNotFoundError: naming the directory when it has no `tokenizer.json`.
        ValueError: naming the token when a required special token is missing, or the file when a JSON
            file cannot be parsed.
    """
    directory = Path(checkpoint_dir)
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no tokenizer.json in {directory} (is it an HF checkpoint directory? copy the tokenizer files "
            "of the base model next to config.json)"
        )
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception on malformed files
        raise ValueError(f"cannot parse {path}: {err}") from err
    eos_token, pad_token = DEFAULT_EOS_TOKEN, DEFAULT_PAD_TOKEN
    config_path = directory / "tokenizer_config.json"
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text("utf-8"))
        except ValueError as err:
            raise ValueError(f"cannot parse {config_path}: {err}") from err
        eos_token = _token_name(config.get("eos_token")) or eos_token
        pad_token = _token_name(config.get("pad_token")) or pad_token
    return Tokenizer(backend, eos_token=eos_token, pad_token=pad_token, source=str(directory))


def copy_tokenizer_files(source_dir: str | os.PathLike, out_dir: str | os.PathLike) -> list[str]:
    """Copies the tokenizer and processor files (`TOKENIZER_FILES`) that `source_dir` has into `out_dir`; returns
    the names copied (so a checkpoint folder is complete for `load_tokenizer` and transformers)."""
    import shutil

    copied = []
    for name in TOKENIZER_FILES:
        if (Path(source_dir) / name).is_file():
            shutil.copyfile(Path(source_dir) / name, Path(out_dir) / name)
            copied.append(name)
    return copied
