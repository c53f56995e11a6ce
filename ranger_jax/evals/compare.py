"""Runs of one benchmark side by side: a markdown table of their headline scores, a grouped bar chart, and a page
showing each item's generated image from every run.

    compare_runs(["runs/knowgen-sft", "runs/knowgen-grpo"], out_dir="runs/compare")

Each run folder is read as its reports left it (`summary.json` and the item records); a run whose reports are
missing is summarised again only from what `summary.json` holds, so run an eval (or `--report-only`) first.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ranger_jax import fileio
from ranger_jax.evals import knowgen, mind_bench, report, savanna, store, wise
from ranger_jax.evals import items as items_lib

HEADLINES: dict[str, Callable[[Mapping[str, Any]], dict[str, float | None]]] = {
    knowgen.NAME: knowgen.headline, savanna.NAME: savanna.headline, mind_bench.NAME: mind_bench.headline,
    wise.NAME: wise.headline,
}
TABLE_FILE = "compare.md"
PAGE_FILE = "compare.html"
CHART_FILE = "compare.png"


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A run's `summary.json`.

    Raises:
        FileNotFoundError: the folder has no summary (naming it).
    """
    path = Path(run_dir) / report.SUMMARY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no {report.SUMMARY_FILE}: run the eval (or its --report-only) first")
    return json.loads(path.read_text("utf-8"))


def table(labels: Sequence[str], rows: Sequence[Mapping[str, float | None]]) -> str:
    """A markdown table: one row per run, one column per headline score ("–" where a run has none)."""
    columns = list(dict.fromkeys(column for row in rows for column in row))
    lines = ["| run | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for label, row in zip(labels, rows):
        cells = ["–" if row.get(c) is None else f"{row[c]:.2f}" for c in columns]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(run_dir: Path, out_dir: Path, record: Mapping[str, Any] | None) -> str:
    if record is None:
        return "<td>not run</td>"
    parts = []
    if record.get("image"):
        src = Path(os.path.relpath(run_dir / store.ITEMS_DIR / items_lib.file_stem(record["id"]) / record["image"],
                                   out_dir)).as_posix()
        parts.append(f'<img src="{html.escape(src)}">')
    if record.get("failure"):
        failure = record["failure"]
        parts.append(f'<div class="error">{html.escape(failure["stage"])}: {html.escape(str(failure["reason"]))}</div>')
    flat = {k: v for k, v in (record.get("scores") or {}).items() if isinstance(v, (int, float, str, bool))}
    parts.append("<div>" + html.escape(", ".join(f"{k}={v}" for k, v in flat.items())) + "</div>")
    return "<td>" + "".join(parts) + "</td>"


def page(labels: Sequence[str], run_dirs: Sequence[Path], out_dir: Path) -> str:
    """HTML: one row per item (in the first run's order), one column per run with its image and scores."""
    runs = [store.RunStore(d).records() for d in run_dirs]
    order: dict[str, tuple[int, str]] = {}
    for records in runs:
        for record in records.values():
            order.setdefault(record["id"], (record.get("index", 0), record.get("prompt", "")))
    head = "".join(f"<th>{html.escape(label)}</th>" for label in labels)
    rows = []
    for item_id, (_, prompt) in sorted(order.items(), key=lambda kv: kv[1][0]):
        cells = "".join(_cell(d, out_dir, records.get(item_id)) for d, records in zip(run_dirs, runs))
        rows.append(f"<tr><th>{html.escape(item_id)}<div class=\"p\">{html.escape(prompt)}</div></th>{cells}</tr>")
    style = ("body{font-family:system-ui,sans-serif;margin:1em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:.3em;vertical-align:top;font-size:.8em;max-width:280px}"
             "img{max-width:260px;max-height:260px;display:block}.error{color:#b00}.p{font-weight:normal}")
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>compare</title><style>{style}</style></head>"
            f"<body><table><tr><th>item</th>{head}</tr>{''.join(rows)}</table></body></html>")


def compare_runs(run_dirs: Sequence[str | os.PathLike], *, out_dir: str | os.PathLike | None = None,
                 labels: Sequence[str] | None = None) -> str:
    """The comparison table of runs of one benchmark; with `out_dir`, also writes `compare.md`, `compare.png`
    (grouped bars of the headline scores) and `compare.html` (every item's image from every run).

    Args:
        run_dirs: the run folders, in the order shown.
        out_dir: where to write the files (None: only return the table).
        labels: names of the runs (default: each run's label, made unique with its folder name when two agree).

    Raises:
        FileNotFoundError: a folder without `summary.json`.
        ValueError: no runs, runs of different benchmarks, an unknown benchmark, or labels that do not match.
    """
    if not run_dirs:
        raise ValueError("compare_runs needs at least one run folder")
    dirs = [Path(d) for d in run_dirs]
    summaries = [read_summary(d) for d in dirs]
    names = sorted({s["benchmark"] for s in summaries})
    if len(names) != 1:
        raise ValueError(f"runs of different benchmarks cannot be compared: "
                         f"{[(str(d), s['benchmark']) for d, s in zip(dirs, summaries)]}")
    if names[0] not in HEADLINES:
        raise ValueError(f"unknown benchmark {names[0]!r}; known: {sorted(HEADLINES)}")
    if labels is None:
        labels = [s["label"] for s in summaries]
        if len(set(labels)) != len(labels):
            labels = [f"{label} ({d.name})" for label, d in zip(labels, dirs)]
    if len(labels) != len(dirs):
        raise ValueError(f"{len(labels)} labels for {len(dirs)} runs")
    rows = [HEADLINES[names[0]](s["scores"]) for s in summaries]
    text = f"# {names[0]}\n\n" + table(labels, rows) + "\n"
    if out_dir is not None:
        out = Path(out_dir)
        fileio.write_atomic(out / TABLE_FILE, text.encode("utf-8"))
        series = {label: {k: v for k, v in row.items() if v is not None} for label, row in zip(labels, rows)}
        if any(series.values()):
            report.bar_chart(out / CHART_FILE, f"{names[0]}: runs compared", series)
        fileio.write_atomic(out / PAGE_FILE, page(labels, dirs, out.resolve()).encode("utf-8"))
    return text
