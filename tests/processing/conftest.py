"""Shared fixtures for processing tests: the real Qwen3 tokenizer (ours and transformers'), loaded once."""

import pytest
from support.tiny_tokenizer import qwen3_tokenizer_dir

from ranger_jax.processing import tokenizer as tokenizer_lib


@pytest.fixture(scope="session")
def qwen_dir():
    return qwen3_tokenizer_dir()


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_dir):
    return tokenizer_lib.load_tokenizer(qwen_dir)


@pytest.fixture(scope="session")
def hf_qwen_tokenizer(qwen_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen_dir)
