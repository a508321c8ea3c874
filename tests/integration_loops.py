"""Training functions for the framework-integration tests (Lightning, Transformers, Accelerate,
FSDP), in a module so Ray workers import them by name. Frameworks are imported inside each
function, so a worker only loads the one its test uses.
"""

from __future__ import annotations

import functools
import os
import tempfile

import torch

from trainers import Checkpoint, get_checkpoint, get_context, get_dataset_shard, report

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
    """Lightning with the Ray strategy, environment and report callback, as a Ray Train user
    writes it; resumes from ``get_checkpoint()`` through Lightning's own ``ckpt_path``."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from trainers.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    torch.manual_seed(0)
    model = lightning_regressor()(lr=config.get("lr", 0.05))
    x, y = regression_data()
    loader = DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // 2, shuffle=True)
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        strategy=RayDDPStrategy(),
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
    checkpoint = get_checkpoint()
    if checkpoint is None:
        trainer.fit(model, train_dataloaders=loader)
    else:
        with checkpoint.as_directory() as folder:
            trainer.fit(
                model, train_dataloaders=loader, ckpt_path=os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME)
            )
    return {
        "world_size": trainer.world_size,
        "global_rank": trainer.global_rank,
        "sampler": type(trainer.train_dataloader.sampler).__name__,
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
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
            vocab_size=32,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=16,
            num_labels=2,
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
    if config.get("ray_data"):  # this worker's shard of the trainer's Ray Dataset, in batches
        train_dataset = get_dataset_shard("train").iter_torch_batches(batch_size=4)
    else:
        train_dataset = TokenData()
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=train_dataset, callbacks=[RayTrainReportCallback()]
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


# -- FSDP (torch's fully_shard) -----------------------------------------------------------------


def mlp() -> torch.nn.Module:
    """A two-layer MLP, the same initial weights on every rank (seeded)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def sharded_loop(config: dict) -> None:
    """The same training under ``config["strategy"]``: "ddp", "fsdp" (``prepare_model``) or
    "fully_shard" (the user's own ``fully_shard`` calls and a sharded DCP checkpoint).

    Each rank takes its half of every global batch, so the three compute the same thing. Every
    epoch reports the mean global-batch loss and a checkpoint: DDP and "fsdp" save the full state
    dict from rank 0 (``model.pt``); "fully_shard" saves with ``torch.distributed.checkpoint``,
    every rank its own shard files, merged by the report into one folder, and resumes from it.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
        set_state_dict,
    )
    from torch.distributed.fsdp import fully_shard

    from trainers.torch import prepare_model

    strategy = config["strategy"]
    rank, size = get_context().get_world_rank(), get_context().get_world_size()
    model = mlp()
    if strategy == "fully_shard":
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    else:
        model = prepare_model(model, parallel_strategy=strategy)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    start = 0
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        assert strategy == "fully_shard", "only the fully_shard run resumes in these tests"
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        with checkpoint.as_directory() as folder:
            dcp.load(state, checkpoint_id=folder)
            with open(os.path.join(folder, "epoch.txt")) as f:
                start = int(f.read()) + 1
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    x, y = regression_data()
    for epoch in range(start, config["epochs"]):
        losses = []
        for begin in range(0, NUM_ROWS, GLOBAL_BATCH):
            xb, yb = x[begin : begin + GLOBAL_BATCH][rank::size], y[begin : begin + GLOBAL_BATCH][rank::size]
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        epoch_loss = torch.stack(losses).mean()
        dist.all_reduce(epoch_loss, op=dist.ReduceOp.AVG)
        metrics = {"epoch": epoch, "loss": epoch_loss.item()}

        with tempfile.TemporaryDirectory() as folder:
            if strategy == "fully_shard":
                model_state, optim_state = get_state_dict(model, optimizer)
                dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder)
                if rank == 0:
                    with open(os.path.join(folder, "epoch.txt"), "w") as f:
                        f.write(str(epoch))
            else:
                # Collective under FSDP: every rank joins, rank 0 receives the whole model.
                full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
                if rank == 0:
                    torch.save(full, os.path.join(folder, "model.pt"))
            report(metrics, checkpoint=Checkpoint.from_directory(folder) if os.listdir(folder) else None)


def load_sharded_checkpoint(folder: str) -> dict[str, torch.Tensor]:
    """A DCP checkpoint of ``sharded_loop`` as a plain state dict, in one process, without FSDP."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = os.path.join(tempfile.mkdtemp(), "full.pt")
    dcp_to_torch_save(folder, target)
    return torch.load(target)["model"]
