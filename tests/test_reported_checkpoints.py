"""get_all_reported_checkpoints() inside the training function, on a real local Ray."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid

import pytest

import trainers
from trainers import (
    CheckpointConsistencyMode,
    FailureConfig,
    ReportedCheckpointStatus,
    RunConfig,
    ScalingConfig,
    ValidationConfig,
)
from trainers.data_parallel_trainer import DataParallelTrainer

COMMITTED, VALIDATED = CheckpointConsistencyMode.COMMITTED, CheckpointConsistencyMode.VALIDATED


def _save(step: int) -> trainers.Checkpoint:
    folder = tempfile.mkdtemp(prefix="reported-test-")
    with open(os.path.join(folder, "step.txt"), "w") as f:
        f.write(str(step))
    return trainers.Checkpoint.from_directory(folder)


def _seen(reported) -> list[tuple[str, dict, str]]:
    """What a training function saw, in a form the test can compare (and that pickles small)."""
    out = []
    for item in reported:
        with item.checkpoint.as_directory() as folder:
            assert os.path.exists(os.path.join(folder, "step.txt")), folder  # a real, committed folder
        out.append((os.path.basename(item.checkpoint.path), item.metrics, item.status.value))
    return out


def double_step(checkpoint) -> dict:
    with checkpoint.as_directory() as folder, open(os.path.join(folder, "step.txt")) as f:
        return {"doubled": 2 * int(f.read())}


def report_and_read(config):
    rank = trainers.get_context().get_world_rank()
    seen = []
    for step in range(3):
        checkpoint = _save(step) if rank == 0 else None
        trainers.report({"step": step}, checkpoint=checkpoint, validation=checkpoint is not None and step == 2)
        # Each worker sees the checkpoint it just reported, committed, with rank 0's metrics.
        seen.append(_seen(trainers.get_all_reported_checkpoints(COMMITTED))[: step + 1])
    seen.append(_seen(trainers.get_all_reported_checkpoints()))  # VALIDATED: step 2's validation ended
    return seen if rank == 0 else None


def test_get_all_reported_checkpoints_returns_what_this_worker_just_reported(ray_local, tmp_path):
    result = DataParallelTrainer(
        report_and_read,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="read", storage_path=str(tmp_path)),
        validation_config=ValidationConfig(double_step),
    ).fit()
    after_each, validated = result.return_value[:3], result.return_value[3]
    assert [len(seen) for seen in after_each] == [1, 2, 3]
    assert after_each[0] == [("checkpoint_000000", {"step": 0}, "COMMITTED")]
    assert after_each[1][1] == ("checkpoint_000001", {"step": 1}, "COMMITTED")
    assert after_each[2][2][:2] == ("checkpoint_000002", {"step": 2})
    assert validated == [
        ("checkpoint_000000", {"step": 0}, "COMMITTED"),
        ("checkpoint_000001", {"step": 1}, "COMMITTED"),
        ("checkpoint_000002", {"step": 2, "doubled": 4}, "VALIDATED"),
    ]


def report_fail_once_then_read(config):
    rank = trainers.get_context().get_world_rank()
    resumed = trainers.get_checkpoint() is not None
    steps = [2] if resumed else [0, 1]
    for step in steps:
        trainers.report({"step": step}, checkpoint=_save(step) if rank == 0 else None, validation=rank == 0)
    if not resumed and rank == 1:
        raise RuntimeError("injected failure after two checkpoints")
    committed = _seen(trainers.get_all_reported_checkpoints(COMMITTED))
    validated = _seen(trainers.get_all_reported_checkpoints(VALIDATED))
    return (committed, validated) if rank == 0 else None


def test_get_all_reported_checkpoints_after_a_restart_includes_the_first_attempts(ray_local, tmp_path):
    result = DataParallelTrainer(
        report_fail_once_then_read,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="restarted", storage_path=str(tmp_path), failure_config=FailureConfig(max_failures=1)
        ),
        validation_config=ValidationConfig(double_step),
    ).fit()
    committed, validated = result.return_value
    names = ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002"]
    assert [name for name, _, _ in committed] == names
    assert [m["step"] for _, m, _ in committed] == [0, 1, 2]
    assert validated == [
        ("checkpoint_000000", {"step": 0, "doubled": 0}, "VALIDATED"),
        ("checkpoint_000001", {"step": 1, "doubled": 2}, "VALIDATED"),
        ("checkpoint_000002", {"step": 2, "doubled": 4}, "VALIDATED"),
    ]


def _latch_class():
    import ray

    @ray.remote(num_cpus=0)
    class Latch:
        def __init__(self) -> None:
            self._open = asyncio.Event()

        async def wait(self) -> None:
            await self._open.wait()

        async def open(self) -> None:
            self._open.set()

    return Latch


def held_validation(checkpoint, latch: str) -> dict:
    import ray

    ray.get(ray.get_actor(latch).wait.remote(), timeout=120)
    return {"held": True}


def read_with_timeout(config):
    import ray

    trainers.report({"step": 0}, checkpoint=_save(0), validation=True)
    # The validation is held: after timeout_s the answer comes as things stand, as in Ray Train.
    early = _seen(trainers.get_all_reported_checkpoints(VALIDATED, timeout_s=0.2))
    ray.get(ray.get_actor(config["latch"]).open.remote())
    late = _seen(trainers.get_all_reported_checkpoints(VALIDATED))
    with pytest.raises(ValueError, match="consistency_mode='VALIDATED'.*CheckpointConsistencyMode"):
        trainers.get_all_reported_checkpoints("VALIDATED")
    return early, late


def test_get_all_reported_checkpoints_timeout_returns_the_checkpoints_as_they_stand(ray_local, tmp_path):
    import ray

    latch_name = f"latch-{uuid.uuid4().hex[:8]}"
    latch = _latch_class().options(name=latch_name).remote()
    try:
        result = DataParallelTrainer(
            read_with_timeout,
            train_loop_config={"latch": latch_name},
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(name="timeout", storage_path=str(tmp_path)),
            validation_config=ValidationConfig(
                held_validation, trainers.ValidationTaskConfig(fn_kwargs={"latch": latch_name}), {"num_cpus": 0}
            ),
        ).fit()
    finally:
        ray.kill(latch)
    early, late = result.return_value
    assert early == [("checkpoint_000000", {"step": 0}, ReportedCheckpointStatus.PENDING_VALIDATION.value)]
    assert late == [("checkpoint_000000", {"step": 0, "held": True}, "VALIDATED")]


def test_get_all_reported_checkpoints_outside_training_says_where_it_works():
    with pytest.raises(RuntimeError, match=r"get_all_reported_checkpoints\(\) works only inside train_loop_per_worker"):
        trainers.get_all_reported_checkpoints()
