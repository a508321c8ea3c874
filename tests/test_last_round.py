"""The last round before a failure: a round whose report() returned on every rank is kept.

Ray Train's own ``test_result_restore`` pattern (every rank reports a checkpoint, then raises at
once), repeated: each attempt commits one round and fails right after it, on local storage and on
S3. Any lost round shows up as a run that runs out of its failure budget one round short.
"""

from __future__ import annotations

import os
import pathlib
import tempfile

import pytest

import trainers
from test_controller import MemoryStore, ScriptedWorkers, policy
from test_s3_storage import s3  # noqa: F401 (the moto server fixture)
from trainers import Checkpoint, DataParallelTrainer, FailureConfig, Result, RunConfig, ScalingConfig, WorkerGroupError
from trainers._internal.events.messages import NOT_TRAINING, FailedEvent, ReportEvent
from trainers._internal.run.controller import Controller, ControllerSettings

#: Attempts per run; each one commits a round and fails right after it. 10 on each storage, 20 in
#: all: each attempt starts a new worker group, so more would cost the suite seconds per attempt.
ROUNDS = 10


def report_one_round_then_fail() -> None:
    """Resume from the previous round, report the next one with a checkpoint on every rank, fail."""
    checkpoint = trainers.get_checkpoint()
    previous = -1
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            previous = int(pathlib.Path(folder, "round.txt").read_text())
    this_round = previous + 1
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "round.txt"), "w") as file:
            file.write(str(this_round))
        trainers.report({"round": this_round}, checkpoint=Checkpoint.from_directory(folder))
    raise RuntimeError(f"planned failure right after round {this_round}")


def fail_after_every_round(storage_path: str, filesystem=None) -> str:
    """Run ROUNDS attempts that each fail after their round; return the run's path."""
    trainer = DataParallelTrainer(
        report_one_round_then_fail,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="last-round",
            storage_path=storage_path,
            storage_filesystem=filesystem,
            failure_config=FailureConfig(max_failures=ROUNDS - 1),
        ),
    )
    with pytest.raises(WorkerGroupError, match="planned failure") as caught:
        trainer.fit()
    assert caught.value.budget_exhausted
    return f"{storage_path}/last-round"


def assert_every_round_kept(path: str, filesystem=None) -> None:
    result = Result.from_path(path, storage_filesystem=filesystem)
    # One more attempt than the budget allows: a lost round would leave the last one short.
    assert list(result.metrics_dataframe["round"]) == list(range(ROUNDS))
    assert result.metrics["round"] == ROUNDS - 1
    with result.checkpoint.as_directory() as folder:
        assert pathlib.Path(folder, "round.txt").read_text() == str(ROUNDS - 1)


class EndedWorkers(ScriptedWorkers):
    """Workers whose training functions have all ended: their last events are still in flight."""

    def probe(self, ranks):
        return [], {rank: NOT_TRAINING for rank in ranks}


def test_a_slow_last_report_of_an_ended_rank_is_still_committed():
    # Rank 0 reports round 0 and fails; rank 1 did the same, but its report reaches the driver
    # only after a few empty polls, later than drain_timeout_s allows for a rank still training.
    late = [[], [], [ReportEvent(1, 0, {"round": 0}, True), FailedEvent(1, RuntimeError("boom"), "")]]
    workers = EndedWorkers(
        2, [[[ReportEvent(0, 0, {"round": 0}, True), FailedEvent(0, RuntimeError("boom"), "")], *late]]
    )
    store = MemoryStore()
    controller = Controller(
        workers=workers, storage=store, policy=policy(max_failures=0), settings=ControllerSettings(drain_timeout_s=0.0)
    )
    with pytest.raises(WorkerGroupError):
        controller.run()
    assert store.reports == [(1, 0, {"round": 0}, True)]
    assert sorted(controller.error.worker_failures) == [0, 1]


def test_a_rank_still_training_does_not_hold_up_the_failure():
    workers = ScriptedWorkers(2, [[[ReportEvent(0, 0, {"round": 0}, True), FailedEvent(0, RuntimeError("boom"), "")]]])
    store = MemoryStore()
    with pytest.raises(WorkerGroupError):
        Controller(
            workers=workers,
            storage=store,
            policy=policy(max_failures=0),
            settings=ControllerSettings(drain_timeout_s=0.0),
        ).run()
    assert store.reports == []  # rank 1 never reported round 0: nothing to commit


@pytest.mark.usefixtures("ray_local")
def test_round_reported_on_every_rank_survives_the_failure_right_after_it_local(tmp_path):
    path = fail_after_every_round(str(tmp_path))
    assert_every_round_kept(path)


@pytest.mark.usefixtures("ray_local")
def test_round_reported_on_every_rank_survives_the_failure_right_after_it_s3(s3):  # noqa: F811
    path = fail_after_every_round("s3://flowtrain-test/last-round", s3)
    assert_every_round_kept(path, s3)
