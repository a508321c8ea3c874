"""flowtrain demo: the Prefect pipeline end to end on data that ships with scikit-learn.

    make demo        # or: .venv/bin/python examples/pipeline_demo.py [output folder]

Writes the breast cancer set as parquet, then runs the ``flowtrain-pipeline`` flow: Ray Data
ingests it, an MLP trains on 2 CPU workers of a local Ray, checkpoints are committed, kept by
validation loss and the best one published. Prefect records the run on the server that
``PREFECT_API_URL`` names, or unset in its local database (a temporary local server), which
``prefect server start`` shows after; the demo's last lines say which, and where to look.
"""

from __future__ import annotations

import datetime
import os
import sys

# Prefect's temporary local server takes about 25 s to start on a 2-core machine; its default wait is 20 s.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

from flows.pipeline import training_pipeline
from tasks.console import flow_run_ui_lines
from tasks.example_data import LABEL, write_breast_cancer
from trainers import Result


def main() -> None:
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "demo_results")
    data = write_breast_cancer(os.path.join(out, "data"))
    name = f"demo-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    state = training_pipeline(
        train_loop="tasks.loops:tabular_mlp_loop",
        train_loop_config={"label_column": LABEL, "epochs": 8, "lr": 0.01},
        datasets={"train": {"uri": data["train"], "required_columns": {LABEL: "int"}}, "valid": {"uri": data["valid"]}},
        scaling={"num_workers": 2},
        checkpointing={"num_to_keep": 2, "score_attribute": "valid_loss", "score_order": "min"},
        failures={"max_failures": 2},
        run={"name": name, "storage_path": os.path.join(out, "runs")},
        return_state=True,
    )
    if not state.is_completed():  # Prefect has logged what failed, with each traceback, above
        sys.exit(f"\nThe pipeline did not finish: {state.message}")
    summary = state.result()
    result = Result.from_path(summary["run_path"])
    columns = ["epoch", "train_loss", "valid_loss", "valid_accuracy"]
    print("\n" + result.metrics_dataframe[columns].to_string(index=False, float_format="{:.4f}".format))
    print(f"\nbest checkpoint (lowest valid_loss): {summary['best_checkpoint']}")
    print(f"kept checkpoints: {', '.join(summary['kept_checkpoints'])}")
    print(f"run folder (trainers.Result.from_path): {summary['run_path']}")
    flow_run_id = state.state_details.flow_run_id
    print(
        "\nTo see the run in Prefect's UI (artifacts: metric chart, metrics table, checkpoints kept and why, best checkpoint):"
    )
    prefect_cli = os.path.join(os.path.dirname(sys.executable), "prefect")
    print("\n".join(flow_run_ui_lines(flow_run_id, prefect_cli=prefect_cli)))


if __name__ == "__main__":
    main()
