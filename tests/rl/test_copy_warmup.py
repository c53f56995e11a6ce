"""The copy warm-up (`rl.copy_warmup`): its batches, and that a tied tiny policy learns to copy from them."""

import numpy as np
import pytest
from support.tiny_tokenizer import write_tiny_tokenizer

from ranger_jax.processing import tokenizer as tokenizer_lib
from ranger_jax.rl import copy_warmup, learner_config, tiny_policy
from ranger_jax.rl import learner as learner_lib


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    write_tiny_tokenizer(folder, vocab_size=300)
    return tokenizer_lib.load_tokenizer(folder)


def test_rows_repeat_their_first_window_and_only_the_repeat_is_scored():
    ids = np.arange(40, 90)
    stream = copy_warmup.RepeatedRandomTokens(ids, window=5, batch_size=3, seed=1)
    batch = next(stream)
    x = batch["input_ids"]
    assert x.shape == (3, 15) and x.dtype == np.int32
    np.testing.assert_array_equal(x[:, :5], x[:, 10:])
    assert np.isin(x, ids).all()
    np.testing.assert_array_equal(batch["loss_mask"][:, :10], 0)
    np.testing.assert_array_equal(batch["loss_mask"][:, 10:], 1)
    assert batch["row_valid"].tolist() == [1, 1, 1] and batch["attention_mask"].all()
    again = next(copy_warmup.RepeatedRandomTokens(ids, window=5, batch_size=3, seed=1))
    np.testing.assert_array_equal(again["input_ids"], x)  # the seed fixes the stream
    assert not np.array_equal(next(stream)["input_ids"], x)


def test_ordinary_ids_leave_out_the_special_tokens(tokenizer):
    ids = copy_warmup.ordinary_ids(tokenizer)
    for special in (tokenizer.im_start_id, tokenizer.im_end_id, tokenizer.image_pad_id, tokenizer.eos_id,
                    tokenizer.tool_call_id):
        assert special not in ids
    assert ids.size > 100


@pytest.mark.parametrize("kwargs, message", [({"steps": 0}, "steps"), ({"window": -1}, "window"),
                                             ({"batch_size": True}, "batch_size")])
def test_bad_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        copy_warmup.CopyWarmupConfig(**kwargs)
    with pytest.raises(ValueError, match="at least 2"):
        copy_warmup.RepeatedRandomTokens(np.array([3]), window=2, batch_size=1)


def test_a_tied_tiny_policy_learns_to_copy(tokenizer):
    size = tiny_policy.TinyPolicySize(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=300)
    model = tiny_policy.init_policy(tokenizer, size)
    assert model.config.tie_word_embeddings
    learner = learner_lib.Learner(model, learner_config.LearnerConfig(
        objective="sft", learning_rate=3e-3, schedule="constant", weight_decay=0.0, max_grad_norm=1.0))
    config = copy_warmup.CopyWarmupConfig(steps=150, batch_size=16, window=16, seed=0)
    before = copy_warmup.repeat_loss(learner, next(copy_warmup.RepeatedRandomTokens(
        copy_warmup.ordinary_ids(tokenizer), window=16, batch_size=16, seed=9)))
    last = copy_warmup.train(learner, tokenizer, config, progress=False)
    assert before > 4.0  # ~log(ordinary vocabulary): nothing to go on before it copies
    assert last["repeat_loss"] < 0.5, last  # measured 0.06
    assert learner.step_count == 150
