"""Core value types: lazily decoded observation images behave like plain values."""

import pickle

import pytest
from PIL import Image

from ranger_jax import env
from ranger_jax.env.sim import build, load_tasks


def test_observed_image_with_pixels_or_a_loader():
    pixels = Image.new("RGB", (4, 3), (9, 8, 7))
    calls = []

    def load():
        calls.append(1)
        return pixels.copy()

    eager, lazy = env.ObservedImage("IMG_001", pixels), env.ObservedImage("IMG_001", load)
    assert "not decoded yet" in repr(lazy) and calls == []
    assert lazy.image.getpixel((0, 0)) == (9, 8, 7) and lazy.image.size == (4, 3) and calls == [1]
    assert lazy == eager and "RGB (4, 3)" in repr(lazy)
    assert pickle.loads(pickle.dumps(lazy)) == eager
    assert env.ObservedImage("IMG_002", pixels) != eager
    with pytest.raises(AttributeError, match="immutable"):
        lazy.img_id = "IMG_009"


def test_offline_observation_pixels_decode_on_access_even_after_close(tmp_path):
    root = build.build_world(tmp_path / "w", 1, 11)
    task = load_tasks(root)[0]
    with env.make("offline", world=str(root)) as tool_env:
        query = task.ground_truth["target_name"]
        state, obs = tool_env.step(tool_env.reset(task), '<tool_call>{"name": "image_search", "arguments": '
                                                         f'{{"query": "{query}", "top_k": 2}}}}</tool_call>')
        records = [state.images[o.img_id] for o in obs.images]
        assert len(obs.images) == 2 and all("not decoded yet" in repr(o) for o in obs.images)
        assert all(r.path.startswith(str(root.resolve())) for r in records)  # the world's own files
    for shown, record in zip(obs.images, records):  # the env is closed; the world files remain
        with Image.open(record.path) as f:
            assert shown.image.mode == "RGB" and shown.image.tobytes() == f.convert("RGB").tobytes()
        assert shown.image.size == (record.width, record.height)
