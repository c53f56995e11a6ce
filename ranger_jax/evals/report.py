"""The reports of one eval run, rebuilt from its folder at the end of every run (and by `--report-only`):

    <run>/summary.json     the benchmark's scores (as its published scorer computes them), failures, settings
    <run>/report.md        the headline table, the failures by stage, links to everything else
    <run>/charts/*.png     bar charts of the scores by domain / category
    <run>/gallery.html     one card per item (`evals.gallery`)
    <run>/<benchmark's own result files>   (`Benchmark.export`)
"""

from __future__ import annotations

import collections
import io
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ranger_jax import fileio
from ranger_jax.evals import base, gallery, store
from ranger_jax.evals import items as items_lib

SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
CHARTS_DIR = "charts"
MAX_LISTED_FAILURES = 50
_SLUG = re.compile(r"[^a-z0-9]+")


def slug(text: str) -> str:
    """A file name from a title: lower case, runs of other characters as `_`."""
    return _SLUG.sub("_", text.lower()).strip("_") or "chart"


def bar_chart(path: str | Path, title: str, series: Mapping[str, Mapping[str, float]]) -> Path:
    """A PNG bar chart: one group of bars per label, one bar per series (a single series gives plain bars).

    Args:
        path: the PNG to write (atomically).
        title: the figure title.
        series: {series name: {label: value}}; labels are shown in first-seen order, a series lacking a label
            leaves a gap.
    """
    import matplotlib  # noqa: PLC0415 — heavy import, only when a figure is drawn

    matplotlib.use("Agg")
    from matplotlib import pyplot  # noqa: PLC0415

    labels = list(dict.fromkeys(label for values in series.values() for label in values))
    width = 0.8 / max(1, len(series))
    figure, axis = pyplot.subplots(figsize=(max(4.0, 0.9 * len(labels) * max(1, len(series)) + 1.5), 3.6))
    for k, (name, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i, label in enumerate(labels) if label in values]
        ys = [values[label] for label in labels if label in values]
        bars = axis.bar(xs, ys, width=width, label=name)
        axis.bar_label(bars, fmt="%.2f", fontsize=7)
    slanted = len(labels) > 4 or max((len(label) for label in labels), default=0) > 12
    axis.set_xticks(range(len(labels)), labels, rotation=20 if slanted else 0, ha="right" if slanted else "center",
                    fontsize=8)
    axis.set_title(title, fontsize=10)
    axis.grid(axis="y", alpha=0.3)
    if len(series) > 1:
        axis.legend(fontsize="small")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    pyplot.close(figure)
    fileio.write_atomic(path, buffer.getvalue())
    return Path(path)


def failures(items: Sequence[items_lib.Item], records: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Failed stages of the finished items: counts by stage, and the list (id, stage, reason) in item order."""
    listed = [{"id": item.id, **records[item.id]["failure"]} for item in items
              if item.id in records and records[item.id].get("failure")]
    return {"by_stage": dict(collections.Counter(f["stage"] for f in listed)), "items": listed}


def run_label(settings: Mapping[str, Any]) -> str:
    """How a run is named in tables: its `label` setting, else policy + generator."""
    if settings.get("label"):
        return str(settings["label"])
    policy = settings.get("policy") or {}
    generator = settings.get("generator") or {}
    who = policy.get("name") or "generator alone"
    return f"{who} + {generator.get('model') or generator.get('kind') or 'generator'}"


def _markdown(benchmark: base.Benchmark, label: str, summary: Mapping[str, Any], failed: Mapping[str, Any],
              settings: Mapping[str, Any], charts: Sequence[Path], exported: Sequence[Path], run_dir: Path) -> str:
    lines = [f"# {benchmark.name}: {label}", "",
             f"Items: {summary['num_items']}, finished: {summary['num_finished']}. Benchmark: "
             + ", ".join(f"`{path}`" for path in settings.get("bench") or []) + ".", "",
             benchmark.table(summary, label), ""]
    if failed["items"]:
        stages = ", ".join(f"{stage} {n}" for stage, n in sorted(failed["by_stage"].items()))
        lines += [f"## Failed stages ({stages})", "", "| item | stage | reason |", "|---|---|---|"]
        for entry in failed["items"][:MAX_LISTED_FAILURES]:
            reason = str(entry["reason"]).replace("|", "\\|").replace("\n", " ")[:300]
            lines.append(f"| {entry['id']} | {entry['stage']} | {reason} |")
        if len(failed["items"]) > MAX_LISTED_FAILURES:
            lines.append(f"| … | | {len(failed['items']) - MAX_LISTED_FAILURES} more in summary.json |")
        lines.append("")
    lines += ["## Files", "", f"- [gallery]({gallery.GALLERY_FILE})", f"- [summary]({SUMMARY_FILE})"]
    lines += [f"- ![{path.stem}]({path.relative_to(run_dir).as_posix()})" for path in charts]
    lines += [f"- [{path.relative_to(run_dir).as_posix()}]({path.relative_to(run_dir).as_posix()})"
              for path in exported]
    return "\n".join(lines) + "\n"


def write_reports(run_dir: str | Path, benchmark: base.Benchmark, items: Sequence[items_lib.Item],
                  records: Mapping[str, Mapping[str, Any]], settings: Mapping[str, Any]) -> dict[str, Any]:
    """Scores the run and writes every report file (layout in the module docstring); returns `summary.json`."""
    run_dir = Path(run_dir)
    scores = benchmark.summarize(items, records)
    label = run_label(settings)
    failed = failures(items, records)
    summary = {"benchmark": benchmark.name, "label": label, "settings": dict(settings),
               "num_items": len(items), "num_finished": sum(item.id in records for item in items),
               "scores": scores, "failures": failed}
    charts = [bar_chart(run_dir / CHARTS_DIR / f"{slug(title)}.png", f"{label}: {title}", {label: values})
              for title, values in benchmark.bars(scores).items() if values]
    exported = benchmark.export(items, records, run_dir)
    gallery.write_gallery(run_dir, benchmark.name, label, items, records)
    store.write_json(run_dir / SUMMARY_FILE, summary)
    text = _markdown(benchmark, label, {**scores, "num_items": summary["num_items"],
                                        "num_finished": summary["num_finished"]}, failed, settings, charts,
                     exported, run_dir)
    fileio.write_atomic(run_dir / REPORT_FILE, text.encode("utf-8"))
    return summary
