"""flowtrain sweep demo: the Prefect sweep flow over the MLP on scikit-learn's breast cancer set.

    .venv/bin/python examples/sweep_demo.py [output folder]

Six trials (2 hidden sizes x 3 random learning rates) train on 1 CPU worker each, as many at
once as the local Ray holds; the table of trials ranked by validation loss is printed, and is
published as the ``demo-sweep-trials`` artifact. Run it twice: the second run trains nothing and
reuses the trials from the first (same output folder).
"""

from __future__ import annotations

import os
import sys

# Prefect's temporary local server takes about 25 s to start on a 2-core machine; its default wait is 20 s.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

from flows.sweep import sweep
from tasks.example_data import LABEL, write_breast_cancer


def main() -> None:
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "demo_results")
    data = write_breast_cancer(os.path.join(out, "data"))
    result = sweep(
        search={
            "metric": "valid_loss",
            "mode": "min",
            "grid": {"hidden": [16, 64]},
            "random": {"lr": {"kind": "loguniform", "low": 1e-3, "high": 1e-1}},
            "num_samples": 3,
        },
        train_loop="tasks.loops:tabular_mlp_loop",
        train_loop_config={"label_column": LABEL, "epochs": 5},
        datasets={"train": {"uri": data["train"]}, "valid": {"uri": data["valid"]}},
        scaling={"num_workers": 1},
        run={"name": "demo-sweep", "storage_path": os.path.join(out, "runs")},
    )
    print(f"\n{'rank':>4}  {'hidden':>6}  {'lr':>8}  {'valid_loss':>10}  status   trial")
    for rank, trial in enumerate(result["trials"], start=1):
        params, score = trial["params"], trial["score"]
        shown = f"{score:10.4f}" if score is not None else f"{'-':>10}"
        print(f"{rank:>4}  {params['hidden']:>6}  {params['lr']:8.4f}  {shown}  {trial['status']:<7}  {trial['name']}")
    print(f"\nbest run folder (trainers.Result.from_path): {result['best']['run_path']}")


if __name__ == "__main__":
    main()
