"""flowtrain quickstart: a Ray Train script with its imports switched, training an MLP on 2 CPU workers.

Run it with `make demo` (or `.venv/bin/python examples/torch_quickstart.py [storage_path]`).
Run it twice with the same storage path and it resumes from the latest checkpoint instead of
starting over.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
from torch.utils.data import DataLoader, TensorDataset

import trainers as train  # was: from ray import train
from trainers import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from trainers.torch import TorchTrainer, prepare_data_loader, prepare_model


def train_func(config: dict) -> None:
    # A toy classification problem: is the sum of the 8 features positive?
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 8, generator=generator)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    loader = prepare_data_loader(DataLoader(TensorDataset(x, y), batch_size=config["batch_size"], shuffle=True))

    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])

    start_epoch = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:  # resuming: a restart after a failure, or a second run with the same name
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "state.pt"))
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1

    for epoch in range(start_epoch, config["epochs"]):
        loader.sampler.set_epoch(epoch)
        total, correct, seen = 0.0, 0, 0
        for xb, yb in loader:
            optimizer.zero_grad()
            logits = model(xb)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, yb)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(xb)
            correct += ((logits > 0).float() == yb).sum().item()
            seen += len(xb)
        metrics = {"epoch": epoch, "loss": total / seen, "accuracy": correct / seen}
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if train.get_context().get_world_rank() == 0:
                torch.save(
                    {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                    os.path.join(folder, "state.pt"),
                )
                checkpoint = Checkpoint.from_directory(folder)
            train.report(metrics, checkpoint=checkpoint)


def main() -> None:
    storage_path = sys.argv[1] if len(sys.argv) > 1 else os.path.abspath("demo_results")
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"lr": 1e-2, "batch_size": 64, "epochs": 5},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="quickstart",
            storage_path=storage_path,
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
            ),
            failure_config=FailureConfig(max_failures=2),
        ),
    )
    result = trainer.fit()
    print(result.metrics_dataframe[["epoch", "loss", "accuracy"]].to_string(index=False))
    print(f"final metrics: {result.metrics}")
    print(f"latest checkpoint: {result.checkpoint.path}")
    best = result.get_best_checkpoint("loss", "min")
    print(f"best checkpoint by loss: {best.path if best else None}")
    print(f"run folder (Result.from_path): {result.uri}")


if __name__ == "__main__":
    main()
