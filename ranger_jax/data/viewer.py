"""A static HTML page for a trajectory shard: the conversation with every image the policy saw inline, its
crops, the answer with its references, the generated image (or the generator's error) and the rewards.

    python -m ranger_jax.data.viewer SHARD --out page.html [--limit N]

Images are embedded as data URLs, so the page is one self-contained file.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from ranger_jax import fileio
from ranger_jax.data import shards
from ranger_jax.data.trajectory import Trajectory, TrajectoryImage

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1100px;color:#222}
section.traj{border:1px solid #ccc;border-radius:8px;padding:1em;margin-bottom:2em}
.msg{border-left:4px solid #999;margin:.6em 0;padding:.3em .8em;background:#fafafa}
.msg.assistant{border-color:#2a7ae2;background:#f2f7ff}.msg.system{border-color:#888;background:#f4f4f4}
.msg.user{border-color:#3a3}.role{font-weight:bold;font-size:.85em;text-transform:uppercase;color:#555}
pre{white-space:pre-wrap;word-break:break-word;margin:.3em 0;font-size:.9em}
figure{display:inline-block;margin:.3em;vertical-align:top;text-align:center}
figure img{max-width:260px;max-height:260px;border:1px solid #bbb}figcaption{font-size:.8em;color:#555}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.2em .6em;text-align:left;font-size:.9em}
.zero{color:#b00;font-weight:bold}.error{color:#b00}.crop figcaption{color:#a50}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _img_tag(png: bytes, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _figure(image: TrajectoryImage, caption: str | None = None) -> str:
    label = image.img_id or f"image at token {image.token_index}"
    extra = f" · crop of {image.parent_id}" if image.parent_id else ""
    text = caption or f"{label}{extra} · grid {list(image.grid_thw)} · token {image.token_index}"
    css = ' class="crop"' if image.parent_id else ""
    return f"<figure{css}>{_img_tag(image.png, label)}<figcaption>{_e(text)}</figcaption></figure>"


def _content(content: Any, by_id: Mapping[str, TrajectoryImage], shown: set[str]) -> str:
    if isinstance(content, str):
        return f"<pre>{_e(content)}</pre>"
    parts = []
    for part in content or []:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            parts.append(f"<pre>{_e(part.get('text', ''))}</pre>")
        elif kind == "image":
            img_id = part.get("img_id")
            if img_id in by_id:
                shown.add(img_id)
                parts.append(_figure(by_id[img_id]))
            else:
                parts.append(f'<p class="error">[image {_e(img_id)} not recorded in this trajectory]</p>')
        else:
            parts.append(f"<pre>{_e(json.dumps(part, ensure_ascii=False))}</pre>")
    return "".join(parts)


def _conversation(trajectory: Trajectory) -> str:
    by_id = {im.img_id: im for im in trajectory.images if im.img_id}
    shown: set[str] = set()
    rows = []
    for message in trajectory.messages:
        role = str(message.get("role", "?"))
        rows.append(f'<div class="msg {_e(role)}"><div class="role">{_e(role)}</div>'
                    f"{_content(message.get('content'), by_id, shown)}</div>")
    unseen = [im for im in trajectory.images if not im.img_id or im.img_id not in shown]
    if unseen:
        rows.append("<h4>Images the policy saw (not placed in a message above)</h4>")
        rows += [_figure(im) for im in unseen]
    return "".join(rows) or "<p>(no messages recorded)</p>"


def _answer(trajectory: Trajectory) -> str:
    if trajectory.answer is None:
        return "<p>(no answer)</p>"
    by_id = {im.img_id: im for im in trajectory.images if im.img_id}
    refs = []
    for ref in trajectory.answer.reference_images:
        if ref.img_id in by_id:
            refs.append(_figure(by_id[ref.img_id], f"{ref.img_id}: {ref.note}"))
        else:
            refs.append(f'<p class="error">{_e(ref.img_id)} (unknown id): {_e(ref.note)}</p>')
    return f"<p><b>gen_prompt</b></p><pre>{_e(trajectory.answer.gen_prompt)}</pre>{''.join(refs)}"


def _table(values: Mapping[str, Any]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v)}"
                   "</td></tr>" for k, v in values.items())
    return f"<table>{rows}</table>" if rows else "<p>(none)</p>"


def _crops(trajectory: Trajectory) -> str:
    crops = [im for im in trajectory.images if im.parent_id]
    if not crops:
        return ""
    return "<h3>Crops</h3>" + "".join(_figure(im) for im in crops)


def render_trajectory(trajectory: Trajectory, index: int = 0) -> str:
    """One trajectory as an HTML `<section>`."""
    t = trajectory
    zero = t.reward_breakdown.get("zero_reason")
    zero_html = f' <span class="zero">zero: {_e(zero)}</span>' if zero else ""
    facts = {"task_id": t.task_id, "group_id": t.group_id, "sample_index": t.sample_index,
             "policy_version": t.policy_version, "termination": t.termination, "num_tokens": t.num_tokens,
             "generated_tokens": int(t.loss_mask.sum()), "num_images": len(t.images)}
    if t.generated_image is not None:
        generated = _img_tag(t.generated_image, "generated image")
    elif t.generation_error is not None:
        generated = f'<p class="error">generation failed: {_e(t.generation_error)}</p>'
    else:
        generated = "<p>(no generation)</p>"
    return (f'<section class="traj" id="t{index}"><h2>#{index} · task {_e(t.task_id)} · reward {t.reward:.4g}'
            f"{zero_html}</h2>{_table(facts)}"
            f"<h3>Rewards</h3>{_table(t.reward_breakdown)}"
            f"<h3>Conversation</h3>{_conversation(t)}{_crops(t)}"
            f"<h3>Answer</h3>{_answer(t)}<h3>Generated image</h3>{generated}"
            f"<h3>Timings (s)</h3>{_table(t.timings)}<h3>Metadata</h3>{_table(t.metadata)}</section>")


def render_html(trajectories: Iterable[Trajectory], *, title: str = "trajectories") -> str:
    """A complete, self-contained HTML page for `trajectories`."""
    sections = [render_trajectory(t, i) for i, t in enumerate(trajectories)]
    body = "".join(sections) or "<p>(shard is empty)</p>"
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>{_e(title)}</h1><p>{len(sections)} trajectories</p>"
            f"{body}</body></html>")


def write_viewer(shard: str | os.PathLike, out: str | os.PathLike, *, limit: int | None = None) -> int:
    """Renders the first `limit` trajectories of `shard` into `out` (atomically); returns how many."""
    trajectories = list(islice(shards.read_shard(shard), limit))
    page = render_html(trajectories, title=os.path.basename(os.fspath(shard)))
    fileio.write_atomic(Path(out), page.encode("utf-8"))
    return len(trajectories)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m ranger_jax.data.viewer SHARD --out FILE.html`: writes the viewer of one shard."""
    parser = argparse.ArgumentParser(prog="python -m ranger_jax.data.viewer", description=__doc__.splitlines()[0])
    parser.add_argument("shard", help="an .array_record trajectory shard")
    parser.add_argument("--out", required=True, help="HTML file to write")
    parser.add_argument("--limit", type=int, default=None, help="render only the first N trajectories")
    args = parser.parse_args(argv)
    count = write_viewer(args.shard, args.out, limit=args.limit)
    print(f"wrote {args.out} ({count} trajectories)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
