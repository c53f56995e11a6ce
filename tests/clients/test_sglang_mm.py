"""SGLang's one-placeholder-per-image convention on hand-written ids (pad id 5 stands for `<|image_pad|>`,
3 and 4 for `<|vision_start|>` / `<|vision_end|>`)."""
import numpy as np
import pytest

from ranger_jax.clients import sglang_mm

PAD = 5
# a prompt with two images of 3 and 2 placeholder tokens, as the processor expands them
EXPANDED = [1, 20, 3, 5, 5, 5, 4, 21, 22, 3, 5, 5, 4, 2]


def test_image_runs_and_collapse():
    assert sglang_mm.image_runs(EXPANDED, PAD) == [(3, 3), (10, 2)]
    assert sglang_mm.image_runs([5, 5, 1, 5], PAD) == [(0, 2), (3, 1)]  # runs at both ends
    assert sglang_mm.image_runs([1, 2], PAD) == []
    collapsed = sglang_mm.collapse_image_runs(np.asarray(EXPANDED, np.int32), PAD, [3, 2])
    assert collapsed.tolist() == [1, 20, 3, 5, 4, 21, 22, 3, 5, 4, 2] and collapsed.dtype == np.int64
    assert sglang_mm.collapse_image_runs([1, 2, 3], PAD, []).tolist() == [1, 2, 3]
    assert sglang_mm.collapse_image_runs([3, 5, 4], PAD, [1]).tolist() == [3, 5, 4]  # a 1-token image is unchanged


def test_collapse_refuses_runs_that_disagree_with_the_images():
    with pytest.raises(ValueError, match="the prompt holds 2 image placeholder runs but 1 images were given"):
        sglang_mm.collapse_image_runs(EXPANDED, PAD, [5])
    with pytest.raises(ValueError, match="image 1: the placeholder run at position 10 has 2 tokens but the image "
                                         "has 4"):
        sglang_mm.collapse_image_runs(EXPANDED, PAD, [3, 4])


def test_check_prompt_tokens():
    sglang_mm.check_prompt_tokens(14, 14, rid="ep#0", num_images=2)
    with pytest.raises(sglang_mm.PromptMismatch, match=r"request ep#1: SGLang ran a 12-token prompt but the "
                                                      r"trajectory's prompt has 14 tokens \(2 images\)"):
        sglang_mm.check_prompt_tokens(12, 14, rid="ep#1", num_images=2)
