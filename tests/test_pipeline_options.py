"""Ray Train 2.60's run options as the Prefect pipeline exposes them: checkpoint validation and
elastic scaling, set from flow parameters (what a deployment's --param sets)."""

from __future__ import annotations

import json

import pytest

from pipeline_loops import write_classification_parquet

pytestmark = pytest.mark.usefixtures("prefect_harness", "ray_local")


def test_the_pipeline_validates_each_checkpoint_and_ranks_by_the_validation_metric(tmp_path):
    from flows.pipeline import training_pipeline

    data = write_classification_parquet(tmp_path / "data")
    storage = tmp_path / "results"
    state = training_pipeline(
        train_loop="tasks.loops:tabular_mlp_loop",
        train_loop_config={"label_column": "label", "epochs": 3, "lr": 0.05, "validate": True},
        datasets={"train": {"uri": data}},
        scaling={"num_workers": 2},
        checkpointing={"num_to_keep": 2, "score_attribute": "holdout_accuracy", "score_order": "max"},
        validation={"fn": "tasks.loops:tabular_mlp_validation", "fn_kwargs": {"uri": data, "label_column": "label"}},
        run={"name": "validated", "storage_path": str(storage)},
        return_state=True,
    )
    assert state.is_completed(), state
    summary = state.result()
    record = json.loads((storage / "validated" / "run.json").read_text())
    kept = record["checkpoints"]
    assert len(kept) == 2 and all(0.0 <= c["metrics"]["holdout_accuracy"] <= 1.0 for c in kept), kept
    assert all(c["status"] == "VALIDATED" for c in kept), kept
    best = max(kept, key=lambda c: c["metrics"]["holdout_accuracy"])
    assert summary["best_checkpoint"].endswith(best["dir_name"])
    assert summary["best_metrics"]["holdout_accuracy"] == best["metrics"]["holdout_accuracy"]


def test_a_validation_function_that_cannot_be_imported_fails_before_training(tmp_path):
    from flows.pipeline import training_pipeline

    data = write_classification_parquet(tmp_path / "data")
    state = training_pipeline(
        train_loop="tasks.loops:tabular_mlp_loop",
        train_loop_config={"label_column": "label", "epochs": 1, "validate": True},
        datasets={"train": {"uri": data}},
        scaling={"num_workers": 2},
        validation={"fn": "tasks.loops:no_such_function"},
        run={"name": "bad-validation", "storage_path": str(tmp_path / "results")},
        return_state=True,
    )
    assert state.is_failed()
    with pytest.raises(
        ValueError,
        match=r"validation.fn='tasks.loops:no_such_function': module 'tasks.loops' has no 'no_such_function'",
    ):
        state.result()
    assert not (tmp_path / "results" / "bad-validation" / "checkpoint_000000").exists()
