"""The static HTML viewer."""
import base64
import io
import re

from PIL import Image

from ranger_jax.data import shards, viewer


def embedded_pngs(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_page_shows_images_crops_answer_generation_and_rewards(tmp_path, make_trajectory):
    ok = make_trajectory(0, num_images=3, reward_breakdown={"reward": 0.0, "zero_reason": "reference_count"})
    failed = make_trajectory(1, num_images=1, generated_image=None, generation_error="HTTP 500 <oops>")
    shard = shards.write_shard(tmp_path / "v.array_record", [ok, failed])
    out = tmp_path / "page.html"
    assert viewer.main([str(shard), "--out", str(out)]) == 0
    page = out.read_text()
    pngs = embedded_pngs(page)
    for image in (*ok.images, *failed.images):
        assert image.png in pngs  # every image the policy saw is inline
    assert ok.generated_image in pngs
    # conversation (3 + 1 images), crop gallery (1), answer references (1 + 1), generated image (1)
    assert len(pngs) == 4 + 1 + 2 + 1
    assert "crop of IMG_001" in page and "<h3>Crops</h3>" in page
    assert "A red &lt;lighthouse&gt; &amp; sea" in page and "<lighthouse>" not in page  # escaped
    assert "generation failed: HTTP 500 &lt;oops&gt;" in page
    assert "zero: reference_count" in page and "task-1" in page and "&lt;tool_response&gt;result 0" in page
    assert all(Image.open(io.BytesIO(p)).size for p in pngs)


def test_limit_empty_and_unplaced_images(tmp_path, make_trajectory):
    plain = make_trajectory(2, num_images=1, messages=({"role": "user", "content": "see image"},
                                                       {"role": "assistant", "content": [{"type": "image",
                                                                                          "img_id": "IMG_404"}]}))
    shard = shards.write_shard(tmp_path / "p.array_record", [plain, make_trajectory(3)])
    assert viewer.write_viewer(shard, tmp_path / "one.html", limit=1) == 1
    page = (tmp_path / "one.html").read_text()
    assert "1 trajectories" in page and "Images the policy saw (not placed in a message above)" in page
    assert "[image IMG_404 not recorded in this trajectory]" in page
    assert plain.images[0].png in embedded_pngs(page)
    assert "(shard is empty)" in viewer.render_html([])
