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
import glob
import os
import sys
from typing import Any

# Prefect's temporary local server takes about 25 s to start on a 2-core machine; its default wait is 20 s.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

from flows.pipeline import training_pipeline
from storage.figures import number
from tasks.console import flow_run_ui_lines
from tasks.example_data import LABEL, write_breast_cancer
from tasks.reporting import artifact_key
from trainers import Result

#: The run's artifacts the closing lines name (by the end of their key), and what each holds.
ARTIFACTS = {
    "metric-chart": "losses and accuracies per epoch, what each figure is",
    "health": "where the time went (goodput), the timeline picture, memory",
    "checkpoints": "every checkpoint the run committed, kept or dropped and why",
    "best-checkpoint": "the best checkpoint and its metrics",
}


def demo_parameters(out: str, name: str) -> dict[str, Any]:
    """The pipeline's parameters for the run ``name``, its data and runs under the folder ``out``."""
    data = write_breast_cancer(os.path.join(out, "data"))
    return {
        "train_loop": "tasks.loops:tabular_mlp_loop",
        # 456 training rows: batches of 32 give each of the 2 workers 8 steps an epoch.
        "train_loop_config": {"label_column": LABEL, "epochs": 8, "lr": 0.01, "batch_size": 32},
        "datasets": {
            "train": {"uri": data["train"], "required_columns": {LABEL: "int"}},
            "valid": {"uri": data["valid"]},
        },
        # Half a CPU each: on a 2-CPU machine that leaves Ray Data a whole one for its pipeline.
        "scaling": {"num_workers": 2, "resources_per_worker": {"CPU": 0.5}},
        "checkpointing": {"num_to_keep": 2, "score_attribute": "valid_loss", "score_order": "min"},
        "failures": {"max_failures": 2},
        "run": {"name": name, "storage_path": os.path.join(out, "runs")},
    }


def main() -> None:
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "demo_results")
    name = f"demo-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    state = training_pipeline(**demo_parameters(out, name), return_state=True)
    if not state.is_completed():  # Prefect has logged what failed, with each traceback, above
        sys.exit(f"\nThe pipeline did not finish: {state.message}")
    summary = state.result()
    result = Result.from_path(summary["run_path"])
    columns = ["epoch", "train_loss", "valid_loss", "valid_accuracy"]
    print("\n" + result.metrics_dataframe[columns].to_string(index=False, float_format=number))
    print(f"\nbest checkpoint (lowest valid_loss): {summary['best_checkpoint']}")
    print(f"kept checkpoints: {', '.join(summary['kept_checkpoints'])}")
    print(f"run folder (trainers.Result.from_path): {summary['run_path']}")
    pictures = sorted(glob.glob(os.path.join(summary["run_path"], ".health", "timeline-attempt*.png")))
    print(f"timeline picture (on the health artifact too): {pictures[-1] if pictures else 'none drawn'}")
    print("\nTo see the run in Prefect's UI, open its flow run below; its artifacts:")
    for what, holds in ARTIFACTS.items():
        print(f"  {artifact_key(name, what)}: {holds}")
    flow_run_id = state.state_details.flow_run_id
    prefect_cli = os.path.join(os.path.dirname(sys.executable), "prefect")
    print("\n".join(flow_run_ui_lines(flow_run_id, prefect_cli=prefect_cli)))


if __name__ == "__main__":
    main()
