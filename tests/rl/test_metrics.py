"""Metrics: JSONL and TensorBoard files read back independently, PNG curves, staleness and zero-variance counts."""

import io
import json
import math
import struct

import numpy as np
import pytest
from PIL import Image
from tensorboardX.proto import event_pb2

from ranger_jax.rl import metrics


def read_events(folder):
    """Every scalar in the folder's TensorBoard event files, parsed from the TFRecord framing by hand:
    [length u64][crc u32][Event protobuf][crc u32] per record."""
    scalars = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.append((event.step, value.tag, value.simple_value))
    return scalars


def test_writer_jsonl_and_tensorboard(tmp_path):
    with metrics.MetricsWriter(tmp_path / "run") as sink:
        sink.write(0, {"loss": np.float32(1.5), "reward_mean": 0.25, "staleness": {0: 6, 1: 2}, "phase": "grpo"})
        sink.write(1, {"loss": 0.75, "reward_mean": float("nan"), "clipped": np.array(3), "ok": True})
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and all(r["time"] > 0 for r in rows)
    assert {k: v for k, v in rows[0].items() if k != "time"} == {
        "step": 0, "loss": 1.5, "reward_mean": 0.25, "staleness": {"0": 6, "1": 2}, "phase": "grpo"}
    assert rows[1]["reward_mean"] is None and rows[1]["clipped"] == 3 and rows[1]["ok"] is True
    events = read_events(tmp_path / "run")
    got = {(step, tag): value for step, tag, value in events}
    assert got == {(0, "loss"): 1.5, (0, "reward_mean"): 0.25, (0, "staleness/0"): 6.0, (0, "staleness/1"): 2.0,
                   (1, "loss"): 0.75, (1, "clipped"): 3.0, (1, "ok"): 1.0}
    with metrics.MetricsWriter(tmp_path / "run") as sink:  # a resumed run appends
        sink.write(2, {"loss": 0.5})
    assert len(metrics.read_jsonl(tmp_path / "run" / "metrics.jsonl")) == 3


def test_writer_errors(tmp_path):
    with metrics.MetricsWriter(tmp_path) as sink:
        with pytest.raises(ValueError, match="step must be an int >= 0; got -1"):
            sink.write(-1, {"loss": 1.0})
        with pytest.raises(ValueError, match=r"metric names \['time'\] are reserved"):
            sink.write(0, {"time": 1.0})
        with pytest.raises(TypeError, match="metric 'hist/counts' is a list; metrics are numbers, strings or dicts"):
            sink.write(0, {"hist": {"counts": [1, 2]}})


def test_discard_drops_one_stages_rows_after_a_step_and_keeps_the_rest(tmp_path):
    with metrics.MetricsWriter(tmp_path) as sink:
        for step in (1, 2, 3):
            sink.write(step, {"sft/loss": 1.0 / step, "sft/tokens": 10})
            sink.write(step, {"grpo/reward_mean": 0.1 * step})
        sink.write(3, {"sft_eval/loss": 0.3})  # another stage whose name starts alike
        sink.write(3, {"sft/loss": 0.2, "note": "mixed"})  # a row not only of the stage
        path = sink.jsonl_path
        path.write_text(path.read_text() + "not json\n")
        assert sink.discard("sft", after_step=1) == 2
        sink.write(2, {"sft/loss": 0.4})  # the stage's new attempt appends to the rewritten file
        assert sink.discard("grpo") == 3 and sink.discard("grpo") == 0
        for bad, message in (("", "without the trailing"), ("sft/", "without the trailing")):
            with pytest.raises(ValueError, match=message):
                sink.discard(bad)
        with pytest.raises(ValueError, match="after_step must be an int >= 0; got -1"):
            sink.discard("sft", after_step=-1)
    lines = path.read_text().splitlines()
    assert lines[-2] == "not json"
    rows = [json.loads(line) for line in lines if line != "not json"]
    assert [(r["step"], sorted(k for k in r if k not in ("step", "time"))) for r in rows] == [
        (1, ["sft/loss", "sft/tokens"]), (3, ["sft_eval/loss"]), (3, ["note", "sft/loss"]), (2, ["sft/loss"])]
    assert not list(tmp_path.glob(".metrics.jsonl.*"))  # the rewrite left no temporary file


def test_plot_curves(tmp_path):
    for name, slope in (("run_a", 0.1), ("run_b", 0.2)):
        with metrics.MetricsWriter(tmp_path / name) as sink:
            for step in range(6):
                sink.write(step, {"reward_mean": slope * step, "loss": 1.0 / (step + 1)})
    out = metrics.plot_curves([tmp_path / "run_a" / "metrics.jsonl", tmp_path / "run_b" / "metrics.jsonl"],
                              tmp_path / "figs" / "curves.png", keys=["reward_mean", "loss"], title="two runs")
    image = Image.open(io.BytesIO(out.read_bytes()))
    assert image.format == "PNG" and image.width > 300 and image.height > 300
    assert len(np.unique(np.asarray(image.convert("RGB")).reshape(-1, 3), axis=0)) > 10  # lines, text, legend
    with pytest.raises(ValueError, match=r"none of the keys \['kl'\] \(vs 'step'\) found"):
        metrics.plot_curves([tmp_path / "run_a" / "metrics.jsonl"], tmp_path / "none.png", keys=["kl"])
    with pytest.raises(ValueError, match="1 labels for 2 metrics files"):
        metrics.plot_curves([tmp_path / "run_a" / "metrics.jsonl"] * 2, tmp_path / "x.png", keys=["loss"],
                            labels=["a"])
    assert not (tmp_path / "none.png").exists()


def test_series_keeps_the_last_row_of_a_step_and_reaches_nested_keys():
    rows = [{"step": 0, "loss": 3.0}, {"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0},
            {"step": 1, "loss": 2.5, "staleness": {"0": 4}}, {"step": 3, "loss": None}, {"round": 4, "loss": 0.1}]
    xs, ys = metrics.series(rows, "loss")
    np.testing.assert_array_equal(xs, [0, 1, 2])
    np.testing.assert_array_equal(ys, [3.0, 2.5, 1.0])
    np.testing.assert_array_equal(metrics.series(rows, "staleness/0")[1], [4.0])
    np.testing.assert_array_equal(metrics.series(rows, "loss", x="round")[0], [4.0])


def test_staleness_histogram():
    samples = np.array([5, 4, 4, 3, -1, 5])
    learner = 5
    expected = {}
    for s in samples[samples >= 0]:
        expected[learner - int(s)] = expected.get(learner - int(s), 0) + 1
    assert metrics.staleness_histogram(learner, samples) == dict(sorted(expected.items())) == {0: 2, 1: 2, 2: 1}
    assert metrics.staleness_histogram([7, 5, 5], [4, 5, 3]) == {0: 1, 2: 1, 3: 1}
    assert metrics.staleness_histogram(3, []) == {}
    with pytest.raises(ValueError, match="row 2 was sampled with version 6, newer than the learner's 5"):
        metrics.staleness_histogram(5, [5, 4, 6])


def test_zero_variance_share():
    groups = [[1.0, 1.0, 1.0], [0.0, 1.0], np.array([0.5]), [0.2, 0.2 + 1e-9], [0.0, 0.3, 0.0]]
    spreads = [max(g) - min(g) for g in groups]
    assert metrics.zero_variance_share(groups) == pytest.approx(np.mean([s <= 1e-6 for s in spreads])) == 0.6
    assert metrics.zero_variance_share(groups, atol=0.5) == 0.8  # all but the 0 vs 1 group
    assert math.isnan(metrics.zero_variance_share([]))
    with pytest.raises(ValueError, match="group 1 has no rewards"):
        metrics.zero_variance_share([[1.0], []])


def test_curves_figure_gives_each_panel_its_own_steps_log_losses_and_reference_lines(tmp_path):
    with metrics.MetricsWriter(tmp_path / "run") as sink:
        for step in range(600):
            sink.write(step, {"sft": {"loss": 8.0 / (step + 1)}})
        for step in range(1, 5):
            sink.write(step, {"grpo": {"reward_mean": 0.3 + 0.01 * step}})
    paths = [tmp_path / "run" / "metrics.jsonl"]
    figure = metrics._curves_figure(
        paths, keys=["sft/loss", "grpo/reward_mean"], labels=["rollouts"], x="step", title="t",
        log_keys=["sft/loss"], reference={"grpo/reward_mean": {"held-out SFT": 0.341, "held-out GRPO": 0.32}})
    from matplotlib import pyplot  # loaded with the Agg backend by _curves_figure

    try:
        sft_axis, grpo_axis = figure.axes
        assert sft_axis.get_yscale() == "log" and grpo_axis.get_yscale() == "linear"
        assert sft_axis.get_xlim()[1] > 500 and grpo_axis.get_xlim()[1] < 10  # not squeezed onto SFT's 600 steps
        assert all(float(t).is_integer() for t in grpo_axis.get_xticks())
        lines = {line.get_label(): line for line in grpo_axis.lines}
        assert set(lines) == {"rollouts", "held-out SFT: 0.341", "held-out GRPO: 0.32"}
        assert list(lines["held-out SFT: 0.341"].get_ydata()) == [0.341, 0.341]
        assert grpo_axis.get_legend() is not None and sft_axis.get_legend() is None  # one line needs no legend
    finally:
        pyplot.close(figure)

    out = metrics.plot_curves(paths, tmp_path / "curves.png", keys=["sft/loss", "grpo/reward_mean"],
                              log_keys=["sft/loss"], reference={"grpo/reward_mean": {"held-out SFT": 0.341}})
    assert Image.open(out).format == "PNG"
    with pytest.raises(ValueError, match=r"log_keys \['grpo/loss'\] are not among the plotted keys"):
        metrics.plot_curves(paths, tmp_path / "x.png", keys=["sft/loss"], log_keys=["grpo/loss"])
    with pytest.raises(ValueError, match=r"reference \['sft/acc'\] are not among the plotted keys"):
        metrics.plot_curves(paths, tmp_path / "x.png", keys=["sft/loss"], reference={"sft/acc": {"a": 1.0}})
    with pytest.raises(ValueError, match=r"reference\['sft/loss'\]\['target'\] must be a finite number, got nan"):
        metrics.plot_curves(paths, tmp_path / "x.png", keys=["sft/loss"],
                            reference={"sft/loss": {"target": float("nan")}})
    assert not (tmp_path / "x.png").exists()
