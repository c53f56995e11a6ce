"""The tiny policy's shapes depend on its size, not on the texts its tokenizer learned from.

Seeds learn different compact tokenizers (their worlds' words differ), yet every run compiles the same programs
for the same batch shapes: that is what lets a run load the programs of another seed's run from the shared
compilation cache (`compilation_cache.default_dir`).
"""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from ranger_jax.processing import tokenizer as tokenizer_lib
from ranger_jax.rl import tiny_policy

SIZE = tiny_policy.TinyPolicySize(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=16, vocab_size=512, vision_hidden_size=16)


def _corpus(seed: int) -> list[str]:
    """Sentences of made-up product names, different words for every seed, enough to fill a 512-id vocabulary."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(4, 9))) for _ in range(400)]
    return [" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(1500)]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    loaded = []
    for seed in (38, 39):
        directory = tmp_path_factory.mktemp(f"tokenizer{seed}")
        tiny_policy.train_tokenizer(_corpus(seed), directory, vocab_size=SIZE.vocab_size)
        loaded.append(tokenizer_lib.load_tokenizer(directory))
    return loaded


def test_two_vocabularies_give_one_model_config(tokenizers):
    a, b = tokenizers
    assert a.vocab_size == b.vocab_size == SIZE.vocab_size
    only_a = set(a.backend.get_vocab()) - set(b.backend.get_vocab())
    assert len(only_a) > 100, "the corpora should teach different merges"
    assert tiny_policy.model_config(a, SIZE) == tiny_policy.model_config(b, SIZE)


def test_two_vocabularies_lower_to_one_program(tokenizers):
    """The forward pass of each seed's freshly initialised policy lowers to the same HLO text."""

    def lowered_text(tokenizer) -> str:
        model = tiny_policy.init_policy(tokenizer, SIZE, seed=0)
        graphdef, state = nnx.split(model)

        def logits(state, ids):
            return nnx.merge(graphdef, state)(ids)

        ids = jnp.zeros((1, 16), jnp.int32)
        return jax.jit(logits).lower(state, ids).as_text()

    a, b = tokenizers
    assert lowered_text(a) == lowered_text(b)


def test_a_different_size_is_a_different_config(tokenizers):
    a, _ = tokenizers
    wider = tiny_policy.TinyPolicySize(**{**vars(SIZE), "hidden_size": 64})
    assert tiny_policy.model_config(a, wider) != tiny_policy.model_config(a, SIZE)
