"""RunStorage.verify_and_tidy, the pipeline's checkpoint stage: verify, final retention, cleanup. No Ray."""

from __future__ import annotations

import os
import shutil

import pytest

from storage import CheckpointConfig, RunInProgressError, RunStorage, StorageError, load_run
from test_storage_run import folders, report


def finished_run(tmp_path, losses, *, trailing_metrics=0):
    storage = RunStorage(str(tmp_path), "run")
    storage.open("trainer")
    attempt = storage.start_attempt()
    for index, loss in enumerate(losses):
        report(storage, attempt, index, {"loss": loss, "step": index}, checkpoint=True)
    for extra in range(trailing_metrics):
        index = len(losses) + extra
        report(storage, attempt, index, {"loss": 9.0, "step": index})
    storage.finish()
    return storage


def test_final_retention_keeps_the_best_and_latest_and_history_stays_whole(tmp_path):
    finished_run(tmp_path, [0.9, 0.2, 0.5, 0.7, 0.6], trailing_metrics=2)
    os.makedirs(tmp_path / "run" / "checkpoint_000042")  # left by a crash, never named
    os.makedirs(tmp_path / "run" / ".staging" / "attempt_0009")

    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="loss", checkpoint_score_order="min")
    kept = RunStorage(str(tmp_path), "run", checkpoint_config=config).verify_and_tidy("checker")

    assert [os.path.basename(c.path) for c in kept] == ["checkpoint_000001", "checkpoint_000004"]
    assert folders(tmp_path / "run") == ["checkpoint_000001", "checkpoint_000004"]
    assert not (tmp_path / "run" / ".staging").exists()
    assert not list((tmp_path / "run").glob("lease.*"))
    view = load_run(str(tmp_path / "run"))
    assert [m["step"] for m in view.metrics_history] == [0, 1, 2, 3, 4, 5, 6]  # nothing forgotten
    assert view.snapshot.finished


def test_a_named_checkpoint_that_is_missing_is_an_error_naming_it(tmp_path):
    finished_run(tmp_path, [0.3, 0.1])
    shutil.rmtree(tmp_path / "run" / "checkpoint_000001")
    with pytest.raises(StorageError, match=r"checkpoint_000001 is named in .*run.json but missing"):
        RunStorage(str(tmp_path), "run").verify_and_tidy("checker")
    assert folders(tmp_path / "run") == ["checkpoint_000000"]  # nothing else was touched
    assert not list((tmp_path / "run").glob("lease.*"))


def test_a_live_run_is_left_alone(tmp_path):
    live = RunStorage(str(tmp_path), "run")
    live.open("trainer")
    try:
        with pytest.raises(RunInProgressError, match="run in progress"):
            RunStorage(str(tmp_path), "run").verify_and_tidy("checker")
    finally:
        live.close()


def test_no_run_there_is_an_error(tmp_path):
    with pytest.raises(StorageError, match="has no run.json"):
        RunStorage(str(tmp_path), "nothing").verify_and_tidy("checker")
