"""First-turn rows (`data.first_turns`): the cut, the batches, their state, and clear errors."""

import dataclasses
import json

import numpy as np
import pytest

from ranger_jax.data import augment, first_turns

PAD, IMAGE = 0, 7


@dataclasses.dataclass
class Episode:
    token_ids: np.ndarray
    loss_mask: np.ndarray
    task_id: str = "t"
    image_pad_id: int = IMAGE


def _episode(prompt, first, rest, task_id="t"):
    ids = np.array(prompt + first + rest)
    mask = np.array([0] * len(prompt) + [1] * len(first) + [0, 1][:len(rest)] + [1] * max(0, len(rest) - 2))
    return Episode(ids, mask, task_id)


def test_the_cut_ends_with_the_first_assistant_turn():
    ids, mask = first_turns.first_turn([1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 1, 1, 0, 0, 1, 1])
    assert ids.tolist() == [1, 2, 3, 4] and mask.tolist() == [0, 0, 1, 1]
    ids, mask = first_turns.first_turn([1, 2, 3], [0, 1, 1])  # the turn runs to the end
    assert ids.tolist() == [1, 2, 3]


@pytest.mark.parametrize("ids, mask, kwargs, message", [
    ([1, 2], [0, 0], {}, "no assistant token"),
    ([1, 2], [0, 1, 1], {}, "one length"),
    ([1, IMAGE, 2, 3], [0, 0, 1, 1], {"image_pad_id": IMAGE, "where": "episode 4"}, "episode 4 has an image"),
])
def test_bad_episodes_are_named(ids, mask, kwargs, message):
    with pytest.raises(ValueError, match=message):
        first_turns.first_turn(ids, mask, **kwargs)


def test_batches_pad_rows_permute_them_and_resume_from_their_state():
    source = [_episode([10, 11], [20, 21, 22], [30, IMAGE, 31]), _episode([10, 12, 13], [23, 24], [IMAGE, 32])]
    perm = augment.TokenPermutation([[[20, 21, 22, 23, 24]]])
    stream = first_turns.FirstTurnBatches(source, pad_id=PAD, batch_size=4, seed=3, augment=perm)
    batch = next(stream)
    assert batch["input_ids"].shape == (4, 5) and batch["row_valid"].tolist() == [1, 1, 1, 1]
    for row in range(4):
        n = int(batch["attention_mask"][row].sum())
        got, mask = batch["input_ids"][row], batch["loss_mask"][row]
        assert n == 5 and (got[n:] == PAD).all() and (mask[n:] == 0).all()  # both cuts are 5 long
        assert set(got[mask > 0].tolist()) <= {20, 21, 22, 23, 24} and IMAGE not in got.tolist()
    state = json.loads(json.dumps(stream.get_state()))
    want = [next(stream) for _ in range(3)]
    again = first_turns.FirstTurnBatches(source, pad_id=PAD, batch_size=4, seed=3, augment=perm)
    again.set_state(state)
    for expected in want:
        np.testing.assert_array_equal(next(again)["input_ids"], expected["input_ids"])
    rows = {tuple(r) for b in want for r in b["input_ids"][:, 2:5].tolist()}
    assert len(rows) > 2  # the permutation is drawn afresh per row


def test_streams_refuse_bad_sources():
    with pytest.raises(ValueError, match="at least one episode"):
        first_turns.FirstTurnBatches([], pad_id=PAD, batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        first_turns.FirstTurnBatches([_episode([1], [2], [])], pad_id=PAD, batch_size=0)
    with pytest.raises(ValueError, match=r"episode 0 \(bad\) has an image"):
        first_turns.FirstTurnBatches([_episode([IMAGE], [2], [], task_id="bad")], pad_id=PAD, batch_size=2)
