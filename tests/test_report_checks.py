"""What report() takes: any picklable metric value, kept with its type; a value that cannot be
pickled, or a bad score, fails at that call naming the metric, and nothing recorded before is lost."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import pathlib
import tempfile
import threading
from decimal import Decimal

import pytest

import trainers
from storage import RunStorage, load_run, upload_directory
from storage.protocol import ReportRound
from trainers import (
    Checkpoint,
    CheckpointConfig,
    DataParallelTrainer,
    Result,
    RunConfig,
    ScalingConfig,
    UserCallback,
    WorkerGroupError,
)

#: Rounds reported (with a checkpoint each) before the bad one.
GOOD_ROUNDS = 2


def good_rounds_then(config) -> None:
    """Report GOOD_ROUNDS good rounds, then one with ``config["bad"]`` as metrics."""
    for step in range(GOOD_ROUNDS):
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "step.txt"), "w") as file:
                file.write(str(step))
            trainers.report(
                {"step": step, "loss": 1.0 / (step + 1), "val": {"acc": 0.5}},
                checkpoint=Checkpoint.from_directory(folder),
            )
    with tempfile.TemporaryDirectory() as folder:
        trainers.report(config["bad"](), checkpoint=Checkpoint.from_directory(folder))


def fit_with_bad_report(tmp_path, bad, num_workers: int = 0) -> tuple[BaseException, Result]:
    """num_workers=0 runs the same report() in this process, without starting Ray: fast."""
    trainer = DataParallelTrainer(
        good_rounds_then,
        train_loop_config={"bad": bad},
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(
            name="bad-report",
            storage_path=str(tmp_path),
            checkpoint_config=CheckpointConfig(
                num_to_keep=GOOD_ROUNDS, checkpoint_score_attribute="loss", checkpoint_score_order="min"
            ),
        ),
    )
    with pytest.raises(WorkerGroupError) as caught:
        trainer.fit()
    failures = caught.value.worker_failures  # with 2 workers, whichever rank's failure came first
    return failures[min(failures)], Result.from_path(str(tmp_path / "bad-report"))


def assert_good_rounds_kept(result: Result) -> None:
    assert list(result.metrics_dataframe["step"]) == list(range(GOOD_ROUNDS))
    assert list(result.metrics_dataframe["val/acc"]) == [0.5] * GOOD_ROUNDS
    assert len(result.best_checkpoints) == GOOD_ROUNDS
    with result.checkpoint.as_directory() as folder:
        assert pathlib.Path(folder, "step.txt").read_text() == str(GOOD_ROUNDS - 1)


def _unpicklable():
    return {"step": 9, "loss": 0.1, "val": {"lock": threading.Lock()}}


@pytest.mark.parametrize(
    "bad, error_type, names",
    [
        pytest.param(
            lambda: {"step": 9, "loss": None},
            TypeError,
            ["'loss'", "NoneType", "checkpoint_score_attribute"],
            id="score-none",
        ),
        pytest.param(
            lambda: {"step": 9, "loss": "low"},
            TypeError,
            ["'loss'", "str", "checkpoint_score_attribute"],
            id="score-string",
        ),
        pytest.param(
            lambda: {"step": 9}, ValueError, ["'loss'", "checkpoint_score_attribute", "['step']"], id="score-missing"
        ),
        pytest.param(_unpicklable, TypeError, ["'val/lock'", "_thread.lock", "cannot be pickled"], id="unpicklable"),
    ],
)
def test_bad_report_fails_at_report_naming_the_metric_and_keeps_what_came_before(tmp_path, bad, error_type, names):
    error, result = fit_with_bad_report(tmp_path, bad)
    assert type(error) is error_type
    for name in names:
        assert name in str(error)
    assert_good_rounds_kept(result)


@pytest.mark.usefixtures("ray_local")
def test_bad_metric_from_ray_workers_fails_the_same_way(tmp_path):
    error, result = fit_with_bad_report(tmp_path, _unpicklable, num_workers=2)
    assert type(error) is TypeError and "'val/lock'" in str(error)
    assert_good_rounds_kept(result)


def test_single_element_arrays_and_tensors_are_reported_as_numbers():
    import numpy as np
    import torch

    from trainers._internal.session.worker_session import plain_metrics

    metrics = plain_metrics(
        {"a": np.array(2.5), "b": torch.tensor([3.0]), "c": np.array([[4]]), "v": {"d": torch.tensor(1)}}
    )
    assert metrics == {"a": 2.5, "b": 3.0, "c": 4, "v": {"d": 1}}


def test_a_value_pickle_cannot_hold_does_not_lose_the_history_or_the_checkpoint(tmp_path, caplog):
    # Defence in depth: such a value can no longer come through report(); if one reaches the
    # snapshot anyway, the run is still recorded, with the value's repr and a warning.
    storage = RunStorage(str(tmp_path), "run")
    storage.open("me")
    attempt = storage.start_attempt()
    storage.record_report(ReportRound({"step": 0}, report_index=0, attempt=attempt, staged=False))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "w.txt").write_text("1")
    upload_directory(str(tmp_path / "src"), storage.filesystem, storage.layout.staging_path(attempt, 1))
    with caplog.at_level(logging.WARNING, logger="storage.metric_values"):
        storage.record_report(
            ReportRound({"step": 1, "odd": threading.Lock()}, report_index=1, attempt=attempt, staged=True)
        )
    storage.finish()
    assert "lock" in caplog.text

    run = load_run(str(tmp_path / "run"))
    assert [m["step"] for m in run.metrics_history] == [0, 1]
    assert "_thread.lock" in run.metrics_history[1]["odd"]
    with run.latest_checkpoint.as_directory() as folder:
        assert pathlib.Path(folder, "w.txt").read_text() == "1"


# -- values Ray Train accepts ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Tag:
    """A small picklable object, reported as a metric."""

    name: str


WHEN = datetime.datetime(2026, 11, 26, 8, 30, tzinfo=datetime.UTC)
#: A report of what Ray Train takes beyond JSON, nested ones included.
RICH = {
    "step": 0,
    "when": WHEN,
    "day": WHEN.date(),
    "shape": (16, 8),
    "price": Decimal("1.10"),
    "tag": Tag("a"),
    "tags": {"a", "b"},
    "val": {"pair": (1, (2, 3))},
}


def report_rich(config) -> None:
    with tempfile.TemporaryDirectory() as folder:
        trainers.report(RICH, checkpoint=Checkpoint.from_directory(folder))


class Recorder(UserCallback):
    def __init__(self) -> None:
        self.reported: list[dict] = []

    def after_report(self, run_context, metrics, checkpoint) -> None:
        self.reported.append(metrics[0])


def test_values_ray_accepts_keep_their_types_in_callbacks_the_result_and_from_path(tmp_path):
    recorder = Recorder()
    result = DataParallelTrainer(
        report_rich,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="rich", storage_path=str(tmp_path), callbacks=[recorder]),
    ).fit()
    # A tuple is not equal to a list, so == checks that tuples stay tuples, nested ones too.
    assert recorder.reported == [RICH]
    assert type(recorder.reported[0]["shape"]) is tuple
    for restored in (result, Result.from_path(result.path)):  # from_path reads run.json
        assert restored.metrics == RICH and restored.best_checkpoints[0][1] == RICH
        assert type(restored.metrics["price"]) is Decimal and type(restored.metrics["when"]) is datetime.datetime
        frame = restored.metrics_dataframe
        assert frame["shape"][0] == (16, 8) and frame["val/pair"][0] == (1, (2, 3))
        assert frame["price"][0] == Decimal("1.10") and frame["tag"][0] == Tag("a")
        assert isinstance(frame["when"][0], datetime.datetime) and frame["when"][0] == WHEN


def test_tensors_reach_the_driver_detached_and_the_score_stays_strict():
    import torch

    from trainers._internal.session.worker_session import check_score, plain_metrics

    needs_grad = torch.tensor([0.5, 0.75], requires_grad=True) * 2
    kept = plain_metrics({"pair": needs_grad})["pair"]
    assert not kept.requires_grad and kept.tolist() == [1.0, 1.5]
    with pytest.raises(TypeError, match="'loss'.*Decimal.*an int or a float"):
        check_score(plain_metrics({"loss": Decimal("0.1")}), "loss", required=True)
