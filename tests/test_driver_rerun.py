"""The driver (the process calling fit()) is SIGKILLed mid-run; rerunning the same name at once
takes the dead driver's lease over and resumes from the last committed checkpoint.

Run as a script, this file is that driver: ``python test_driver_rerun.py STORAGE NAME EPOCHS HOLD_AFTER``
joins the Ray in RAY_ADDRESS (the test session's, so killing it leaves no Ray behind) and trains
until epoch HOLD_AFTER is reported, then holds there until it is killed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from loops import resume_after_checkpoint
from trainers import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig, UserCallback, get_context, report

EPOCHS = 6
HOLD_AFTER = 2  # the killed driver commits epochs 0..2
LEASE_STALE_AFTER_S = 30.0  # RunStorage's default, which fit() uses


def epoch_loop(config: dict) -> None:
    """Two ranks; rank 0 checkpoints every epoch; resumes after the checkpoint it is given."""
    start = resume_after_checkpoint("epoch.txt")
    for epoch in range(start, config["epochs"]):
        if get_context().get_world_rank() == 0:
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, "epoch.txt"), "w") as f:
                    f.write(str(epoch))
                report({"epoch": epoch, "start": start}, checkpoint=Checkpoint.from_directory(folder))
        else:
            report({"epoch": epoch, "start": start})
        if epoch == config.get("hold_after"):
            threading.Event().wait()  # until the driver is killed


def trainer(storage_path: str, name: str, epochs: int, hold_after: int | None, callbacks=()) -> DataParallelTrainer:
    return DataParallelTrainer(
        epoch_loop,
        train_loop_config={"epochs": epochs, "hold_after": hold_after},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=name, storage_path=storage_path, callbacks=list(callbacks)),
    )


class FirstReport(UserCallback):
    def __init__(self):
        self.epochs: list[int] = []

    def after_report(self, run_context, metrics, checkpoint):
        self.epochs.append(metrics[0]["epoch"])


def committed_checkpoints(run_dir) -> int:
    try:
        return len(json.loads((run_dir / "run.json").read_text())["checkpoints"])
    except (OSError, ValueError, KeyError):
        return 0  # not written yet, or caught mid-replace


def wait_for_commits(driver: subprocess.Popen, run_dir, count: int, log) -> None:
    """Wait until the driver's run.json names ``count`` checkpoints (fails if the driver exits)."""
    deadline = time.monotonic() + 120
    while committed_checkpoints(run_dir) < count:
        if driver.poll() is not None:
            pytest.fail(f"the driver exited ({driver.returncode}) early:\n{log.read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"the driver committed no {count} checkpoints in time:\n{log.read_text()}")
        time.sleep(0.1)


@pytest.mark.usefixtures("ray_local")
def test_rerun_right_after_the_driver_is_killed_resumes_at_once(tmp_path):
    import ray

    run_dir = tmp_path / "run"
    log = tmp_path / "driver.log"
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    with open(log, "w") as out:
        driver = subprocess.Popen(
            [sys.executable, __file__, str(tmp_path), "run", str(EPOCHS), str(HOLD_AFTER)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_commits(driver, run_dir, HOLD_AFTER + 1, log)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()

    # The dead driver's lease is still fresh: going by staleness alone the rerun would be refused.
    [lease] = [json.loads(claim.read_text()) for claim in run_dir.glob("lease.*.json")]
    assert (lease["host"], lease["pid"]) == (socket.gethostname(), driver.pid)
    assert time.time() - lease["heartbeat"] < LEASE_STALE_AFTER_S - 10

    reports = FirstReport()
    result = trainer(str(tmp_path), "run", EPOCHS, None, [reports]).fit()  # no RunInProgressError

    assert reports.epochs == list(range(HOLD_AFTER + 1, EPOCHS))  # from the checkpoint's next epoch
    assert list(result.metrics_dataframe["epoch"]) == list(range(EPOCHS))  # no epoch lost or repeated
    assert list(result.metrics_dataframe["start"]) == [0] * (HOLD_AFTER + 1) + [HOLD_AFTER + 1] * (
        EPOCHS - HOLD_AFTER - 1
    )
    assert not list(run_dir.glob("lease.*.json"))


if __name__ == "__main__":
    storage, name, epochs, hold_after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    trainer(storage, name, epochs, hold_after).fit()
