"""JaxTrainer on 2 CPU workers: one jax.distributed job, cross-process collectives, a linear model
trained with jax.grad, and its checkpoint restored by a second fit() of the same run."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import jax_loops
from trainers import CheckpointConfig, RunConfig, ScalingConfig, UserCallback

EPOCHS = 4


class PerRank(UserCallback):
    """Every rank's metrics of every report."""

    def __init__(self):
        self.reports: list[list[dict]] = []

    def after_report(self, run_context, metrics, checkpoint):
        self.reports.append(metrics)


def fit(storage, epochs):
    from trainers.jax import JaxTrainer

    recorder = PerRank()
    trainer = JaxTrainer(
        jax_loops.linear_regression_loop,
        train_loop_config={"epochs": epochs, "lr": 0.1},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="jax-linear",
            storage_path=str(storage),
            checkpoint_config=CheckpointConfig(num_to_keep=1),
            callbacks=[recorder],
        ),
    )
    return trainer.fit(), recorder


@pytest.fixture(scope="module")
def jax_runs(_ray_session, tmp_path_factory):
    """The run trained for EPOCHS epochs, its final checkpoint as the driver loads it, then the
    same run asked for 2 more epochs (a resume, whose retention deletes that checkpoint)."""
    storage = tmp_path_factory.mktemp("jax")
    first = fit(storage, EPOCHS)
    loaded = jax_loops.load_params(first[0].checkpoint)
    second = fit(storage, EPOCHS + 2)
    return first, loaded, second


def test_both_workers_are_one_jax_job_and_a_cross_process_sum_agrees(ray_local, jax_runs):
    (_, recorder), _, _ = jax_runs
    for per_rank in recorder.reports:
        assert [m["process_count"] for m in per_rank] == [2, 2]
        assert [m["process_index"] for m in per_rank] == [0, 1]
        # rank 0 gives 1, rank 1 gives 2: each sees 3 only if the sum crossed processes.
        assert [m["total"] for m in per_rank] == [3.0, 3.0]


def test_a_linear_model_trained_with_jax_grad_converges(ray_local, jax_runs):
    (result, recorder), _, _ = jax_runs
    losses = [per_rank[0]["loss"] for per_rank in recorder.reports]
    assert len(losses) == EPOCHS
    assert losses[-1] < losses[0] / 10
    # Both workers step on the same (global) loss: their reports agree.
    assert all(per_rank[0]["loss"] == per_rank[1]["loss"] for per_rank in recorder.reports)
    np.testing.assert_allclose(result.return_value["w"], jax_loops.TRUE_W, atol=0.05)
    assert result.return_value["b"] == pytest.approx(jax_loops.TRUE_B, abs=0.05)


def test_its_checkpoint_restores_on_the_driver_and_in_a_resumed_run(ray_local, jax_runs):
    (result, _), (params, epoch), (resumed, recorder) = jax_runs
    assert epoch == EPOCHS - 1
    np.testing.assert_allclose(params["w"], result.return_value["w"], rtol=0, atol=1e-7)
    x, y = jax_loops.rows(seed=99, count=16)
    np.testing.assert_allclose(x @ params["w"] + params["b"], y, atol=0.2)
    # The second fit() of the run starts after the checkpoint and trains only the new epochs.
    assert resumed.return_value["start_epoch"] == EPOCHS
    assert [per_rank[0]["epoch"] for per_rank in recorder.reports] == [EPOCHS, EPOCHS + 1]
    assert list(resumed.metrics_dataframe["epoch"]) == list(range(EPOCHS + 2))
    assert recorder.reports[0][0]["loss"] <= result.metrics["loss"] * 1.01


def test_keras_3_on_the_jax_backend_trains_data_parallel_and_resumes_from_its_checkpoint(ray_local, tmp_path):
    """What a Keras 3 user gets: JaxTrainer with KERAS_BACKEND=jax and Keras' DataParallel over
    jax.devices(), reported and checkpointed by the same ReportCheckpointCallback."""
    from trainers.jax import JaxTrainer

    def fit_keras(epochs):
        recorder = PerRank()
        result = JaxTrainer(
            jax_loops.keras3_data_parallel_loop,
            train_loop_config={"epochs": epochs},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name="keras3-jax",
                storage_path=str(tmp_path),
                worker_runtime_env={"env_vars": {"KERAS_BACKEND": "jax"}},
                callbacks=[recorder],
            ),
        ).fit()
        return result, recorder

    result, recorder = fit_keras(3)
    assert result.return_value == {"backend": "jax", "start_epoch": 0, "keras": "keras"}
    losses = [per_rank[0]["loss"] for per_rank in recorder.reports]
    assert losses[-1] < losses[0] / 5
    # One model: both workers step on the gradient of all rows, so their losses agree.
    assert all(per_rank[0] == per_rank[1] for per_rank in recorder.reports)
    assert result.checkpoint.get_metadata()["keras_package"] == "keras"
    resumed, _ = fit_keras(4)
    assert resumed.return_value["start_epoch"] == 3
    assert list(resumed.metrics_dataframe["epoch"]) == [0, 1, 2, 3]
    # It went on from the saved weights: a fresh model's first epoch ends far higher.
    assert resumed.metrics["loss"] < losses[-1]


def test_jax_config_checks_itself_and_matches_the_scaling_config():
    from trainers.jax import JaxConfig, JaxTrainer

    with pytest.raises(TypeError, match="JaxConfig.use_gpu='yes'"):
        JaxConfig(use_gpu="yes")
    with pytest.raises(ValueError, match="use_tpu=True and use_gpu=True"):
        JaxConfig(use_tpu=True, use_gpu=True)
    with pytest.raises(ValueError, match=r"JaxConfig\(use_gpu=True\) needs GPUs reserved"):
        JaxTrainer(jax_loops.linear_regression_loop, jax_config=JaxConfig(use_gpu=True))
    with pytest.raises(ValueError, match=r"JaxConfig\(use_tpu=True\) needs TPUs reserved"):
        JaxTrainer(jax_loops.linear_regression_loop, jax_config=JaxConfig(use_tpu=True))
    trainer = JaxTrainer(jax_loops.linear_regression_loop, scaling_config=ScalingConfig(num_workers=1, use_tpu=True))
    assert trainer.backend_config.to_dict() == {"use_tpu": True, "use_gpu": False}
    assert trainer.backend_config.platform() == "tpu"


def test_tpus_asked_of_a_cluster_without_them_fail_fast_naming_them(ray_local, tmp_path):
    from trainers.errors import InsufficientResourcesError
    from trainers.jax import JaxTrainer

    trainer = JaxTrainer(
        jax_loops.linear_regression_loop,
        train_loop_config={"epochs": 1, "lr": 0.1},
        scaling_config=ScalingConfig(num_workers=1, use_tpu=True),
        run_config=RunConfig(name="no-tpu", storage_path=str(tmp_path)),
    )
    with pytest.raises(InsufficientResourcesError, match="TPU"):
        trainer.fit()


def test_without_jax_installed_the_import_names_the_pip_install():
    code = (
        "import importlib.util as u; real = u.find_spec; "
        "u.find_spec = lambda name, *a: None if name == 'jax' else real(name, *a)\n"
        "try:\n    import trainers.jax\nexcept ImportError as error:\n    print(error)\n    raise SystemExit(3)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "pip install 'flowtrain[jax]'" in done.stdout
