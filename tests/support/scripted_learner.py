"""An SFT learner without a model, for the control flow of `sft.train` and the stages built on it."""

from ranger_jax.rl import sft


class ScriptedLearner:
    """An SFT learner whose loss at step s is `loss(s)`, recording the steps it saved at (with how many recent
    losses the checkpoint held)."""

    def __init__(self, loss):
        self.config = type("Config", (), {"objective": "sft"})()
        self.checkpoints, self.step_count, self.loss, self.saved = None, 0, loss, []

    def step(self, batch):
        self.step_count += 1
        return {"loss": self.loss(self.step_count), "tokens": 1.0}

    def save(self, *, data_state, force):
        self.saved.append((self.step_count, len(data_state[sft.RECENT_KEY])))
