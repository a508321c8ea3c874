"""Training loops and trial functions the Tune tests run (trial processes import this module)."""

from __future__ import annotations

import os
import pathlib
import tempfile
import time

import trainers
from trainers import Checkpoint, RunConfig, ScalingConfig, UserCallback
from trainers.tune import trial_run_config

#: One worker per trial: with the trial's own CPU, two trials fit the test Ray's 4 CPUs at once.
SCALING = ScalingConfig(num_workers=1)
STEPS_PER_EPOCH = 10


def regression_loop(config: dict) -> None:
    """Fit y = 3x + 1 with a one-weight linear model and SGD at ``config["lr"]``.

    One report per epoch, with the loss after the epoch's steps and a checkpoint of the weights
    (a restart resumes from it); ``lr=0`` never learns, so its loss stays where it started.
    """
    import torch

    from trainers.torch import prepare_model

    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 64).unsqueeze(1)
    y = 3 * x + 1
    layer = torch.nn.Linear(1, 1)
    start = 0
    if checkpoint := trainers.get_checkpoint():
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "model.pt"))
        layer.load_state_dict(state["model"])
        start = state["epoch"] + 1
    model = prepare_model(layer)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for epoch in range(start, config["epochs"]):
        for _ in range(STEPS_PER_EPOCH):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        with torch.no_grad():
            loss = torch.nn.functional.mse_loss(model(x), y).item()
        time.sleep(config.get("sleep_s", 0.0))
        with tempfile.TemporaryDirectory() as folder:
            torch.save({"model": layer.state_dict(), "epoch": epoch}, os.path.join(folder, "model.pt"))
            trainers.report({"epoch": epoch, "loss": loss}, checkpoint=Checkpoint.from_directory(folder))


class FailOnceAfterEpoch(UserCallback):
    """Raises in the trial's process after the report of epoch 1, once (``marker`` records it)."""

    def __init__(self, marker: str) -> None:
        self.marker = pathlib.Path(marker)

    def after_report(self, run_context, metrics, checkpoint):
        if metrics[0]["epoch"] == 1 and not self.marker.exists():
            self.marker.touch()
            raise RuntimeError("injected failure of the trial's driver after a committed checkpoint")


def train_driver(config: dict) -> None:
    """A Tune trial: train ``regression_loop`` with the trial's config, reporting to Tune.

    ``config["fail_once_marker"]``: a file path; the trial's driver fails once after epoch 1.
    """
    from trainers.torch import TorchTrainer

    callbacks = [FailOnceAfterEpoch(config["fail_once_marker"])] if config.get("fail_once_marker") else []
    trainer = TorchTrainer(
        regression_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=config.get("num_workers", SCALING.num_workers)),
        run_config=trial_run_config(RunConfig(storage_path=config["storage_path"], callbacks=callbacks)),
    )
    trainer.fit()


def trainer_object(storage_path: str, epochs: int) -> trainers.DataParallelTrainer:
    """The trainer a Ray Train user hands to ``tune.Tuner`` itself (the older, trainer-object form)."""
    from trainers.torch import TorchTrainer

    return TorchTrainer(
        regression_loop,
        train_loop_config={"epochs": epochs},
        scaling_config=SCALING,
        run_config=RunConfig(storage_path=storage_path),
    )
