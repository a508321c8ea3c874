"""One training script for every place it runs (docs/scaling-out.md): a laptop, a `ray start`
cluster, a Ray Job, KubeRay, a Prefect deployment. Nothing in it names a machine.

Where it trains: RAY_ADDRESS (unset: fit() starts a local Ray). Where it writes:
FLOWTRAIN_STORAGE_PATH (unset: ~/flowtrain_results). How many workers: NUM_WORKERS (default 2).
Run it again with the same storage and it resumes from its latest checkpoint.
"""

from __future__ import annotations

import os
import tempfile

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainers as train
from trainers import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from trainers.torch import TorchTrainer, prepare_data_loader, prepare_model


def train_func(config: dict) -> None:
    # Is the sum of 8 features positive? The same 2,048 rows on every worker; the sampler splits them.
    x = torch.randn(2048, 8, generator=torch.Generator().manual_seed(0))
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    loader = prepare_data_loader(DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True))
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])

    start = 0
    if checkpoint := train.get_checkpoint():  # a restart, or a second run with the same name
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "state.pt"))
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1

    for epoch in range(start, config["epochs"]):
        loader.sampler.set_epoch(epoch)
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
            loss.backward()
            optimizer.step()
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if train.get_context().get_world_rank() == 0:
                state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
                torch.save(state, os.path.join(folder, "state.pt"))
                checkpoint = Checkpoint.from_directory(folder)
            train.report({"epoch": epoch, "loss": loss.item()}, checkpoint=checkpoint)


def main() -> None:
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"lr": 1e-2, "epochs": 3},
        scaling_config=ScalingConfig(num_workers=int(os.environ.get("NUM_WORKERS", "2"))),
        run_config=RunConfig(
            name="laptop-to-cluster",
            storage_path=os.environ.get("FLOWTRAIN_STORAGE_PATH", os.path.expanduser("~/flowtrain_results")),
            failure_config=FailureConfig(max_failures=2),
        ),
    )
    result = trainer.fit()
    print(f"final metrics: {result.metrics}")
    print(f"latest checkpoint: {result.checkpoint.path}")


if __name__ == "__main__":
    main()
