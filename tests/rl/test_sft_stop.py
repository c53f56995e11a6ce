"""`sft.train(stop_below=...)`: stops once the mean loss of a full window of recent steps is low enough, saved."""

import pytest
from support.scripted_learner import ScriptedLearner

from ranger_jax.rl import sft


def batches():
    return iter(lambda: {}, None)


@pytest.mark.parametrize("stop_below, steps", [(None, 300), (0.05, 300), (1.0, sft.RECENT_STEPS),
                                               (0.1, 120 + sft.RECENT_STEPS - 1)])
def test_training_stops_once_a_full_window_is_at_or_below_the_level(stop_below, steps):
    learner = ScriptedLearner(lambda s: 1.0 if s < 120 else 0.1)  # the window's mean reaches 0.1 at its 50th step
    result = sft.train(learner, batches(), num_steps=300, checkpoint_every=100, progress=False, stop_below=stop_below)
    assert result.num_steps == learner.step_count == steps
    # checkpoints at the usual steps, and at the stop, with the recent losses that decided it
    assert learner.saved == [(s, sft.RECENT_STEPS) for s in (100, 200, 300) if s < steps] + [(steps, sft.RECENT_STEPS)]
    if stop_below is not None and steps < 300:
        assert result.recent_loss <= stop_below
