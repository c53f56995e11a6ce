"""Training metrics: JSONL + TensorBoard sink, PNG curves, and the decoupled-RL health numbers.

    with metrics.MetricsWriter("/runs/grpo1") as sink:                 # metrics.jsonl + TensorBoard events
        sink.write(step, {"loss": 0.31, "reward_mean": 0.42, "staleness": metrics.staleness_histogram(7, versions)})
    metrics.plot_curves(["/runs/grpo1/metrics.jsonl"], "/runs/grpo1/curves.png", keys=["reward_mean", "loss"])

`metrics.jsonl` holds one JSON object per `write`: `{"step", "time", **values}` with nested dicts kept as they are
and non-finite numbers written as null. TensorBoard gets every number as a scalar, nested keys joined with "/"
(`staleness/0`, `staleness/1`). `tensorboardX` and `matplotlib` are imported on first use, so processes that only
need the pure helpers (actors) do not pay for them.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import numbers
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ranger_jax import fileio

JSONL_NAME = "metrics.jsonl"


def zero_variance_share(groups: Iterable[Any], *, atol: float = 1e-6) -> float:
    """The share of GRPO groups whose rewards are all equal (within `atol`): their advantages are all zero, so they
    teach nothing.

    Args:
        groups: per group, its rewards: a sequence of floats, or an object with a `rewards` attribute
            (`runner.Group`). A one-member group counts as zero-variance.
        atol: largest reward spread (max - min) still counted as no variance.

    Returns:
        The share in [0, 1]; NaN for no groups.

    Raises:
        ValueError: a group without rewards (naming its position).
    """
    flags = []
    for index, group in enumerate(groups):
        rewards = np.asarray(getattr(group, "rewards", group), np.float64).reshape(-1)
        if not rewards.size:
            raise ValueError(f"group {index} has no rewards")
        flags.append(float(np.ptp(rewards)) <= atol)
    return float(np.mean(flags)) if flags else math.nan


def staleness_histogram(learner_version: int | Sequence[int] | np.ndarray,
                        sample_versions: Sequence[int] | np.ndarray) -> dict[int, int]:
    """Counts of staleness, learner version − sample version, over trained rows.

    Args:
        learner_version: the learner's weights version (one int, or [B] per row).
        sample_versions: [B] the policy version each row was sampled with; rows with a negative version (SFT data,
            `policy_version` -1) are left out.

    Returns:
        {staleness: count}, ascending by staleness.

    Raises:
        ValueError: a row sampled with a version newer than the learner's (naming the row and both versions), or
            shapes that do not broadcast.
    """
    samples = np.asarray(sample_versions, np.int64).reshape(-1)
    learner = np.broadcast_to(np.asarray(learner_version, np.int64), samples.shape)
    keep = samples >= 0
    staleness = learner - samples
    newer = np.flatnonzero(keep & (staleness < 0))
    if newer.size:
        row = int(newer[0])
        raise ValueError(f"row {row} was sampled with version {int(samples[row])}, newer than the learner's "
                         f"{int(learner[row])}")
    values, counts = np.unique(staleness[keep], return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts)}


def _json_value(key: str, value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _json_value(f"{key}/{k}", v) for k, v in value.items()}
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value) if math.isfinite(value) else None
    if value is None or isinstance(value, str):
        return value
    if hasattr(value, "ndim") and getattr(value, "ndim") == 0:  # a 0-d jax array
        return _json_value(key, np.asarray(value))
    raise TypeError(f"metric {key!r} is a {type(value).__name__}; metrics are numbers, strings or dicts of them")


def _scalars(prefix: str, value: Any) -> Iterable[tuple[str, float]]:
    """(tag, number) pairs of a JSON-ready value for TensorBoard (strings and nulls are JSONL only)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _scalars(f"{prefix}/{k}", v)
    elif isinstance(value, (int, float)):  # bools too
        yield prefix, float(value)


def _stage_row_after(line: str, prefix: str, after_step: int) -> bool:
    """Whether a metrics.jsonl line is a row of the stage `prefix` ("sft/") past `after_step` (blank or foreign
    lines are kept)."""
    try:
        row = json.loads(line)
    except ValueError:
        return False
    if not isinstance(row, dict) or not isinstance(row.get("step"), int):
        return False
    names = [key for key in row if key not in ("step", "time")]
    return bool(names) and all(key.startswith(prefix) for key in names) and row["step"] > after_step


class MetricsWriter:
    """Appends metrics to `folder/metrics.jsonl` and to TensorBoard event files in `folder` (see the module
    docstring). Use it as a context manager, or call `close()`. In a multi-process learner, make it on process 0.

    Args:
        folder: created if missing; a resumed run appends to its existing `metrics.jsonl` (a stage that starts
            again first drops its own later rows: `discard`).
    """

    def __init__(self, folder: str | os.PathLike):
        import tensorboardX  # noqa: PLC0415 — heavy import, kept out of processes that never write metrics

        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.folder / JSONL_NAME
        self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
        self._tb = tensorboardX.SummaryWriter(logdir=str(self.folder))

    def write(self, step: int, values: Mapping[str, Any]) -> None:
        """Records `values` at `step`: one JSONL line and one TensorBoard scalar per number; both are flushed.

        Raises:
            ValueError: a negative or non-int step, or a value named `step` or `time`.
            TypeError: a value that is not a number, string, None or dict of them (naming its key).
        """
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise ValueError(f"step must be an int >= 0; got {step!r}")
        clash = sorted({"step", "time"} & set(values))
        if clash:
            raise ValueError(f"metric names {clash} are reserved for the record itself")
        row = {str(k): _json_value(str(k), v) for k, v in values.items()}
        now = time.time()
        self._jsonl.write(json.dumps({"step": int(step), "time": now, **row}) + "\n")
        self._jsonl.flush()
        for key, value in row.items():
            for tag, number in _scalars(key, value):
                self._tb.add_scalar(tag, number, global_step=int(step), walltime=now)
        self._tb.flush()

    def discard(self, prefix: str, *, after_step: int = 0) -> int:
        """Removes from `metrics.jsonl` the rows of one stage written after `after_step`: those whose every metric
        is named `<prefix>/…` and whose step is greater. A stage that starts again (from its checkpoint at
        `after_step`, or from scratch with 0) calls this first, so the file holds each of its steps once, from the
        attempt that counts. The file is rewritten atomically; returns the number of rows removed.

        TensorBoard's event files keep what they hold: its purge (a restart event) hides every tag past a step,
        other stages' too, so the earlier attempt's points stay there.

        Raises:
            ValueError: an empty prefix, or a negative or non-int `after_step`.
        """
        if not prefix or prefix.endswith("/"):
            raise ValueError(f"discard needs a stage prefix without the trailing '/'; got {prefix!r}")
        if isinstance(after_step, bool) or not isinstance(after_step, numbers.Integral) or after_step < 0:
            raise ValueError(f"after_step must be an int >= 0; got {after_step!r}")
        self._jsonl.flush()
        lines = self.jsonl_path.read_text("utf-8").splitlines(keepends=True)
        kept = [line for line in lines if not _stage_row_after(line, prefix + "/", after_step)]
        if len(kept) == len(lines):
            return 0
        self._jsonl.close()
        fileio.write_atomic(self.jsonl_path, "".join(kept).encode("utf-8"))
        self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")
        return len(lines) - len(kept)

    def close(self) -> None:
        """Flushes and closes both files."""
        self._jsonl.close()
        self._tb.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a metrics JSONL file; blank lines are skipped.

    Raises:
        ValueError: a line that is not a JSON object (naming the file and line).
    """
    rows = []
    for number, line in enumerate(Path(path).read_text("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{path}:{number}: not JSON ({err})") from err
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: a metrics row must be a JSON object")
        rows.append(row)
    return rows


def _lookup(row: Mapping[str, Any], key: str) -> Any:
    """`row[key]`, where "a/b" also reaches a nested `row["a"]["b"]`."""
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("/"):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def series(rows: Iterable[Mapping[str, Any]], key: str, *, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
    """(x values, key values) of the rows holding both as numbers, sorted by x; a repeated x keeps its last row
    (a resumed run rewrites the steps after its checkpoint)."""
    points: dict[float, float] = {}
    for row in rows:
        xv, yv = _lookup(row, x), _lookup(row, key)
        if isinstance(xv, (int, float)) and isinstance(yv, (int, float)) and not isinstance(yv, bool):
            points[float(xv)] = float(yv)
    xs = np.asarray(sorted(points), np.float64)
    return xs, np.asarray([points[v] for v in xs], np.float64)


def _curves_figure(jsonl_paths: Sequence[str | os.PathLike], *, keys: Sequence[str], labels: Sequence[str] | None,
                   x: str, title: str | None, log_keys: Sequence[str],
                   reference: Mapping[str, Mapping[str, float]]) -> Any:
    """The figure `plot_curves` saves (its arguments and errors); the caller closes it."""
    import matplotlib  # noqa: PLC0415 — heavy import, only when a figure is drawn

    matplotlib.use("Agg")
    from matplotlib import pyplot, ticker  # noqa: PLC0415

    if not keys:
        raise ValueError("plot_curves needs at least one key")
    for name, given in (("log_keys", log_keys), ("reference", list(reference))):
        unknown = [k for k in given if k not in keys]
        if unknown:
            raise ValueError(f"{name} {unknown} are not among the plotted keys {list(keys)}")
    for key, lines in reference.items():
        for label, value in lines.items():
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
                raise ValueError(f"reference[{key!r}][{label!r}] must be a finite number, got {value!r}")
    paths = [Path(p) for p in jsonl_paths]
    labels = list(labels) if labels is not None else [p.parent.name or p.stem for p in paths]
    if len(labels) != len(paths):
        raise ValueError(f"{len(labels)} labels for {len(paths)} metrics files")
    runs = [read_jsonl(p) for p in paths]
    figure, axes = pyplot.subplots(len(keys), 1, figsize=(7, 2.6 * len(keys)), squeeze=False)
    plotted = 0
    for axis, key in zip(axes[:, 0], keys):
        for rows, label in zip(runs, labels):
            xs, ys = series(rows, key, x=x)
            if key in log_keys:
                xs, ys = xs[ys > 0], ys[ys > 0]
            if xs.size:
                axis.plot(xs, ys, marker="." if xs.size < 30 else None, label=label)
                plotted += 1
        for (label, value), style in zip(reference.get(key, {}).items(), itertools.cycle(("--", ":", "-."))):
            axis.axhline(float(value), linestyle=style, color=f"C{len(axis.lines) + 1}", linewidth=1.2,
                         label=f"{label}: {value:.3g}")
        if key in log_keys and axis.lines:
            axis.set_yscale("log")
        axis.set_ylabel(key)
        axis.set_xlabel(x)
        axis.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))  # steps and rounds are whole numbers
        axis.grid(alpha=0.3)
        if len(axis.lines) > 1:
            axis.legend(fontsize="small")
    if not plotted:
        pyplot.close(figure)
        raise ValueError(f"none of the keys {list(keys)} (vs {x!r}) found in {[str(p) for p in paths]}")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


def plot_curves(jsonl_paths: Sequence[str | os.PathLike], out_png: str | os.PathLike, *, keys: Sequence[str],
                labels: Sequence[str] | None = None, x: str = "step", title: str | None = None,
                log_keys: Sequence[str] = (), reference: Mapping[str, Mapping[str, float]] | None = None) -> Path:
    """Renders one panel per key with one line per JSONL file (e.g. reward and loss vs step of several runs).

    Each panel has an x axis of its own: the stages of one run count their own steps (600 SFT steps beside 4 GRPO
    steps), and a shared axis would squeeze the short ones into a corner.

    Args:
        jsonl_paths: metrics files (`MetricsWriter`'s `metrics.jsonl`, or the actor's per-round metrics).
        out_png: where the PNG goes (written atomically).
        keys: the metrics to plot; "a/b" reaches nested values.
        labels: one legend label per file (default: each file's folder name).
        x: the column on the x axis.
        title: figure title.
        log_keys: keys whose panel gets a logarithmic y axis (losses over orders of magnitude; values ≤ 0 are
            left out of those panels).
        reference: key -> {label: value}: dashed horizontal lines on that key's panel, e.g. held-out scores
            beside a training curve.

    Returns:
        `out_png`.

    Raises:
        ValueError: no keys, labels that do not match the files, log or reference keys that are not among `keys`,
            a reference value that is not a finite number, or none of the keys found in any file.
        FileNotFoundError: a missing file.
    """
    figure = _curves_figure(jsonl_paths, keys=keys, labels=labels, x=x, title=title, log_keys=log_keys,
                            reference=reference or {})
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    from matplotlib import pyplot  # noqa: PLC0415 — loaded by _curves_figure

    pyplot.close(figure)
    fileio.write_atomic(out_png, buffer.getvalue())
    return Path(out_png)
