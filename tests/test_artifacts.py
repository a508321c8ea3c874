"""What a user sees of a run in the Prefect UI: the metric chart, the rounded metrics table and the
checkpoint table, read back from the Prefect server after a real pipeline run; the sweep's chart;
and the chart and table functions on their own (no Prefect, no Ray)."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import re
import xml.etree.ElementTree as ET

import pytest

from run_history import recorded_reports
from storage import CheckpointConfig, RunStorage, load_run
from storage.protocol import ReportRound
from tasks.charts import (
    Chart,
    Series,
    charts_markdown,
    metric_series,
    plotted_metrics,
    render_svg,
    round_sig,
    run_charts,
    step_axis,
    svg_image_markdown,
    table_rows,
)
from tasks.checkpoints import UPLOAD_COLUMNS, best_checkpoint_markdown, checkpoint_rows, upload_cells

SVG = "{http://www.w3.org/2000/svg}"

#: Reports shaped as the demo's (``tasks.loops:tabular_mlp_loop``, 8 epochs), full of digits.
DEMO_REPORTS = [
    {
        "epoch": epoch,
        "train_loss": 0.6931471805599453 / (epoch + 1),
        "train_accuracy": 0.8 + epoch / 51,
        "train_rows": 456,
        "valid_loss": 0.5123456789 / (epoch + 1) + 0.01 * epoch,
        "valid_accuracy": 0.9 + epoch / 113,
        "valid_rows": 113,
    }
    for epoch in range(8)
]

#: valid_loss per epoch of the scripted run: with num_to_keep=2 by min, epochs 1 and 2 are the
#: best two, epoch 3 is kept only as the latest, and epoch 0 is dropped.
VALID_LOSSES = [0.912345678, 0.512345678, 0.712345678, 0.812345678]
NUM_TO_KEEP = 2


def scripted_loop(config: dict) -> None:
    """Reports fixed metrics each epoch, with a checkpoint from rank 0: ``train_loss`` differs per
    rank, ``valid_loss`` does not, ``lr`` is reported on even epochs only."""
    import trainers
    from pipeline_loops import report_with_epoch_checkpoint

    rank = trainers.get_context().get_world_rank()
    for epoch, valid_loss in enumerate(config["valid_losses"]):
        metrics = {
            "train_loss": 1.0 / (epoch + 1) + 0.1 * rank,
            "valid_loss": valid_loss,
            "rows": 256,
            "eval": {"accuracy_on_the_held_out_rows": 0.5 + epoch / 7},
            "epoch": epoch,  # reported last: the table still shows it first
        }
        if epoch % 2 == 0:
            metrics["lr"] = 0.01 / (epoch + 1)
        report_with_epoch_checkpoint(metrics, epoch)


# -- reading artifacts back --------------------------------------------------------------------------


def read_artifact(key: str):
    """The newest artifact stored under ``key``."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert found, f"no artifact {key!r}"
    return max(found, key=lambda a: a.created)


def svg_images(markdown: str) -> list[ET.Element]:
    """Every chart image of a markdown artifact, parsed."""
    encoded = re.findall(r"!\[[^\]]*\]\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", markdown)
    return [ET.fromstring(base64.b64decode(data)) for data in encoded]


def lines(svgs: list[ET.Element]) -> dict[tuple[str, str], dict]:
    """Each drawn series by (metric, rank): its values (from data-values) and its points (path and dots)."""
    found = {}
    for svg in svgs:
        for group in svg.iter("{http://www.w3.org/2000/svg}g"):
            path = group.find("{http://www.w3.org/2000/svg}path")
            if path is None or "data-metric" not in path.attrib:
                continue
            dots = group.findall("{http://www.w3.org/2000/svg}circle")
            found[(path.get("data-metric"), path.get("data-rank"))] = {
                "values": json.loads(path.get("data-values")),
                "path_points": len(re.findall(r"[ML]", path.get("d"))),
                "dots": [(int(d.get("data-report")), float(d.get("data-value")), float(d.get("cy"))) for d in dots],
            }
    return found


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, prefect_harness, _ray_session):
    """One small pipeline run (2 workers, 4 reports), shared by the tests that read its artifacts."""
    import ray

    from conftest import TEST_NUM_CPUS, assert_no_leaks
    from flows.pipeline import training_pipeline

    if not ray.is_initialized():  # an earlier module shut the shared Ray down
        ray.init(address="local", num_cpus=TEST_NUM_CPUS, include_dashboard=False, log_to_driver=True)
    storage = tmp_path_factory.mktemp("artifacts") / "results"
    state = training_pipeline(
        train_loop=scripted_loop,
        train_loop_config={"valid_losses": VALID_LOSSES},
        scaling={"num_workers": 2},
        checkpointing={"num_to_keep": NUM_TO_KEEP, "score_attribute": "valid_loss", "score_order": "min"},
        run={"name": "Charted_Run", "storage_path": str(storage)},
        return_state=True,
    )
    assert state.is_completed(), state
    assert_no_leaks()
    reports = [r["metrics"] for r in recorded_reports(storage / "Charted_Run")]
    return {"reports": reports, "storage": storage, "flow_run_id": state.state_details.flow_run_id}


def test_every_link_in_the_run_s_artifacts_lands_on_the_content_it_names(finished_run):
    from artifact_links import assert_links_land

    # The metric chart links to the health page itself (not to its key's history of versions).
    assert assert_links_land(finished_run["flow_run_id"]) == [("charted-run-metric-chart", "charted-run-health")]


def test_the_chart_artifact_holds_every_report_of_every_rank_where_they_differ(finished_run):
    reports = finished_run["reports"]
    assert len(reports) == len(VALID_LOSSES)
    artifact = read_artifact("charted-run-metric-chart")
    assert artifact.type == "markdown"
    assert "Charted by epoch, as the loop counts (from 0)." in artifact.data  # said where the numbers show
    drawn = lines(svg_images(artifact.data))

    # valid_loss: the same on both ranks, so one line; train_loss differs, so one line per rank;
    # the accuracy gets a chart of its own.
    accuracy = ("eval/accuracy_on_the_held_out_rows", "all")
    assert set(drawn) == {("train_loss", "0"), ("train_loss", "1"), ("valid_loss", "all"), accuracy}
    valid = drawn[("valid_loss", "all")]
    assert valid["values"] == [m["valid_loss"] for m in reports] == VALID_LOSSES
    assert valid["path_points"] == len(valid["dots"]) == len(reports)
    assert [report for report, _, _ in valid["dots"]] == [1, 2, 3, 4]
    # Drawn where the values say: a higher loss sits higher on the page (smaller y).
    by_value = sorted(valid["dots"], key=lambda dot: dot[1])
    assert [cy for _, _, cy in by_value] == sorted((cy for _, _, cy in valid["dots"]), reverse=True)
    assert drawn[("train_loss", "0")]["values"] == [m["train_loss"] for m in reports]  # rank 0 is what the run stored
    assert drawn[("train_loss", "1")]["values"] == pytest.approx([1.0 / (e + 1) + 0.1 for e in range(4)])
    assert "best (lowest) 0.5123 at epoch 1" in artifact.data  # counted as the table counts: by epoch


def test_the_metrics_table_is_rounded_with_report_step_and_score_first(finished_run):
    reports = finished_run["reports"]
    rows = json.loads(read_artifact("charted-run-metrics").data)
    assert len(rows) == len(reports)
    assert [list(row)[:4] for row in rows] == [["report", "epoch", "valid_loss", "train_loss"]] * len(reports)
    assert all(list(row) == list(rows[0]) for row in rows)  # every row has every column
    for number, (row, metrics) in enumerate(zip(rows, reports, strict=True), start=1):
        assert row["report"] == number and row["epoch"] == metrics["epoch"]
        assert row["valid_loss"] == float(f"{metrics['valid_loss']:.4g}") != metrics["valid_loss"]
        assert row["eval/accuracy_on_the_held_out_rows"] == float(
            f"{metrics['eval']['accuracy_on_the_held_out_rows']:.4g}"
        )
        assert row["rows"] == 256 and isinstance(row["rows"], int)
        assert row["lr"] == (float(f"{metrics['lr']:.4g}") if "lr" in metrics else None)


def test_the_checkpoint_table_says_which_are_kept_and_why(finished_run):
    artifact = read_artifact("charted-run-checkpoints")
    rows = json.loads(artifact.data)
    assert [row["checkpoint"] for row in rows] == [f"checkpoint_{seq:06d}" for seq in range(4)]
    assert [row["report"] for row in rows] == [1, 2, 3, 4] and [row["epoch"] for row in rows] == [0, 1, 2, 3]
    assert [row["valid_loss"] for row in rows] == [float(f"{v:.4g}") for v in VALID_LOSSES]
    assert [row["status"] for row in rows] == [  # kept or dropped, and why, said once
        "dropped: not among the best 2",
        "kept: the best",
        "kept: 2nd best",
        "kept: the latest (resume needs it)",
    ]
    assert "keeps the best 2 by valid_loss (min), plus the latest" in artifact.description
    assert "Checkpoint folders count from 0, reports from 1" in artifact.description
    on_disk = sorted(
        p.name for p in (finished_run["storage"] / "Charted_Run").iterdir() if p.name.startswith("checkpoint_")
    )
    assert on_disk == [row["checkpoint"] for row in rows if row["status"].startswith("kept")]


def test_a_sweep_charts_its_metric_per_trial_best_first(tmp_path, prefect_harness):
    from prefect import flow

    from storage import RunStorage
    from tasks.sweep import Search, TrialOutcome, rank_trials

    losses = {"slow": [0.9, 0.8, 0.7], "fast": [0.9, 0.4, 0.1]}
    outcomes = []
    for name, values in losses.items():
        run = RunStorage(str(tmp_path), name)
        run.open("test")
        attempt = run.start_attempt()
        for index, loss in enumerate(values):
            run.record_report(
                ReportRound({"epoch": index, "loss": loss}, report_index=index, attempt=attempt, staged=False)
            )
        run.finish()
        outcomes.append(
            TrialOutcome(
                name=name,
                params={"lr": 0.1 if name == "slow" else 0.3},
                status="trained",
                score=values[-1],
                run_path=run.run_uri,
            )
        )

    @flow
    def ranking() -> list:
        return rank_trials("charted-sweep", Search(metric="loss", mode="min", grid={"lr": [0.1, 0.3]}), outcomes)

    assert [o.name for o in ranking()] == ["fast", "slow"]
    svg = svg_images(read_artifact("charted-sweep-metric-chart").data)
    assert len(svg) == 1
    legend = [g.get("data-series") for g in svg[0].iter("{http://www.w3.org/2000/svg}g")]
    values = [json.loads(p.get("data-values")) for p in svg[0].iter("{http://www.w3.org/2000/svg}path")]
    assert legend == ["#1 lr=0.3", "#2 lr=0.1"] and values == [losses["fast"], losses["slow"]]


# -- the functions alone ------------------------------------------------------------------------------


def test_round_sig_keeps_4_significant_digits_and_leaves_ints_alone():
    assert [round_sig(v) for v in (0.123456, 123456.7, -0.000123456, 2.0, 1e-9 / 3)] == [
        0.1235,
        123500.0,
        -0.0001235,
        2.0,
        3.333e-10,
    ]
    assert round_sig(123456789) == 123456789 and round_sig(True) is True and round_sig("adam") == "adam"
    assert [round_sig(v) for v in (math.nan, math.inf, None)] == [None, None, None]


def test_table_rows_line_up_columns_and_flatten_nested_metrics():
    rows = table_rows(
        [{"loss": 0.123456, "val": {"acc": 0.98765}, "step": 1}, {"step": 2, "loss": math.nan, "extra": 3}], "val/acc"
    )
    assert rows == [
        {"report": 1, "step": 1, "val/acc": 0.9877, "loss": 0.1235, "extra": None},
        {"report": 2, "step": 2, "val/acc": None, "loss": None, "extra": 3},
    ]
    assert list(rows[1]) == ["report", "step", "val/acc", "loss", "extra"]


def test_one_series_when_every_rank_agrees_one_per_rank_when_they_differ():
    same = [[{"loss": 1.0}, {"loss": 1.0}], [{"loss": 0.5}, {"loss": 0.5}]]
    assert metric_series(same, "loss") == [Series("loss", "all", (1.0, 0.5))]
    differ = [[{"loss": 1.0}, {"loss": 1.5}], [{"loss": 0.5}, {"loss": 0.5}]]
    assert metric_series(differ, "loss") == [Series("loss", "0", (1.0, 0.5)), Series("loss", "1", (1.5, 0.5))]
    # Reports from before a resume carry rank 0 only: that alone is no difference.
    resumed = [[{"loss": 1.0}], [{"loss": 0.5}, {"loss": 0.5}]]
    assert metric_series(resumed, "loss") == [Series("loss", "all", (1.0, 0.5))]
    # A metric only rank 0 reports: one line, not a line of nothing for rank 1.
    only_rank0 = [[{"lr": 0.1}, {}], [{"lr": 0.05}, {}]]
    assert metric_series(only_rank0, "lr") == [Series("lr", "0", (0.1, 0.05))]


def test_missing_nan_and_none_values_break_the_line_and_are_not_drawn():
    history = [
        [{"loss": 1.0}],
        [{"loss": math.nan}],
        [{"other": 1}],
        [{"loss": None}],
        [{"loss": 0.25}],
        [{"loss": 0.2}],
    ]
    (series,) = metric_series(history, "loss")
    assert series.values == (1.0, None, None, None, 0.25, 0.2) and series.num_points == 3
    drawn = lines([ET.fromstring(render_svg(Chart("loss", (series,))))])[("loss", "all")]
    assert drawn["values"] == [1.0, None, None, None, 0.25, 0.2]
    assert drawn["path_points"] == 3 and [report for report, _, _ in drawn["dots"]] == [1, 5, 6]
    assert metric_series([[{"loss": math.inf}], [{}]], "loss") == []


def test_losses_share_a_chart_the_score_gets_its_own_and_steps_are_never_drawn():
    keys = ["epoch", "train_loss", "valid_loss", "acc", "rows"]
    assert plotted_metrics(keys, "acc") == [["train_loss", "valid_loss"], ["acc"]]
    assert plotted_metrics(keys, "valid_loss") == [["train_loss", "valid_loss"], ["acc"]]  # accuracies too
    assert plotted_metrics(["epoch", "rows", "score"], None) == [["rows"], ["score"]]
    assert plotted_metrics(["loss", "valid_accuracy", "val_acc", "accumulated", "f1"], "f1") == [
        ["loss"],
        ["valid_accuracy", "val_acc"],
        ["f1"],
    ]
    charts = run_charts(
        [[{"epoch": 0, "loss": 1.0, "acc": 0.5}], [{"epoch": 1, "loss": 0.5, "acc": 0.7}]], "acc", "max"
    )
    assert [(c.title, c.best, [s.metric for s in c.series]) for c in charts] == [
        ("loss per epoch", None, ["loss"]),
        ("acc per epoch (the score metric)", "max", ["acc"]),
    ]


def test_a_chart_survives_odd_names_a_single_report_and_a_flat_line():
    series = (Series('a<b & "c"', "all", (2.0,)), Series("flat", "all", (2.0,)))
    markdown = svg_image_markdown(render_svg(Chart("odd [names]", series)), "odd [names]")
    assert markdown.startswith("![odd (names)](data:image/svg+xml;base64,")
    drawn = lines(svg_images(markdown))
    assert drawn[('a<b & "c"', "all")]["dots"][0][:2] == (1, 2.0)


def test_checkpoint_rows_without_a_score_keep_the_most_recent(tmp_path):
    storage = RunStorage(str(tmp_path), "r", checkpoint_config=CheckpointConfig(num_to_keep=1))
    storage.open("test")
    attempt = storage.start_attempt()
    for step in range(3):
        os.makedirs(storage.layout.staging_path(attempt, step))
        storage.record_report(ReportRound({"step": step}, report_index=step, attempt=attempt, staged=True))
    storage.finish()
    rows = checkpoint_rows(load_run(storage.run_uri).snapshot, CheckpointConfig(num_to_keep=1))
    assert [(row["step"], row["status"]) for row in rows] == [
        (0, "dropped: older than the 1 most recent"),
        (1, "dropped: older than the 1 most recent"),
        (2, "kept: the most recent"),
    ]


def test_checkpoint_rows_show_the_report_and_score_of_dropped_checkpoints_even_when_reports_are_sparse(tmp_path):
    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="loss", checkpoint_score_order="min")
    storage = RunStorage(str(tmp_path), "r", checkpoint_config=config)
    storage.open("test")
    attempt = storage.start_attempt()
    for index, loss in enumerate((0.9, 0.4, 0.6, 0.5, 0.3)):
        saves = index in (0, 1, 4)  # checkpoints at reports 0, 1 and 4
        if saves:
            os.makedirs(storage.layout.staging_path(attempt, index))
        storage.record_report(ReportRound({"loss": loss}, report_index=index, attempt=attempt, staged=saves))
    storage.finish()
    snapshot = load_run(storage.run_uri).snapshot
    rows = checkpoint_rows(snapshot, config)
    assert [(row["report"], row["loss"], row["status"]) for row in rows] == [
        (1, 0.9, "dropped: not among the best 1"),
        (2, 0.4, "dropped: not among the best 1"),
        (5, 0.3, "kept: the best, and the latest"),
    ]
    # A run.json written when the reason repeated the status: said once all the same.
    snapshot.dropped[0] = dataclasses.replace(snapshot.dropped[0], why="dropped: not among the best 1")
    assert checkpoint_rows(snapshot, config)[0]["status"] == "dropped: not among the best 1"


def test_losses_spanning_many_decades_get_a_log_axis_drawn_in_order():
    series = Series("loss", "all", (3.0, 1e-3, 1e-9, None, 2e-12))
    svg = ET.fromstring(render_svg(Chart("loss", (series,))))
    texts = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert "log scale" in texts and "1e-12" in texts
    dots = lines([svg])[("loss", "all")]["dots"]
    assert [cy for _, _, cy in dots] == sorted(cy for _, _, cy in dots)  # each lower than the one before
    linear = ET.fromstring(render_svg(Chart("loss", (Series("loss", "all", (3.0, 1.0, 0.5)),))))
    assert "log scale" not in [t.text for t in linear.iter("{http://www.w3.org/2000/svg}text")]


def test_the_demo_s_charts_count_epochs_as_its_table_does_and_chart_the_accuracy():
    charts = run_charts([[metrics] for metrics in DEMO_REPORTS], "valid_loss", "min")
    markdown = charts_markdown("Metrics of demo", charts, intro="8 reports.")
    svgs = svg_images(markdown)
    drawn = lines(svgs)
    assert set(drawn) == {(m, "all") for m in ("train_loss", "valid_loss", "train_accuracy", "valid_accuracy")}
    assert [svg.find(f"{SVG}title").text for svg in svgs] == [
        "train_loss, valid_loss per epoch (score: valid_loss)",
        "train_accuracy, valid_accuracy per epoch",
    ]
    for svg in svgs:
        # The x axis: a tick per epoch labelled 0-7 (not the reports 1-8), then its caption.
        axis = [t.text for t in svg.iter(f"{SVG}text") if t.get("text-anchor") == "middle"]
        assert axis == [str(epoch) for epoch in range(8)] + ["epoch"]
        assert [float(c.get("data-x")) for c in svg.iter(f"{SVG}circle")][:8] == list(range(8))
    valid = drawn[("valid_loss", "all")]
    assert [value for _, value, _ in valid["dots"]] == [m["valid_loss"] for m in DEMO_REPORTS]  # exact in the data
    best = min(range(8), key=lambda epoch: DEMO_REPORTS[epoch]["valid_loss"])
    assert f"best (lowest) {DEMO_REPORTS[best]['valid_loss']:.4g} at epoch {best}" in markdown
    assert "at epoch 0 →" in markdown and "at report" not in markdown

    # The table beside it counts the same epochs, each value to 4 significant digits.
    rows = table_rows(DEMO_REPORTS, "valid_loss")
    assert [(row["report"], row["epoch"]) for row in rows] == [(n + 1, n) for n in range(8)]
    for row, metrics in zip(rows, DEMO_REPORTS, strict=True):
        for key, value in metrics.items():
            assert row[key] == (float(f"{value:.4g}") if isinstance(value, float) else value)


def test_charts_count_reports_when_no_step_increases_through_every_report():
    assert step_axis([{"loss": 1.0, "step": 10}, {"step": 20, "loss": 0.5}]) == ("step", (10.0, 20.0))
    assert step_axis([{"epoch": 0}, {"epoch": 0}]) is None  # not increasing: a repeated epoch
    assert step_axis([{"epoch": 0}, {"loss": 1.0}]) is None  # not in every report
    (chart,) = run_charts([[{"loss": 1.0}], [{"loss": 0.5}]])
    assert (chart.title, chart.x_label, chart.x) == ("loss per report", "report", ())
    axis = [t.text for t in ET.fromstring(render_svg(chart)).iter(f"{SVG}text") if t.get("text-anchor") == "middle"]
    assert axis == ["1", "2", "report"]


def test_the_checkpoint_table_puts_why_before_short_upload_figures_and_shows_a_quick_upload_as_quick(tmp_path):
    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="valid_loss", checkpoint_score_order="min")
    storage = RunStorage(str(tmp_path), "r", checkpoint_config=config)
    storage.open("test")
    attempt = storage.start_attempt()
    for index, metrics in enumerate(DEMO_REPORTS[:2]):
        os.makedirs(storage.layout.staging_path(attempt, index))
        storage.record_report(ReportRound(metrics, report_index=index, attempt=attempt, staged=True))
    storage.finish()
    rows = checkpoint_rows(load_run(storage.run_uri).snapshot, config)
    assert [list(row) for row in rows] == [
        ["checkpoint", "report", "epoch", "valid_loss", "status", *UPLOAD_COLUMNS]
    ] * 2
    assert [row["valid_loss"] for row in rows] == [float(f"{m['valid_loss']:.4g}") for m in DEMO_REPORTS[:2]]

    from storage.upload import UploadStats

    seconds, megabytes = UPLOAD_COLUMNS
    assert upload_cells(UploadStats(bytes=14_687, seconds=0.0123456)) == {seconds: "0.012", megabytes: 0.01469}
    assert upload_cells(UploadStats(bytes=2_345_678_901, seconds=12.3456)) == {seconds: "12.35", megabytes: 2346.0}
    # A sub-millisecond upload is not "0" (which reads as "not measured").
    assert upload_cells(UploadStats(bytes=19_384, seconds=0.000461)) == {seconds: "<0.001", megabytes: 0.01938}


def test_the_best_checkpoint_page_rounds_as_the_tables_do():
    from tasks.params import TrainSummary

    best = DEMO_REPORTS[5]
    summary = TrainSummary(run_name="demo", run_path="/runs/demo", metrics=best, checkpoint_path=None, num_reports=8)
    page = best_checkpoint_markdown(summary, ["/runs/demo/checkpoint_000005"], best, "valid_loss")
    assert f"**valid_loss** = `{best['valid_loss']:.4g}`" in page
    cells = dict(re.findall(r"^\| (\S+) \| (\S+) \|$", page, flags=re.MULTILINE))
    assert cells == {"metric": "value", "---": "---", **{k: str(round_sig(v)) for k, v in best.items()}}
    assert cells["valid_accuracy"] == "0.9442" and cells["valid_rows"] == "113"
