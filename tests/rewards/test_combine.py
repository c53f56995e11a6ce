"""Combined reward and the hard-zero rules."""
import math
import re

import pytest

from ranger_jax.env import core
from ranger_jax.rewards import combine


def answer(*ids, prompt="a red lighthouse"):
    return core.Answer(gen_prompt=prompt, reference_images=tuple(core.AnswerRef(i, "n") for i in ids))


KNOWN = ["IMG_001", "IMG_002", "IMG_003", "IMG_004", "IMG_005"]
OK = dict(question="draw it", has_ground_truth=True, termination="answer", answer=answer("IMG_001"),
          known_img_ids=KNOWN)


def test_combine_formula_alpha_clamp_and_floor():
    r = combine.combine(0.8, 0.4, 0.5, components={"k": 1})
    assert r.reward == pytest.approx(0.6) and r.zero_reason is None and r.components == {"k": 1}
    assert combine.combine(0.8, 0.2, 0.25).reward == pytest.approx(0.65)
    assert combine.combine(None, 0.4, 2.0).reward == pytest.approx(0.4) and combine.combine(None, 0.4, 2.0).alpha == 1
    assert combine.combine(0.8, None, -1).reward == pytest.approx(0.8)
    assert combine.combine(-0.5, 0.0, 0.0).reward == 0.0  # max(0, r)
    with pytest.raises(ValueError, match=r"image_reward is None but its weight is 0.5 \(alpha=0.5\)"):
        combine.combine(None, 0.5, 0.5)
    with pytest.raises(ValueError, match=r"text_reward is nan but its weight is 1"):
        combine.combine(0.2, math.nan, 1)
    with pytest.raises(ValueError, match="alpha is NaN"):
        combine.clamp_alpha(math.nan)


@pytest.mark.parametrize("changes, reason, detail", [
    (dict(has_ground_truth=False), combine.GT_MISSING, "no ground truth"),
    (dict(question="  "), combine.NO_QUESTION, "no question"),
    (dict(termination="max_response_length_exceeded"), combine.TERMINATED, "max_response_length_exceeded"),
    (dict(termination=core.CONTEXT_EXCEEDED), combine.TERMINATED, "context_exceeded"),
    (dict(termination=core.REPEATED_RESPONSE), combine.TERMINATED, "repeated_response"),
    (dict(termination=core.ERROR), combine.TERMINATED, "'error'"),
    (dict(termination=core.ANSWER_PARSE_FAILED, answer=None), combine.ANSWER_PARSE_FAILED, "could not be parsed"),
    (dict(termination=core.NO_ANSWER, answer=None), combine.NO_ANSWER, "'no_answer'"),
    (dict(termination=core.MAX_TURNS, answer=None), combine.NO_ANSWER, "'max_turns'"),
    (dict(answer=None), combine.NO_ANSWER, "no answer"),
    (dict(answer=answer("IMG_001", "IMG_042")), combine.UNKNOWN_IMG_ID, r"unknown image ids \['IMG_042'\]"),
    (dict(answer=answer("IMG_001", prompt=" ")), combine.EMPTY_GEN_PROMPT, "gen_prompt is empty"),
    (dict(answer=answer()), combine.REFERENCE_COUNT, r"0 valid local references, allowed \[1, 4\]"),
    (dict(answer=answer(*KNOWN)), combine.REFERENCE_COUNT, r"5 valid local references"),
    (dict(answer=answer("IMG_001", "IMG_002"), valid_img_ids=["IMG_003"]), combine.REFERENCE_COUNT,
     "0 valid local references"),
])
def test_hard_zero_rules(changes, reason, detail):
    zero = combine.hard_zero(**{**OK, **changes}, alpha=0.5)
    assert zero is not None and zero.reward == 0.0 and zero.zero_reason == reason and zero.alpha == 0.5
    assert re.search(detail, zero.detail), zero.detail


def test_reference_bounds_are_settings():
    two = {**OK, "answer": answer("IMG_001", "IMG_002")}
    assert combine.hard_zero(**two, max_references=1).detail == "2 valid local references, allowed [1, 1]"
    assert combine.hard_zero(**{**OK, "answer": answer()}, min_references=0) is None
    with pytest.raises(ValueError, match="need 0 <= min_references <= max_references, got 3, 2"):
        combine.hard_zero(**OK, min_references=3, max_references=2)


def test_valid_answers_pass_the_rules():
    assert combine.hard_zero(**OK) is None
    assert combine.hard_zero(**{**OK, "answer": answer(*KNOWN[:4])}) is None
    assert combine.hard_zero(**{**OK, "answer": answer("IMG_001", "IMG_002"), "valid_img_ids": ["IMG_002"]}) is None


def test_breakdown_validation_and_roundtrip():
    r = combine.combine(0.5, 1.0, 0.5, components={"kscore": {"overall": 0.5}})
    assert combine.RewardBreakdown.from_dict(r.to_dict()) == r
    with pytest.raises(ValueError, match="zero_reason 'bad' is not one of"):
        combine.RewardBreakdown(reward=0.0, zero_reason="bad")
    with pytest.raises(ValueError, match="reward must be finite and >= 0, got -1"):
        combine.RewardBreakdown(reward=-1.0)
    with pytest.raises(ValueError, match=r"unknown RewardBreakdown keys \['why'\]"):
        combine.RewardBreakdown.from_dict({"reward": 0.0, "why": "x"})
