"""``FailureConfig.controller_failure_limit``: how many times a driver-level failure is retried,
by whatever runs ``fit()`` again. The Prefect train task does (its end-to-end test is
``test_pipeline_flow.py::test_a_driver_failure_is_retried_by_prefect_and_resumes_from_the_snapshot``);
``fit()`` alone cannot rerun itself, so it says so, and a second ``fit()`` resumes the run."""

from __future__ import annotations

import os
import tempfile

import pytest

from loops import resume_after_checkpoint
from run_history import recorded_reports
from trainers import (
    Checkpoint,
    ControllerError,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    UserCallback,
    report,
)


def counting_loop(config: dict) -> None:
    for epoch in range(resume_after_checkpoint("epoch.txt"), config["epochs"]):
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "epoch.txt"), "w") as f:
                f.write(str(epoch))
            report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(folder))


class FailsOnce(UserCallback):
    """Raises in the driver after the first report: a driver-level failure (a ControllerError)."""

    def __init__(self) -> None:
        self.failed = False

    def after_report(self, run_context, metrics, checkpoint):
        if not self.failed:
            self.failed = True
            raise RuntimeError("injected driver failure")


def test_fit_alone_warns_that_it_does_not_retry_and_a_second_fit_resumes(tmp_path):
    run_config = RunConfig(
        name="driver",
        storage_path=str(tmp_path),
        failure_config=FailureConfig(controller_failure_limit=2),
        callbacks=[FailsOnce()],
    )
    trainer = DataParallelTrainer(
        counting_loop,
        train_loop_config={"epochs": 3},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=run_config,
    )
    with pytest.warns(UserWarning, match=r"controller_failure_limit=2\) has no effect on fit\(\) itself"):
        with pytest.raises(ControllerError, match="injected driver failure"):
            trainer.fit()
    with pytest.warns(UserWarning, match="controller_failure_limit"):
        result = trainer.fit()  # what a retry does: the same run, from its latest checkpoint
    assert list(result.metrics_dataframe["epoch"]) == [0, 1, 2]
    reports = recorded_reports(tmp_path / "driver")
    assert [r["attempt"] for r in reports] == [1, 2, 2]  # epoch 0 was not trained again


def test_fit_with_the_default_limit_does_not_warn(tmp_path, recwarn):
    run_config = RunConfig(name="quiet", storage_path=str(tmp_path))
    DataParallelTrainer(
        counting_loop,
        train_loop_config={"epochs": 1},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=run_config,
    ).fit()
    assert not [w for w in recwarn if "controller_failure_limit" in str(w.message)]


def test_the_prefect_train_task_spends_the_limit_on_its_own_retries():
    from tasks.params import Failures
    from tasks.retries import UNLIMITED_RETRIES, retry_driver_failures, should_retry, train_task_options

    failures = Failures(controller_failure_limit=2, retry_delay_s=0)
    options = train_task_options(failures)
    assert options["retries"] == 2 and options["retry_condition_fn"] is retry_driver_failures
    assert train_task_options(Failures(controller_failure_limit=-1))["retries"] == UNLIMITED_RETRIES
    # fit() inside the task is not given the limit: the retries are Prefect's, and fit() does not warn.
    assert failures.to_config().controller_failure_limit == -1
    assert should_retry(ControllerError(RuntimeError("injected driver failure")))
