"""BackendConfig.train_func_context: every worker runs the training function inside it."""

from __future__ import annotations

import pytest

import context_backend
from trainers import DataParallelTrainer, RunConfig, ScalingConfig, WorkerGroupError


def fit(tmp_path, fn, num_workers):
    return DataParallelTrainer(
        fn,
        backend_config=context_backend.ContextConfig(),
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(name=f"context-{num_workers}", storage_path=str(tmp_path)),
    ).fit()


def test_local_mode_runs_the_loop_inside_the_context_and_leaves_it(tmp_path):
    result = fit(tmp_path, context_backend.report_inside, 0)
    assert result.return_value == [0] and result.metrics["inside"] == [0]
    assert context_backend.inside == []  # exited after the loop


@pytest.mark.usefixtures("ray_local")
def test_workers_run_the_loop_inside_the_context_and_its_errors_reach_the_driver(tmp_path):
    assert fit(tmp_path, context_backend.report_inside, 1).return_value == [0]
    with pytest.raises(WorkerGroupError, match=r"failed inside \[0\]"):
        fit(tmp_path / "fails", context_backend.fail_inside, 1)
