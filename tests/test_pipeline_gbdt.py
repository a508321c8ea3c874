"""The parameter-only XGBoost and LightGBM pipelines (no training code) under prefect_test_harness,
on the example data that ships with scikit-learn."""

from __future__ import annotations

import json
import os

import pytest

from run_history import recorded_reports
from tasks.example_data import LABEL, write_breast_cancer
from test_pipeline_flow import artifacts

pytestmark = pytest.mark.usefixtures("prefect_harness", "ray_local")

CASES = {
    "xgboost": (
        "flows.pipeline:xgboost_pipeline",
        {"objective": "binary:logistic", "eval_metric": "logloss", "max_depth": 3},
        "valid-logloss",
        "model.ubj",
    ),
    "lightgbm": (
        "flows.pipeline:lightgbm_pipeline",
        {"objective": "binary", "metric": "binary_logloss", "num_leaves": 15, "verbose": -1},
        "valid-binary_logloss",
        "model.txt",
    ),
}


@pytest.mark.parametrize("framework", sorted(CASES))
def test_parameter_only_pipeline_trains_and_keeps_the_best_round(tmp_path, framework):
    from tasks.params import import_object

    flow_path, params, metric, model_file = CASES[framework]
    pipeline = import_object("flow", flow_path)
    data = write_breast_cancer(str(tmp_path / "data"))
    storage = tmp_path / "results"
    state = pipeline(
        datasets={"train": {"uri": data["train"]}, "valid": {"uri": data["valid"]}},
        label_column=LABEL,
        params=params,
        num_boost_round=8,
        scaling={"num_workers": 2},
        checkpointing={"num_to_keep": 1, "score_attribute": metric, "score_order": "min"},
        run={"name": framework, "storage_path": str(storage)},
        return_state=True,
    )
    assert state.is_completed(), state
    summary = state.result()
    history = [r["metrics"] for r in recorded_reports(storage / framework)]
    assert len(history) == 8 and summary["num_reports"] == 8  # one report per boosting round
    losses = [m[metric] for m in history]
    assert losses[-1] < losses[0] < 0.7  # it learns: below log(2) from the first round on
    assert summary["best_metrics"][metric] == min(losses)
    assert os.path.isfile(os.path.join(summary["best_checkpoint"], model_file))
    table = json.loads(artifacts(state.state_details.flow_run_id)[f"{framework}-metrics"].data)
    assert [row[metric] for row in table] == [float(f"{loss:.4g}") for loss in losses]  # 4 significant digits
