"""Checkpoint validation (ValidationConfig, report(validation=...)) on a real local Ray."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading
import uuid

import pytest

import trainers
from storage import RunStorage
from storage.protocol import ReportRound
from trainers import (
    CheckpointConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    ValidationConfig,
    ValidationTaskConfig,
    WorkerGroupError,
)
from trainers.data_parallel_trainer import DataParallelTrainer

#: The validation score of each step's checkpoint: step 1 is best, step 3 (the latest) worst.
SCORES = {0: 1.0, 1: 5.0, 2: 2.0, 3: 0.0}


def _gate_class():
    import ray

    @ray.remote(num_cpus=0)
    class Gate:
        """A Ray-side event: validations wait on it, the training loop opens it."""

        def __init__(self) -> None:
            self._open = asyncio.Event()
            self._arrived = asyncio.Event()
            self.waiting = 0
            self.waiting_when_opened: int | None = None

        async def wait(self) -> None:
            self.waiting += 1
            self._arrived.set()
            await self._open.wait()

        async def open(self) -> None:
            """Open once a validation waits at the gate (a validation that blocked the training
            loop could never get here: the loop would wait in report(), not call open())."""
            await self._arrived.wait()
            self.waiting_when_opened = self.waiting
            self._open.set()

        async def state(self) -> int | None:
            return self.waiting_when_opened

    return Gate


def _save_step(step: int) -> trainers.Checkpoint:
    folder = tempfile.mkdtemp(prefix="val-test-")
    with open(os.path.join(folder, "step.txt"), "w") as f:
        f.write(str(step))
    return trainers.Checkpoint.from_directory(folder)


def _step_of(checkpoint) -> int:
    with checkpoint.as_directory() as folder, open(os.path.join(folder, "step.txt")) as f:
        return int(f.read())


def gated_score(checkpoint, gate_name: str) -> dict:
    """Waits until the training loop opens the gate (bounded, so a deadlock fails instead of hanging)."""
    import ray

    ray.get(ray.get_actor(gate_name).wait.remote(), timeout=120)
    return {"val_score": SCORES[_step_of(checkpoint)]}


def report_four_steps(config):
    import ray

    rank = trainers.get_context().get_world_rank()
    for step in range(4):
        checkpoint = _save_step(step) if rank == 0 else None
        trainers.report({"step": step}, checkpoint=checkpoint, validation=checkpoint is not None)
        if step == 2 and rank == 0:
            # Training went on past three reports while step 0's validation was pending or held.
            ray.get(ray.get_actor(config["gate"]).open.remote(), timeout=120)


def test_validation_metrics_drive_best_checkpoints_and_retention_while_training_goes_on(ray_local, tmp_path):
    import ray

    gate_name = f"gate-{uuid.uuid4().hex[:8]}"
    gate = _gate_class().options(name=gate_name).remote()
    try:
        trainer = DataParallelTrainer(
            report_four_steps,
            train_loop_config={"gate": gate_name},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name="validated",
                storage_path=str(tmp_path),
                checkpoint_config=CheckpointConfig(
                    num_to_keep=1, checkpoint_score_attribute="val_score", checkpoint_score_order="max"
                ),
            ),
            validation_config=ValidationConfig(
                gated_score, task_config=ValidationTaskConfig(fn_kwargs={"gate_name": gate_name})
            ),
        )
        result = trainer.fit()
        # A validation was running while the training loop made its third report and opened the gate.
        assert ray.get(gate.state.remote()) >= 1
    finally:
        ray.kill(gate)
    # Every validation ended before fit() returned; retention kept the best by validation score
    # (step 1) and the latest (step 3), and dropped the others once they were validated.
    assert [(m["step"], m["val_score"]) for _, m in result.best_checkpoints] == [(3, 0.0), (1, 5.0)]  # the best last
    assert _step_of(result.get_best_checkpoint("val_score", "max")) == 1
    assert sorted(p.name for p in (tmp_path / "validated").iterdir() if p.name.startswith("checkpoint_")) == [
        "checkpoint_000001",
        "checkpoint_000003",
    ]
    record = json.loads((tmp_path / "validated" / "run.json").read_text())
    assert [c["status"] for c in record["checkpoints"]] == ["VALIDATED", "VALIDATED"]
    # The training metrics of each report stay as reported.
    assert list(result.metrics_dataframe["step"]) == [0, 1, 2, 3]
    assert "val_score" not in result.metrics_dataframe.columns


def judge(checkpoint, mode: str = "ok") -> dict:
    """A validation that passes, raises, or never returns, as asked."""
    if mode == "raise":
        raise RuntimeError("the judge rejects this checkpoint")
    if mode == "hang":
        threading.Event().wait()  # until the timeout cancels the task
    return {"judged": _step_of(checkpoint)}


def report_failing_timing_out_and_good(config):
    trainers.report({"step": 0}, checkpoint=_save_step(0), validation=ValidationTaskConfig(fn_kwargs={"mode": "raise"}))
    trainers.report(
        {"step": 1},
        checkpoint=_save_step(1),
        validation=ValidationTaskConfig(fn_kwargs={"mode": "hang"}, timeout_s=0.5),
    )
    trainers.report({"step": 2}, checkpoint=_save_step(2), validation=True)
    return "trained"


def test_a_failing_and_a_timing_out_validation_are_recorded_not_fatal(ray_local, tmp_path):
    trainer = DataParallelTrainer(
        report_failing_timing_out_and_good,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="judged", storage_path=str(tmp_path), failure_config=FailureConfig(max_failures=0)),
        validation_config=ValidationConfig(judge, ray_remote_kwargs={"num_cpus": 0}),
    )
    with pytest.warns(UserWarning) as caught:
        result = trainer.fit()
    assert result.return_value == "trained"
    messages = [str(w.message) for w in caught]
    assert any("checkpoint_000000" in m and "the judge rejects this checkpoint" in m for m in messages), messages
    assert any("checkpoint_000001" in m and "timeout_s=0.5" in m for m in messages), messages
    record = json.loads((tmp_path / "judged" / "run.json").read_text())
    assert [c["status"] for c in record["checkpoints"]] == ["VALIDATION_FAILED", "VALIDATION_TIMEOUT", "VALIDATED"]
    assert [m.get("judged") for _, m in sorted(result.best_checkpoints, key=lambda c: c[1]["step"])] == [None, None, 2]


def report_with_validation(config):
    trainers.report({"step": 0}, checkpoint=_save_step(0), validation=config.get("validation", True))


def test_validation_without_a_validation_config_names_the_trainer_parameter(tmp_path):
    trainer = DataParallelTrainer(
        report_with_validation,
        train_loop_config={},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(
            name="no-config", storage_path=str(tmp_path), failure_config=FailureConfig(max_failures=0)
        ),
    )
    with pytest.raises(TrainingFailedError, match="validation_config=trainers.ValidationConfig"):
        trainer.fit()
    assert not list((tmp_path / "no-config").glob("checkpoint_*"))


def validation_with_and_without_checkpoints(config):
    rank = trainers.get_context().get_world_rank()
    # One rank's checkpoint is enough: every rank may ask for its validation.
    trainers.report({"step": 0}, checkpoint=_save_step(0) if rank == 0 else None, validation=True)
    trainers.report({"step": 1}, validation=True)  # no rank has a checkpoint: nothing to validate
    trainers.report({"step": 2}, checkpoint=_save_step(2))  # after the refused report: never committed


def test_validation_with_no_checkpoint_on_any_rank_fails_as_ray_fails_it(ray_local, tmp_path):
    trainer = DataParallelTrainer(
        validation_with_and_without_checkpoints,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="nothing-to-validate", storage_path=str(tmp_path), failure_config=FailureConfig(max_failures=0)
        ),
        validation_config=ValidationConfig(judge, ray_remote_kwargs={"num_cpus": 0}),
    )
    with pytest.raises(WorkerGroupError, match="Validation requires a checkpoint to be provided.") as caught:
        trainer.fit()
    failures = caught.value.worker_failures
    assert sorted(failures) == [0, 1] and all(type(error) is ValueError for error in failures.values())
    assert str(failures[0]).startswith("Validation requires a checkpoint to be provided. Report 1 ")
    result = trainers.Result.from_path(str(tmp_path / "nothing-to-validate"))
    assert list(result.metrics_dataframe["step"]) == [0]
    assert [m["step"] for _, m in result.best_checkpoints] == [0]


def score(checkpoint, threshold: float = 0.5) -> dict:
    return {"score": threshold}


def test_fn_kwargs_the_validation_function_does_not_take_fail_clearly(ray_local, tmp_path):
    with pytest.raises(
        TypeError, match=r"fn_kwargs.*score\(checkpoint, threshold.*unexpected keyword argument 'treshold'"
    ):
        ValidationConfig(score, task_config=ValidationTaskConfig(fn_kwargs={"treshold": 1}))
    with pytest.raises(ValueError, match=r"timeout_s=0\): must be None"):
        ValidationTaskConfig(timeout_s=0)
    with pytest.raises(TypeError, match="JSON values"):
        ValidationTaskConfig(fn_kwargs={"model": object()})
    with pytest.raises(TypeError, match="validation_config=.*trainers.ValidationConfig"):
        DataParallelTrainer(report_with_validation, validation_config=score)
    trainer = DataParallelTrainer(
        report_with_validation,
        train_loop_config={"validation": ValidationTaskConfig(fn_kwargs={"treshold": 1})},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(
            name="bad-kwargs", storage_path=str(tmp_path), failure_config=FailureConfig(max_failures=0)
        ),
        validation_config=ValidationConfig(score),
    )
    with pytest.raises(
        TrainingFailedError, match=r"report\(validation=ValidationTaskConfig\(fn_kwargs=\.\.\.\)\).*'treshold'"
    ):
        trainer.fit()


def _crashed_run_with_a_pending_validation(tmp_path, name: str) -> None:
    """What a driver that died right after committing a checkpoint leaves behind."""
    storage = RunStorage(str(tmp_path), name)
    storage.open(owner="crashed-driver")
    attempt = storage.start_attempt()
    staged = storage.layout.staging_path(attempt, 0)
    os.makedirs(staged)
    with open(os.path.join(staged, "step.txt"), "w") as f:
        f.write("7")
    storage.record_report(
        ReportRound(
            {"step": 7}, report_index=0, attempt=attempt, staged=True, validation={"fn_kwargs": {}, "timeout_s": None}
        )
    )
    storage.close()  # no finish(): the driver is gone


def report_nothing():
    return None


def test_a_resumed_run_validates_the_checkpoints_its_crashed_driver_left_pending(ray_local, tmp_path):
    _crashed_run_with_a_pending_validation(tmp_path, "resumed")
    result = DataParallelTrainer(
        report_nothing,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="resumed", storage_path=str(tmp_path)),
        validation_config=ValidationConfig(judge, ray_remote_kwargs={"num_cpus": 0}),
    ).fit()
    assert [m for _, m in result.best_checkpoints] == [{"step": 7, "judged": 7}]
    record = json.loads((tmp_path / "resumed" / "run.json").read_text())
    assert [c["status"] for c in record["checkpoints"]] == ["VALIDATED"]

    # Without a validation_config nothing can validate it: it is marked, with a warning, not left waiting.
    _crashed_run_with_a_pending_validation(tmp_path, "unvalidated")
    with pytest.warns(UserWarning, match="checkpoint_000000 .* no validation_config"):
        DataParallelTrainer(
            report_nothing,
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(name="unvalidated", storage_path=str(tmp_path)),
        ).fit()
    record = json.loads((tmp_path / "unvalidated" / "run.json").read_text())
    assert [c["status"] for c in record["checkpoints"]] == ["VALIDATION_FAILED"]
