"""TensorflowTrainer on 2 CPU workers: Keras 2 under MultiWorkerMirroredStrategy reporting every
epoch through ReportCheckpointCallback, a worker SIGKILLed mid-epoch resuming from the last
checkpoint, the best checkpoint loaded on the driver, and Ray Data shards fed through to_tf()."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tf_loops
from trainers import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig, UserCallback

EPOCHS = 5
KILL_EPOCH = 2


class Recorder(UserCallback):
    """Every rank's metrics of every report, and the restarts."""

    def __init__(self):
        self.reports: list[list[dict]] = []
        self.restarts: list[tuple[int, list]] = []

    def after_report(self, run_context, metrics, checkpoint):
        self.reports.append(metrics)

    def on_restart(self, run_context, failures, resume_from):
        self.restarts.append((len(self.reports), failures))


@pytest.fixture(scope="module")
def keras_run(_ray_session, tmp_path_factory):
    """One Keras run whose rank 1 kills itself in the middle of epoch KILL_EPOCH, once."""
    from trainers.tensorflow import TensorflowTrainer

    storage = tmp_path_factory.mktemp("keras")
    recorder = Recorder()
    marker = storage / "kill-marker"
    trainer = TensorflowTrainer(
        tf_loops.keras_mwms_loop,
        train_loop_config={"epochs": EPOCHS, "kill_epoch": KILL_EPOCH, "kill_rank": 1, "marker": str(marker)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="keras-mwms",
            storage_path=str(storage),
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
            ),
            failure_config=FailureConfig(max_failures=1),
            callbacks=[recorder],
        ),
    )
    return trainer.fit(), recorder, marker


def test_keras_trains_on_both_workers_and_reports_every_epoch(ray_local, keras_run):
    result, recorder, _ = keras_run
    assert result.return_value["keras"] == "tf_keras"  # Keras 2, which MultiWorkerMirroredStrategy needs
    history = result.metrics_dataframe
    assert list(history["epoch"]) == list(range(EPOCHS))
    losses = list(history["loss"])
    assert losses[-1] < losses[0] / 5
    # Both ranks report the same (all-reduced) logs, with every Keras metric.
    for per_rank in recorder.reports:
        assert len(per_rank) == 2 and per_rank[0] == per_rank[1]
        assert set(per_rank[0]) == {"loss", "mae", "epoch"}


def test_a_worker_killed_mid_epoch_resumes_from_the_last_checkpoint_with_no_epoch_repeated(ray_local, keras_run):
    result, recorder, marker = keras_run
    assert marker.exists()
    ((reports_before, failures),) = recorder.restarts
    assert failures[0].world_rank == 1 and failures[0].kind == "died"
    # Killed during epoch KILL_EPOCH: every epoch before it was reported once, and the new group
    # started right after the last committed checkpoint.
    assert reports_before == KILL_EPOCH
    assert result.return_value["start_epoch"] == KILL_EPOCH
    assert [per_rank[0]["epoch"] for per_rank in recorder.reports] == list(range(EPOCHS))


def test_the_best_checkpoint_loads_with_keras_and_predicts(ray_local, keras_run):
    from trainers.tensorflow import TensorflowCheckpoint
    from trainers.tensorflow.keras import ReportCheckpointCallback

    result, _, _ = keras_run
    best, metrics = result.best_checkpoints[-1]
    assert metrics["loss"] == min(result.metrics_dataframe["loss"])
    assert best.get_metadata()["epoch"] == metrics["epoch"]
    model = ReportCheckpointCallback.get_model(best)
    x, y = tf_loops.rows(seed=7, count=32)
    np.testing.assert_allclose(model.predict(x, verbose=0), y, atol=0.25)
    # The deprecated TensorflowCheckpoint (kept for Ray Train code) reads the same folder.
    with pytest.warns(DeprecationWarning):
        again = TensorflowCheckpoint(best.path)
    np.testing.assert_allclose(again.get_model().predict(x, verbose=0), model.predict(x, verbose=0))


def test_ray_data_shards_reach_tf_whole_split_across_workers(ray_local, tmp_path):
    import ray

    from trainers.tensorflow import TensorflowTrainer

    dataset = ray.data.from_items([{"x": float(i), "y": float(2 * i + 1)} for i in range(200)])
    recorder = Recorder()
    TensorflowTrainer(
        tf_loops.tf_dataset_sum_loop,
        datasets={"train": dataset},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="tf-data", storage_path=str(tmp_path), callbacks=[recorder]),
    ).fit()
    (per_rank,) = recorder.reports
    assert [m["rank"] for m in per_rank] == [0, 1]
    assert all(m["rows"] > 0 for m in per_rank)  # split, not copied to both
    assert sum(m["rows"] for m in per_rank) == 200
    assert sum(m["sum_x"] for m in per_rank) == sum(range(200))
    assert sum(m["sum_y"] for m in per_rank) == sum(2 * i + 1 for i in range(200))
    # TF_CONFIG: one cluster of both workers, each worker's task index its world rank.
    assert [m["task_index"] for m in per_rank] == [0, 1]
    assert per_rank[0]["cluster"] == per_rank[1]["cluster"] and len(per_rank[0]["cluster"]) == 2
    assert all(m["auto_shard"] == "OFF" for m in per_rank)
    assert all(m["legacy_keras"] == "1" for m in per_rank)


def test_the_callback_checks_its_arguments_before_training():
    from trainers.tensorflow.keras import ReportCheckpointCallback

    with pytest.raises(ValueError, match="checkpoint_on='epoch_ends'.*'epoch_end'"):
        ReportCheckpointCallback(checkpoint_on="epoch_ends")
    with pytest.raises(ValueError, match="report_metrics_on=\\[\\]"):
        ReportCheckpointCallback(report_metrics_on=[])
    with pytest.raises(TypeError, match="metrics=3"):
        ReportCheckpointCallback(metrics=3)
    callback = ReportCheckpointCallback(metrics={"train_loss": "loss"})
    assert callback._selected({"loss": np.float32(0.5), "mae": 1.0}, "epoch_end") == {"train_loss": 0.5}
    with pytest.raises(KeyError, match="no log 'val_loss'.*\\['loss'\\]"):
        ReportCheckpointCallback(metrics="val_loss")._selected({"loss": 1.0}, "epoch_end")


def test_without_tensorflow_installed_the_import_names_the_pip_install():
    code = (
        "import importlib.util as u; real = u.find_spec\n"
        "u.find_spec = lambda name, *a: None if name == 'tensorflow' else real(name, *a)\n"
        "try:\n    import trainers.tensorflow\nexcept ImportError as error:\n    print(error)\n    raise SystemExit(3)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "pip install 'flowtrain[tensorflow]'" in done.stdout


def test_importing_the_trainers_imports_neither_framework():
    code = "import sys, trainers, trainers.tensorflow, trainers.jax; print(sorted({'tensorflow', 'jax', 'torch'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
