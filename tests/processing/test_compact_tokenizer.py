"""A compact tokenizer trained on domain text behaves like Qwen3's for everything downstream."""

from __future__ import annotations

import json

import pytest

from ranger_jax.processing import chat, compact_tokenizer, tokenizer as tokenizer_lib

TEXTS = ["The Shorkthi Max 3 Frost smartphone comes in green with orange dots.",
         '<tool_call>\n{"name": "text_search", "arguments": {"queries": ["Shorkthi Max Frost"]}}\n</tool_call>',
         "<tool_response>\n--- search result for [Shorkthi Max Frost] ---\n</tool_response>"] * 20


def test_special_ids_first_and_text_round_trips(tmp_path):
    compact_tokenizer.train_compact_tokenizer(TEXTS, tmp_path, vocab_size=400)
    tok = tokenizer_lib.load_tokenizer(tmp_path)
    for i, name in enumerate(tokenizer_lib.SPECIAL_TOKENS):
        assert tok.backend.token_to_id(name) == i
    assert tok.pad_id == 0 and tok.eos_id == tok.im_end_id == 2
    for text in TEXTS[:3] + ["Unseen wörds 東京 still encode via bytes"]:
        assert tok.decode(tok.encode(text)) == text
    # learned merges make in-domain text much shorter than its bytes
    assert len(tok.encode(TEXTS[0])) < len(TEXTS[0].encode()) / 2
    assert max(max(tok.encode(t)) for t in TEXTS) < 400
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"


def test_renders_chat_with_images(tmp_path):
    compact_tokenizer.train_compact_tokenizer(TEXTS, tmp_path, vocab_size=400)
    tok = tokenizer_lib.load_tokenizer(tmp_path)
    renderer = chat.ChatRenderer(tok)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "green with orange dots"}]},
                {"role": "assistant", "content": TEXTS[1]}]
    rendered = renderer.render(messages, images_grid_thw=[[1, 4, 4]])
    ids = list(rendered.ids)
    assert ids.count(tok.image_pad_id) == 4
    assert sum(rendered.loss_mask) > 0


def test_too_small_a_vocabulary_is_refused(tmp_path):
    with pytest.raises(ValueError, match="vocab_size=100"):
        compact_tokenizer.train_compact_tokenizer(TEXTS, tmp_path, vocab_size=100)
