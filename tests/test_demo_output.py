"""What a new user sees of the demo (``make demo``): validation metrics over every validation row,
one log line per ingested dataset, Ray's notices at their true weight, and the way to the UI.

On the demo's own data (scikit-learn's breast cancer set: 113 validation rows, an odd number that
an equal split between 2 workers would cut to 112).
"""

from __future__ import annotations

import pytest

from tasks.example_data import LABEL, write_breast_cancer

#: Rows of the demo's validation file (20% of each class of 569 rows).
DEMO_VALID_ROWS = 113


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory) -> dict[str, str]:
    return write_breast_cancer(str(tmp_path_factory.mktemp("demo-data")))


@pytest.mark.usefixtures("ray_local")
def test_the_demo_loop_scores_every_validation_row_on_2_workers(demo_data, tmp_path):
    import pyarrow.parquet as pq

    from tasks.params import Scaling, TorchTraining
    from tasks.train import build_trainer
    from trainers import RunConfig
    from trainers.data import read_dataset

    assert pq.read_metadata(demo_data["valid"]).num_rows == DEMO_VALID_ROWS
    training = TorchTraining(
        train_loop="tasks.loops:tabular_mlp_loop", train_loop_config={"label_column": LABEL, "epochs": 2}
    )
    trainer = build_trainer(
        training,
        run_config=RunConfig(name="valid-rows", storage_path=str(tmp_path)),
        scaling=Scaling(num_workers=2),
        datasets={name: read_dataset(uri) for name, uri in demo_data.items()},
    )
    result = trainer.fit()
    history = result.metrics_dataframe.to_dict("records")
    assert [m["epoch"] for m in history] == [0, 1]
    assert all(m["valid_rows"] == DEMO_VALID_ROWS for m in history), history
    # The training set is still split: each worker trains on its half (an equal split may drop one row).
    total = pq.read_metadata(demo_data["train"]).num_rows
    assert all(total - 1 <= m["train_rows"] <= total for m in history), history
