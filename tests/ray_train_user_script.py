"""A training script as a Ray Train user writes it (Ray 2.60 docs style).

tests/test_ray_train_compat.py switches its imports to flowtrain and runs it;
tests/test_ray_train_runs.py runs it with ray.train, then continues the run with switched imports."""

import os
import tempfile

import torch
from ray import train
from ray.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from ray.train.collective import broadcast_from_rank_zero
from ray.train.torch import TorchTrainer, prepare_data_loader, prepare_model
from torch.utils.data import DataLoader, TensorDataset


def train_func(config):
    # Rank 0 picks the data seed; every rank must build the same dataset.
    seed = broadcast_from_rank_zero(config["seed"] if train.get_context().get_world_rank() == 0 else None)
    torch.manual_seed(seed)
    x = torch.randn(256, 8)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    loader = DataLoader(TensorDataset(x, y), batch_size=config["batch_size"], shuffle=True)
    loader = prepare_data_loader(loader)

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model = prepare_model(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    loss_fn = torch.nn.BCEWithLogitsLoss()

    start_epoch = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            state = torch.load(os.path.join(checkpoint_dir, "model.pt"))
            model.module.load_state_dict(state["model"])
            start_epoch = state["epoch"] + 1

    for epoch in range(start_epoch, config["epochs"]):
        if train.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        total = 0.0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.item()

        metrics = {"loss": total / len(loader), "epoch": epoch}
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            if train.get_context().get_world_rank() == 0:
                torch.save(
                    {"model": model.module.state_dict(), "epoch": epoch},
                    os.path.join(temp_checkpoint_dir, "model.pt"),
                )
                train.report(metrics, checkpoint=Checkpoint.from_directory(temp_checkpoint_dir))
            else:
                train.report(metrics)


def main(storage_path, epochs=3, num_to_keep=2):
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"lr": 1e-2, "batch_size": 32, "epochs": epochs, "seed": 0},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            name="ray-train-user",
            storage_path=storage_path,
            checkpoint_config=CheckpointConfig(
                num_to_keep=num_to_keep, checkpoint_score_attribute="loss", checkpoint_score_order="min"
            ),
        ),
    )
    result = trainer.fit()
    return result
