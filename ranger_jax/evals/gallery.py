"""A static HTML gallery of an eval run: one card per item, in benchmark order.

Each card shows the prompt, the policy's answer and the references it chose (a crop next to the image it was cut
from, with the crop's box drawn on it), the generated image and what the generator was given, the ground truth,
the judge's verdict and scores, and any failed stage with its reason. Images are linked by paths relative to the run
folder (ground truth by its path or URL), so the page opens from the folder without a server.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ranger_jax import fileio
from ranger_jax.evals import items as items_lib
from ranger_jax.evals import store

GALLERY_FILE = "gallery.html"
STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px;color:#222}
section.item{border:1px solid #ccc;border-radius:8px;padding:.8em 1em;margin-bottom:1.5em}
section.failed{border-color:#c44}h2{font-size:1.05em;margin:.2em 0}.tag{color:#666;font-size:.85em}
.prompt{background:#f6f6f6;padding:.4em .7em;border-radius:4px;white-space:pre-wrap}
figure{display:inline-block;margin:.3em;vertical-align:top;text-align:center;max-width:280px}
figure img{max-width:260px;max-height:260px;border:1px solid #bbb;display:block}
figcaption{font-size:.8em;color:#555;word-break:break-word}.box{position:relative;display:inline-block}
.box span{position:absolute;border:2px solid #e33;box-sizing:border-box}
table{border-collapse:collapse;margin:.3em 0}td,th{border:1px solid #ddd;padding:.15em .5em;font-size:.85em;
text-align:left}.error{color:#b00}pre{white-space:pre-wrap;word-break:break-word;font-size:.8em}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _src(path: str, base: Path) -> str:
    """An image reference usable from the gallery: URLs as written, files relative to the run folder."""
    if items_lib.is_url(path):
        return path
    return Path(os.path.relpath(path, base)).as_posix()


def _figure(src: str, caption: str, box: Sequence[float] | None = None, size: Sequence[int] | None = None) -> str:
    image = f'<img src="{_e(src)}" alt="{_e(caption)}">'
    if box is not None and size is not None and size[0] and size[1]:
        x0, y0, x1, y1 = box
        width, height = size
        style = (f"left:{100 * x0 / width:.2f}%;top:{100 * y0 / height:.2f}%;"
                 f"width:{100 * (x1 - x0) / width:.2f}%;height:{100 * (y1 - y0) / height:.2f}%")
        image = f'<div class="box">{image}<span style="{style}"></span></div>'
    return f"<figure>{image}<figcaption>{_e(caption)}</figcaption></figure>"


def _references(record: Mapping[str, Any], folder: str) -> str:
    agent = record.get("agent") or {}
    figures = []
    for ref in agent.get("references") or []:
        title = " · ".join(str(v) for v in (ref.get("img_id"), ref.get("note"), ref.get("title")) if v)
        crop = ref.get("crop")
        if crop and crop.get("root_file"):
            figures.append(_figure(f"{folder}/{crop['root_file']}", f"{crop.get('root_id')}: {ref.get('img_id')} "
                                   "is cut from the box", crop.get("box"),
                                   (crop.get("root_width"), crop.get("root_height"))))
        if ref.get("file"):
            figures.append(_figure(f"{folder}/{ref['file']}", ("crop " if crop else "") + title))
        else:
            figures.append(f'<figure class="error">{_e(title)}: image not available</figure>')
    if not agent:
        return ""
    head = (f"<p><b>Policy</b> {_e(agent.get('policy', ''))}: termination {_e(agent.get('termination'))}, "
            f"{_e(agent.get('num_turns'))} turns, {_e(agent.get('num_tool_calls'))} tool calls"
            + (f' <span class="error">({_e(agent["error"])})</span>' if agent.get("error") else "") + "</p>")
    answer = f"<p><b>gen_prompt</b> {_e(agent['gen_prompt'])}</p>" if agent.get("gen_prompt") else ""
    return head + answer + ("<div>" + "".join(figures) + "</div>" if figures else "<p>No references.</p>")


def _scores(record: Mapping[str, Any]) -> str:
    flat = {k: v for k, v in (record.get("scores") or {}).items() if not isinstance(v, (dict, list))}
    nested = {k: v for k, v in (record.get("scores") or {}).items() if isinstance(v, (dict, list))}
    cells = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in flat.items())
    for key, value in nested.items():
        cells += f"<tr><th>{_e(key)}</th><td><pre>{_e(json.dumps(value, ensure_ascii=False))}</pre></td></tr>"
    judge = record.get("judge") or {}
    details = (f"<details><summary>judge output</summary><pre>{_e(json.dumps(judge, indent=1, ensure_ascii=False))}"
               "</pre></details>") if judge else ""
    return (f"<table>{cells}</table>" if cells else "") + details


def _card(item: items_lib.Item, record: Mapping[str, Any] | None, run_dir: Path) -> str:
    tags = " · ".join(_e(t) for t in (item.category, item.subcategory) if t)
    if record is None:
        return (f'<section class="item"><h2>{_e(item.id)} <span class="tag">{tags}</span></h2>'
                f'<div class="prompt">{_e(item.prompt)}</div><p>Not run yet.</p></section>')
    folder = f"{store.ITEMS_DIR}/{items_lib.file_stem(item.id)}"
    failure = record.get("failure")
    status = (f'<p class="error">Failed at {_e(failure["stage"])}: {_e(failure["reason"])}</p>' if failure else "")
    generation = record.get("generation") or {}
    generated = ""
    if record.get("image"):
        generated = _figure(f"{folder}/{record['image']}", f"generated ({generation.get('source', '')})")
    elif generation:
        generated = f'<figure class="error">no image: {_e(generation.get("error"))}</figure>'
    truth = "".join(_figure(_src(path, run_dir), "ground truth") for path in item.ground_truth)
    inputs = "".join(_figure(_src(path, run_dir), "input image") for path in item.inputs)
    given = (f"<p class=\"tag\">generator prompt: {_e(generation.get('prompt', ''))}; references: "
             f"{_e(', '.join(generation.get('references') or []) or 'none')}</p>") if generation else ""
    criteria = "".join(f"<li>{_e(c)}</li>" for c in item.criteria)
    return (f'<section class="item{" failed" if failure else ""}" id="{_e(items_lib.file_stem(item.id))}">'
            f'<h2>{_e(item.id)} <span class="tag">{tags}</span></h2><div class="prompt">{_e(item.prompt)}</div>'
            + (f"<p class=\"tag\">{_e(item.explanation)}</p>" if item.explanation else "")
            + (f"<ul class=\"tag\">{criteria}</ul>" if criteria else "") + status
            + _references(record, folder) + f"<div>{inputs}{generated}{truth}</div>{given}" + _scores(record)
            + "</section>")


def render(benchmark: str, label: str, items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]],
           run_dir: Path) -> str:
    """The gallery page of a run as HTML text."""
    finished = sum(item.id in records for item in items)
    failed = sum(bool(records[item.id].get("failure")) for item in items if item.id in records)
    cards = "".join(_card(item, records.get(item.id), run_dir) for item in items)
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{_e(benchmark)}: {_e(label)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{_e(benchmark)}: {_e(label)}</h1>"
            f"<p>{len(items)} items, {finished} finished, {failed} with a failed stage.</p>{cards}</body></html>")


def write_gallery(run_dir: str | Path, benchmark: str, label: str, items: Sequence[items_lib.Item],
                  records: Mapping[str, Mapping[str, Any]]) -> Path:
    """Writes `gallery.html` into the run folder (atomically); returns its path."""
    run_dir = Path(run_dir)
    path = run_dir / GALLERY_FILE
    fileio.write_atomic(path, render(benchmark, label, items, records, run_dir.resolve()).encode("utf-8"))
    return path
