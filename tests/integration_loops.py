"""Training functions for the framework-integration tests (Lightning, Transformers, Accelerate,
FSDP), in a module so Ray workers import them by name. Frameworks are imported inside each
function, so a worker only loads the one its test uses.
"""

from __future__ import annotations

import functools
import os
import tempfile

import torch

from trainers import Checkpoint, get_checkpoint, get_context, report

NUM_ROWS = 64
GLOBAL_BATCH = 16


def regression_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x @ w + noise, small and seeded: every rank builds the same tensors."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(NUM_ROWS, 4, generator=generator)
    w = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    return x, x @ w + 0.1 * torch.randn(NUM_ROWS, 1, generator=generator)


# -- Lightning --------------------------------------------------------------------------------


@functools.cache
def lightning_regressor():
    """A LightningModule class (built on first use so other tests never import Lightning)."""
    import lightning.pytorch as pl

    class Regressor(pl.LightningModule):
        def __init__(self, lr: float = 0.05) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    Regressor.__qualname__ = "Regressor"
    return Regressor


def lightning_loop(config: dict) -> dict:
    """Lightning with the Ray strategy, environment and report callback, as a Ray Train user writes it."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from trainers.lightning import (
        RayDDPStrategy,
        RayFSDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    torch.manual_seed(0)
    model = lightning_regressor()(lr=config.get("lr", 0.05))
    x, y = regression_data()
    loader = DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // 2, shuffle=True)
    strategy = RayFSDPStrategy() if config.get("strategy") == "fsdp" else RayDDPStrategy()
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        strategy=strategy,
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        accelerator="cpu",
        devices="auto",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-root-"),
    )
    trainer = prepare_trainer(trainer)
    trainer.fit(model, train_dataloaders=loader)
    return {
        "world_size": trainer.world_size,
        "global_rank": trainer.global_rank,
        "sampler": type(trainer.train_dataloader.sampler).__name__,
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()} if config.get("strategy") != "fsdp" else None,
    }
