"""Builders for small, valid trajectories (shared by the data tests)."""
import io

import numpy as np
import pytest
from PIL import Image

from ranger_jax.data import trajectory
from ranger_jax.env import core

PAD, VISION_START, VISION_END = trajectory.IMAGE_PAD_ID, 151652, 151653


def png(colour, size=(16, 16)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "PNG")
    return buf.getvalue()


def build(seed: int = 0, *, num_images: int = 2, **overrides) -> trajectory.Trajectory:
    """A trajectory: prompt, an image per user turn (grid 1×4×4 → 4 pads), assistant turns with log-probs."""
    rng = np.random.default_rng(seed)
    ids, images, messages, generated = [151644, 872, 198], [], [], []
    for i in range(num_images):
        ids += [VISION_START]
        img_id = f"IMG_{i + 1:03d}"
        images.append(trajectory.TrajectoryImage(png(tuple(int(c) for c in rng.integers(0, 255, 3))), (1, 4, 4),
                                                 len(ids), img_id, parent_id="IMG_001" if i == 2 else None))
        ids += [PAD] * 4 + [VISION_END, 100 + i]
        messages.append({"role": "user", "content": [{"type": "image", "img_id": img_id},
                                                     {"type": "text", "text": f"<tool_response>result {i}"}]})
        generated += range(len(ids), len(ids) + 3)  # the assistant's 3 sampled tokens
        ids += rng.integers(0, 1000, 3).tolist()
        messages.append({"role": "assistant", "content": f"<tool_call>{{\"name\": \"crop\", \"i\": {i}}}</tool_call>"})
    mask, logprobs = np.zeros(len(ids), np.int8), np.zeros(len(ids), np.float32)
    mask[generated] = 1
    logprobs[generated] = -rng.random(len(generated))
    fields = dict(task_id=f"task-{seed}", group_id="group-0", sample_index=seed, policy_version=3,
                  token_ids=np.array(ids), loss_mask=mask, sampler_logprobs=logprobs,
                  images=tuple(images), termination=core.ANSWER, reward=0.25 * (seed % 4),
                  reward_breakdown={"reward": 0.25 * (seed % 4), "zero_reason": None, "components": {"kscore": {"v": 1}}},
                  answer=core.Answer("A red <lighthouse> & sea", (core.AnswerRef("IMG_001", "tower"),)),
                  messages=tuple(messages), generated_image=png("green"), timings={"rollout": 1.25},
                  metadata={"world": "sim", "seeds": [seed]})
    fields.update(overrides)
    return trajectory.Trajectory(**fields)


@pytest.fixture()
def make_trajectory():
    return build
