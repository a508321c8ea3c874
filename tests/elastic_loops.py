"""Training functions for the elastic and preemption tests (imported by the workers by name).

Both run step after step until the test creates ``config["stop_file"]``, so the test, not a
step count, decides when the run has done what it watches for.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import trainers
from trainers import Checkpoint


def _resumed_step() -> int | None:
    checkpoint = trainers.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        with open(os.path.join(folder, "state.json")) as f:
            return json.load(f)["step"]


def _checkpoint(step: int) -> Checkpoint:
    folder = tempfile.mkdtemp(prefix="elastic-loop-")
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump({"step": step}, f)
    return Checkpoint.from_directory(folder)


def _stop(config) -> bool:
    """Whether to stop now: rank 0 decides for all, so every rank reports equally often."""
    return trainers.collective.broadcast_from_rank_zero(os.path.exists(config["stop_file"]))


def elastic_loop(config):
    """Report every step with a checkpoint, the world size and the step this attempt resumed from."""
    context = trainers.get_context()
    resumed = _resumed_step()
    step = 0 if resumed is None else resumed + 1
    while not _stop(config):
        metrics = {"step": step, "world_size": context.get_world_size(), "resumed_from": resumed}
        trainers.report(metrics, checkpoint=_checkpoint(step))
        step += 1
        time.sleep(config["sleep_s"])  # pacing only: the test waits on reports, not on time


def preemption_loop(config):
    """Report every step; save a checkpoint only once ``get_preemption_info()`` announces a
    preemption (what a user does to lose no work on a spot instance)."""
    context = trainers.get_context()
    resumed = _resumed_step()
    step = 0 if resumed is None else resumed + 1
    saved = False
    while not _stop(config):
        info = trainers.get_preemption_info()
        metrics = {
            "step": step,
            "world_size": context.get_world_size(),
            "resumed_from": resumed,
            "preempted_ranks": None,
        }
        if info is not None and not saved:
            metrics["preempted_ranks"] = info.preempted_ranks
            metrics["deadline_ms"] = info.deadline_ms
            trainers.report(metrics, checkpoint=_checkpoint(step))
            saved = True
        else:
            trainers.report(metrics)
        step += 1
        time.sleep(config["sleep_s"])
