"""`sft.train` with a rehearsal stream: one rehearsal update after each SFT update, logged, and resumed exactly."""

import json

import numpy as np
import pytest
from support.learner_batches import CONFIG, text_batch

from ranger_jax.models import qwen3_vl
from ranger_jax.rl import copy_warmup, sft
from ranger_jax.rl import learner as learner_lib
from ranger_jax.rl import learner_config
from ranger_jax.rl import metrics as metrics_lib

SETTINGS = learner_config.LearnerConfig(objective="sft", learning_rate=3e-3, schedule="cosine", warmup_steps=1,
                                        total_steps=8, weight_decay=0.0, max_grad_norm=1.0)


class Batches:
    """SFT batches with a Grain-like iterator state."""

    def __init__(self):
        self.index = 0

    def __iter__(self):
        return self

    def __next__(self):
        self.index += 1
        return text_batch(100 + self.index)

    def get_state(self):
        return {"index": self.index}

    def set_state(self, state):
        self.index = state["index"]


def rehearsal():
    return copy_warmup.RepeatedRandomTokens(np.arange(7, CONFIG.text_config.vocab_size), window=4, batch_size=4,
                                            seed=3, gaps=(4, 9))


def params(learner):
    import jax
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(learner.state.params)]


def test_rehearsal_interleaves_updates_and_resumes_to_the_same_parameters(tmp_path):
    whole = learner_lib.Learner(qwen3_vl.init(CONFIG, seed=0), SETTINGS)
    with metrics_lib.MetricsWriter(tmp_path / "metrics") as metrics:
        result = sft.train(whole, Batches(), num_steps=4, rehearsal=rehearsal(), metrics=metrics, progress=False)
    assert result.num_steps == 4 and whole.step_count == 8  # two updates per SFT step
    whole_recent = result.recent_losses
    rows = [json.loads(line) for line in (tmp_path / "metrics" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "sft/rehearsal_loss" in r] == [1, 2, 3, 4]
    assert all(r["sft/rehearsal_loss"] > 0 for r in rows if "sft/rehearsal_loss" in r)

    killed = learner_lib.Learner(qwen3_vl.init(CONFIG, seed=0), SETTINGS, checkpoint_dir=tmp_path / "ckpt")
    sft.train(killed, Batches(), num_steps=2, rehearsal=rehearsal(), checkpoint_every=2, progress=False)
    killed.close()
    resumed = learner_lib.Learner(qwen3_vl.init(CONFIG, seed=1), SETTINGS, checkpoint_dir=tmp_path / "ckpt")
    result = sft.train(resumed, Batches(), num_steps=4, rehearsal=rehearsal(), resume=True, progress=False)
    assert result.num_steps == 4 and resumed.step_count == 8
    # the losses of the steps before the kill came back with the checkpoint: the recent level is the whole run's
    assert result.recent_losses == pytest.approx(whole_recent) and len(result.recent_losses) == 4
    for got, want in zip(params(resumed), params(whole)):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_gaps_set_the_distance_of_the_repeat():
    stream = copy_warmup.RepeatedRandomTokens(np.arange(10, 60), window=3, batch_size=2, seed=0, gaps=(2, 7))
    a, b = next(stream), next(stream)
    assert a["input_ids"].shape == (2, 8) and b["input_ids"].shape == (2, 13)
    np.testing.assert_array_equal(b["input_ids"][:, :3], b["input_ids"][:, 10:])
    assert b["loss_mask"][:, :10].sum() == 0 and b["loss_mask"][:, 10:].all()
    state = stream.get_state()
    again = copy_warmup.RepeatedRandomTokens(np.arange(10, 60), window=3, batch_size=2, seed=0, gaps=(2, 7))
    again.set_state(state)
    np.testing.assert_array_equal(next(again)["input_ids"], next(stream)["input_ids"])
    with pytest.raises(ValueError, match="gaps"):
        copy_warmup.RepeatedRandomTokens(np.arange(10, 60), window=3, batch_size=2, gaps=(0,))
