"""TorchTrainer end to end on a real local Ray: DDP, reports, checkpoints, failures, local mode."""

from __future__ import annotations

import os
import pathlib

import pytest

import loops
from trainers import (
    CheckpointConfig,
    CheckpointUploadMode,
    FailureConfig,
    InsufficientResourcesError,
    Result,
    RunConfig,
    ScalingConfig,
    UserCallback,
    WorkerGroupError,
)
from trainers.torch import TorchConfig, TorchTrainer

pytestmark = pytest.mark.usefixtures("ray_local")


class RecordReports(UserCallback):
    """Keeps every rank's metrics of every report, and each restart (callbacks run in the driver)."""

    def __init__(self):
        self.rounds = []
        self.restarts = []

    def after_report(self, run_context, metrics, checkpoint):
        self.rounds.append(metrics)

    def on_restart(self, run_context, failures, resume_from):
        self.restarts.append((len(self.rounds), failures, resume_from))


def single_process_reference(config):
    """The same computation as loops.linear_ddp_loop, in this process with plain torch."""
    import torch

    torch.manual_seed(config["seed"])
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    x, y = loops.dataset()
    for _ in range(config["epochs"]):
        for start in range(0, loops.NUM_ROWS, loops.GLOBAL_BATCH):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x[start : start + 16]), y[start : start + 16]).backward()
            optimizer.step()
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def assert_matches_single_process(result, config):
    """The run's returned weights (rank 0's) equal single_process_reference's."""
    import torch

    expected = single_process_reference(config)
    for name, value in result.return_value.items():
        torch.testing.assert_close(torch.tensor(value), expected[name], rtol=1e-5, atol=1e-6)


def test_two_worker_ddp_matches_single_process_and_ranks_are_right(tmp_path):
    config = {"seed": 3, "lr": 0.05, "epochs": 2}
    recorder = RecordReports()
    trainer = TorchTrainer(
        loops.linear_ddp_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="ddp", storage_path=str(tmp_path), callbacks=[recorder]),
    )
    result = trainer.fit()

    assert_matches_single_process(result, config)

    steps = 2 * loops.NUM_ROWS // loops.GLOBAL_BATCH
    assert len(recorder.rounds) == steps
    for metrics in recorder.rounds:
        assert [m["world_rank"] for m in metrics] == [0, 1]
        assert [m["env_rank"] for m in metrics] == [0, 1]
        assert [m["dist_rank"] for m in metrics] == [0, 1]
        assert [m["local_rank"] for m in metrics] == [0, 1]  # one node
        assert [m["node_rank"] for m in metrics] == [0, 0]

    frame = result.metrics_dataframe
    assert len(frame) == steps
    assert list(frame["step"]) == list(range(steps))
    assert result.metrics["step"] == steps - 1
    assert result.error is None
    assert result.path == str(tmp_path / "ddp")


def test_tcp_init_method_gives_the_same_ddp_result(tmp_path):
    config = {"seed": 3, "lr": 0.05, "epochs": 1}
    result = TorchTrainer(
        loops.linear_ddp_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        torch_config=TorchConfig(init_method="tcp"),
        run_config=RunConfig(name="ddp-tcp", storage_path=str(tmp_path)),
    ).fit()

    assert_matches_single_process(result, config)
    assert result.metrics["dist_rank"] == 0


def test_local_mode_gives_the_single_process_result(tmp_path):
    config = {"seed": 3, "lr": 0.05, "epochs": 2}
    result = TorchTrainer(
        loops.linear_ddp_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="local", storage_path=str(tmp_path)),
    ).fit()
    assert_matches_single_process(result, config)
    assert len(result.metrics_dataframe) == 16


@pytest.mark.parametrize("upload_mode", [CheckpointUploadMode.SYNC, CheckpointUploadMode.ASYNC])
def test_every_report_is_a_row_and_checkpoints_are_committed(tmp_path, upload_mode):
    result = TorchTrainer(
        loops.checkpointing_loop,
        train_loop_config={"steps": 7, "every": 3, "upload_mode": upload_mode},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="ckpt", storage_path=str(tmp_path), checkpoint_config=CheckpointConfig(num_to_keep=2)
        ),
    ).fit()
    assert list(result.metrics_dataframe["step"]) == list(range(7))
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as folder:
        assert pathlib.Path(folder, "step.txt").read_text() == "6"
    assert os.path.isdir(result.checkpoint.path)
    assert [m["step"] for _, m in result.best_checkpoints] == [3, 6]
    for checkpoint, _ in result.best_checkpoints:
        assert os.path.isdir(checkpoint.path)

    rebuilt = Result.from_path(result.path)
    assert list(rebuilt.metrics_dataframe["step"]) == list(range(7))
    assert rebuilt.checkpoint.path == result.checkpoint.path


def test_worker_error_names_rank_node_and_traceback_and_max_failures_0_never_restarts(tmp_path):
    with pytest.raises(WorkerGroupError) as info:
        TorchTrainer(
            loops.failing_loop,
            train_loop_config={"rank": 1},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="fails", storage_path=str(tmp_path)),
        ).fit()
    error = info.value
    assert set(error.worker_failures) == {1}
    assert isinstance(error.worker_failures[1], ValueError)
    message = str(error)
    assert "rank 1 on node" in message and "ValueError: bad value on rank 1" in message
    assert "Traceback" in message and "failing_loop" in message
    assert "max_failures=0" in message
    assert error.attempt == 1


def test_restart_resumes_from_latest_checkpoint(tmp_path):
    recorder = RecordReports()
    marker = tmp_path / "failed-once"
    result = TorchTrainer(
        loops.checkpointing_loop,
        train_loop_config={"steps": 8, "every": 2, "fail_at": 5, "fail_rank": 1, "fail_marker": str(marker)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="restart",
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=1),
            callbacks=[recorder],
        ),
    ).fit()
    assert marker.exists()
    # Every step's metrics appear exactly once in the run's history, resumed or not.
    assert list(result.metrics_dataframe["step"]) == list(range(8))
    ((rounds_before, failures, resume_from),) = recorder.restarts
    assert [f.world_rank for f in failures] == [1] and "injected failure at step 5" in failures[0].message
    with resume_from.as_directory() as folder:
        checkpointed = int(pathlib.Path(folder, "step.txt").read_text())
    assert checkpointed in (2, 4)  # 4 unless rank 0's step-4 report was still in flight
    reported = [m[0]["step"] for m in recorder.rounds]
    assert reported[:rounds_before] == list(range(rounds_before))
    # The first step after the restart is exactly the one after the checkpoint.
    assert reported[rounds_before:] == list(range(checkpointed + 1, 8))


def test_infeasible_scaling_config_fails_fast_naming_resources(tmp_path):
    from ray.util import placement_group_table

    groups_before = set(placement_group_table())
    with pytest.raises(
        InsufficientResourcesError, match=r"64 workers x \{CPU: 1\} = \{CPU: 64\}, but the cluster has \{CPU: 4"
    ):
        TorchTrainer(
            loops.no_arg_loop,
            scaling_config=ScalingConfig(num_workers=64),
            run_config=RunConfig(name="too-big", storage_path=str(tmp_path)),
        ).fit()
    with pytest.raises(InsufficientResourcesError, match=r"no node has 'GPU'"):
        TorchTrainer(
            loops.no_arg_loop,
            scaling_config=ScalingConfig(num_workers=1, use_gpu=True),
            run_config=RunConfig(name="gpu", storage_path=str(tmp_path)),
        ).fit()
    # Refused before anything was reserved (no placement group, even a removed one) or written:
    # not after waiting for resources that can never come.
    assert set(placement_group_table()) == groups_before
    assert not (tmp_path / "too-big").exists()


def test_no_argument_loop_and_return_value(tmp_path):
    result = TorchTrainer(
        loops.no_arg_loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="noarg", storage_path=str(tmp_path)),
    ).fit()
    assert result.return_value == "no-arg"
    assert result.metrics == {"ok": 1}


def test_a_worker_imports_neither_the_driver_side_nor_torch_trainer():
    """What a worker unpickles to start (its actor class, the torch backend's set-up functions)
    must not pull in the driver's modules: every worker paid their import at start-up (issue 36)."""
    import subprocess
    import sys

    driver_side = (
        "trainers.data_parallel_trainer",
        "trainers._internal.run.controller",
        "storage.run_storage",
        "pandas",
    )
    code = (
        "import sys, trainers._internal.workers.worker, trainers.torch.config; "
        f"print(sorted(m for m in {driver_side!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
