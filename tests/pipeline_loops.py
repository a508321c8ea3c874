"""Training loops and callbacks the pipeline tests name by import path (workers import this module)."""

from __future__ import annotations

import os
import pathlib
import tempfile
import time

import trainers
from trainers import Checkpoint, UserCallback


def write_classification_parquet(folder: pathlib.Path, rows: int = 512, seed: int = 0) -> str:
    """A small seeded binary classification set as a parquet file; returns its path."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4)).astype("float32")
    frame = pd.DataFrame(x, columns=["f0", "f1", "f2", "f3"])
    frame["label"] = (x[:, 0] + x[:, 1] - x[:, 2] > 0).astype("int64")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "data.parquet"
    frame.to_parquet(path)
    return str(path)


def counting_loop(config: dict) -> None:
    """One report (with a checkpoint) per epoch of rows counted from the train shard.

    Each start is recorded in ``config["marker_dir"]`` as ``start-<epoch>-<rank>-<pid>``; with
    ``kill_at_epoch`` rank 1 SIGKILLs itself once (a ``killed`` marker keeps it to once).
    """
    marker_dir = pathlib.Path(config["marker_dir"])
    context = trainers.get_context()
    rank = context.get_world_rank()
    start = 0
    if checkpoint := trainers.get_checkpoint():
        with checkpoint.as_directory() as folder:
            start = int(pathlib.Path(folder, "epoch").read_text()) + 1
    (marker_dir / f"start-{start}-{rank}-{os.getpid()}").touch()
    shard = trainers.get_dataset_shard("train")
    for epoch in range(start, config["epochs"]):
        rows = sum(len(batch["label"]) for batch in shard.iter_batches(batch_size=64))
        if epoch == config.get("kill_at_epoch") and rank == 1 and not (marker_dir / "killed").exists():
            (marker_dir / "killed").touch()
            os.kill(os.getpid(), 9)
        if config.get("sleep_s"):
            time.sleep(config["sleep_s"])
        report_with_epoch_checkpoint({"epoch": epoch, "rows": rows, "score": float(epoch % 2)}, epoch)


def report_with_epoch_checkpoint(metrics: dict, epoch: int) -> None:
    """``report(metrics)`` with a checkpoint from rank 0 holding ``epoch`` (the other ranks report none)."""
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if trainers.get_context().get_world_rank() == 0:
            with open(os.path.join(folder, "epoch"), "w") as f:
                f.write(str(epoch))
            checkpoint = Checkpoint.from_directory(folder)
        trainers.report(metrics, checkpoint=checkpoint)


class FailOnceCallback(UserCallback):
    """Raises in the driver after the report of ``fail_after_epoch``, once (a driver-level failure)."""

    marker: pathlib.Path | None = None
    fail_after_epoch = 1

    def after_report(self, run_context, metrics, checkpoint):
        marker = type(self).marker
        if metrics[0]["epoch"] == self.fail_after_epoch and marker is not None and not marker.exists():
            marker.touch()
            raise RuntimeError("injected driver failure after a committed checkpoint")
