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


# -- Hugging Face Transformers ------------------------------------------------------------------


class TokenData(torch.utils.data.Dataset):
    """Random token sequences with a label that depends on them (seeded, no download)."""

    def __init__(self, num_rows: int = 32, length: int = 8, vocab: int = 32) -> None:
        generator = torch.Generator().manual_seed(0)
        self.input_ids = torch.randint(0, vocab, (num_rows, length), generator=generator)
        self.labels = (self.input_ids[:, 0] >= vocab // 2).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.input_ids[index], "labels": self.labels[index]}


def transformers_loop(config: dict) -> dict:
    """A transformers.Trainer script with the two flowtrain lines; resumes from get_checkpoint()."""
    import transformers

    from trainers.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    transformers.set_seed(0)
    model = transformers.BertForSequenceClassification(
        transformers.BertConfig(
            vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=16, num_labels=2,
        )
    )
    args = transformers.TrainingArguments(
        output_dir=config["output_dir"],  # one folder for both ranks, as on one machine
        max_steps=config["max_steps"],
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=2,
        save_steps=2,
        report_to=[],
        disable_tqdm=True,
        seed=0,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=TokenData(), callbacks=[RayTrainReportCallback()]
    )
    trainer = prepare_trainer(trainer)
    checkpoint = get_checkpoint()
    start_step = 0
    if checkpoint is None:
        trainer.train()
    else:
        with checkpoint.as_directory() as folder:
            path = os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME)
            start_step = transformers.TrainerState.load_from_json(os.path.join(path, "trainer_state.json")).global_step
            trainer.train(resume_from_checkpoint=path)
    return {
        "start_step": start_step,
        "global_step": trainer.state.global_step,
        "world_size": trainer.args.world_size,
        "process_index": trainer.args.process_index,
    }


# -- Accelerate ---------------------------------------------------------------------------------


def accelerate_loop(config: dict) -> dict:
    """A plain Accelerate loop: ``Accelerator()`` with no arguments must find the 2-worker group."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    accelerator = Accelerator()
    rank = accelerator.process_index
    # Collectives through Accelerate: every rank contributes rank + 1.
    mine = torch.tensor([float(rank + 1)])
    reduced = accelerator.reduce(mine.clone(), reduction="sum").item()
    gathered = accelerator.gather(mine).tolist()

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = regression_data()
    loader = DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // 2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    grads = []
    for step, (xb, yb) in enumerate(loader):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        # Both ranks' gradients after the all-reduce, side by side.
        grads.append(accelerator.gather(accelerator.unwrap_model(model).weight.grad.detach()[None]).clone())
        optimizer.step()
        report({"step": step, "loss": accelerator.reduce(loss.detach(), reduction="mean").item()})
    return {
        "distributed_type": str(accelerator.distributed_type),
        "num_processes": accelerator.num_processes,
        "process_index": rank,
        "device": str(accelerator.device),
        "reduced": reduced,
        "gathered": gathered,
        "num_batches": len(loader),
        "grads": torch.stack(grads),
        "weight": accelerator.unwrap_model(model).weight.detach().clone(),
    }
