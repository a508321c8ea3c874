"""Training loops the pipeline ships with, named by import path (``tasks.loops:tabular_mlp_loop``).

These run on the training workers, so this module imports no Prefect: only torch and ``trainers``.
"""

from __future__ import annotations

import functools
import os
import tempfile
from typing import Any

import trainers
from trainers import Checkpoint


def tabular_mlp_loop(config: dict[str, Any]) -> None:
    """Train an MLP classifier on the ``train`` dataset's numeric columns, one report per epoch.

    ``config``: ``label_column`` (required; integer classes 0..num_classes-1), ``feature_columns``
    (default: every other column), ``num_classes`` (2), ``epochs`` (5), ``lr`` (0.01),
    ``batch_size`` (64 per worker), ``hidden`` (32). With a ``valid`` dataset each report also has
    ``valid_loss``, ``valid_accuracy`` and ``valid_rows``, over every row of it: ``valid`` must
    reach every worker whole (``DataConfig(datasets_to_split=["train"])``, as the pipeline gives
    it), and rank 0 scores it with the weights its checkpoint saves. Every epoch is checkpointed;
    a restart or a rerun of the same run resumes at the next epoch. ``validate`` (False): ask the
    trainer's ValidationConfig to score every checkpoint (e.g. with ``tabular_mlp_validation``).
    ``metric_notes`` says what each reported figure is (the pipeline's metric chart shows it).
    """
    import torch

    from trainers.torch import prepare_model

    label = config["label_column"]
    train_shard = trainers.get_dataset_shard("train")
    features = list(config.get("feature_columns") or [c for c in train_shard.schema().names if c != label])
    num_classes = int(config.get("num_classes", 2))
    batch_size = int(config.get("batch_size", 64))

    torch.manual_seed(int(config.get("seed", 0)))
    model = _mlp(len(features), int(config.get("hidden", 32)), num_classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=float(config.get("lr", 0.01)))
    start_epoch = 0
    if checkpoint := trainers.get_checkpoint():
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "model.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
    model = prepare_model(model)
    inner = getattr(model, "module", model)  # without DDP's wrapper: what a checkpoint saves
    valid_shard = optional_shard("valid")
    rank = trainers.get_context().get_world_rank()

    def batches(shard):
        for batch in shard.iter_torch_batches(batch_size=batch_size):
            x = torch.stack([batch[c].to(torch.float32) for c in features], dim=1)
            yield x, batch[label].to(torch.long)

    for epoch in range(start_epoch, int(config.get("epochs", 5))):
        model.train()
        totals = torch.zeros(3)  # loss sum, correct, rows
        for x, y in batches(train_shard):
            optimizer.zero_grad()
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            loss.backward()
            optimizer.step()
            totals += torch.tensor([loss.item() * len(y), (logits.argmax(1) == y).sum().item(), len(y)])
        metrics = {"epoch": epoch, **_summed("train", totals)}
        if valid_shard is not None:
            model.eval()
            totals = torch.zeros(3)  # the other ranks add nothing: rank 0 alone scores the whole set
            with torch.no_grad():
                # The unwrapped model: no collective per batch, and rank 0's own standardizing
                # statistics, the ones its checkpoint saves.
                for x, y in batches(valid_shard) if rank == 0 else ():
                    logits = inner(x)
                    loss = torch.nn.functional.cross_entropy(logits, y, reduction="sum")
                    totals += torch.tensor([loss.item(), (logits.argmax(1) == y).sum().item(), len(y)])
            metrics.update(_summed("valid", totals))
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if rank == 0:
                state = {
                    "model": inner.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch,
                    "features": features,
                }
                torch.save(state, os.path.join(folder, "model.pt"))
                checkpoint = Checkpoint.from_directory(folder)
            trainers.report(metrics, checkpoint=checkpoint, validation=bool(config.get("validate")))


#: What each figure ``tabular_mlp_loop`` reports is (shown under the pipeline's metric chart).
tabular_mlp_loop.metric_notes = {  # type: ignore[attr-defined]
    "epoch": "counted from 0, as the loop counts them",
    "train_loss": "mean over the epoch's batches, each as the weights then were: it lags the epoch's end",
    "train_accuracy": "over the epoch's batches, each as the weights then were",
    "valid_loss": "the epoch's final weights on every validation row",
    "valid_accuracy": "the epoch's final weights on every validation row",
}


def _mlp(num_features: int, hidden: int, num_classes: int) -> Any:
    import torch

    return torch.nn.Sequential(
        _standardize_class()(num_features),  # tabular columns come in wildly different scales
        torch.nn.Linear(num_features, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, num_classes),
    )


@functools.cache
def _standardize_class() -> Any:
    """The model's first layer (made on first use: this module imports no torch until a loop runs)."""
    import torch

    class Standardize(torch.nn.Module):
        """Scales each column by the mean and variance of every row trained on so far, in training
        and in evaluation alike (its buffers, so a checkpoint keeps them). Not BatchNorm: that
        trains on each batch's own statistics and scores with running ones, which with a few
        batches an epoch had not settled when the first epoch was scored (every validation row one
        class), and made the training figures noisier than the validation ones."""

        rows: Any  # buffers (register_buffer), typed for mypy
        mean: Any
        squares: Any

        def __init__(self, num_features: int) -> None:
            super().__init__()
            self.register_buffer("rows", torch.zeros(()))
            self.register_buffer("mean", torch.zeros(num_features))
            self.register_buffer("squares", torch.zeros(num_features))  # squared deviations from the mean, summed

        def forward(self, x: Any) -> Any:
            if self.training:
                with torch.no_grad():  # Chan's update: this batch's rows join those seen before
                    rows, batch_mean = x.shape[0], x.mean(0)
                    total, delta = self.rows + rows, batch_mean - self.mean
                    self.squares += ((x - batch_mean) ** 2).sum(0) + delta**2 * self.rows * rows / total
                    self.mean += delta * rows / total
                    self.rows.copy_(total)
            return (x - self.mean) / (self.squares / self.rows.clamp(min=1)).sqrt().clamp(min=1e-6)

    return Standardize


def tabular_mlp_validation(checkpoint: Checkpoint, *, uri: str, label_column: str) -> dict[str, float]:
    """Score a ``tabular_mlp_loop`` checkpoint on a held-out file or folder (parquet, csv or json at
    ``uri``, local or a URI): ``holdout_loss`` and ``holdout_accuracy``. A ``trainers.ValidationConfig``
    function: it runs in a Ray task of its own while training goes on."""
    import pyarrow.dataset as pads
    import torch

    from storage.filesystem import absolute, resolve_filesystem

    with checkpoint.as_directory() as folder:
        state = torch.load(os.path.join(folder, "model.pt"))
    weights = state["model"]
    model = _mlp(len(state["features"]), weights["1.weight"].shape[0], weights["3.weight"].shape[0])
    model.load_state_dict(weights)
    model.eval()
    filesystem, path = resolve_filesystem(absolute(uri))
    kind = next((k for k in ("parquet", "csv", "json") if path.rstrip("/").endswith((f".{k}", f".{k}l"))), "parquet")
    table = pads.dataset(path, filesystem=filesystem, format=kind).to_table(columns=[*state["features"], label_column])
    x = torch.stack([torch.as_tensor(table[c].to_numpy(), dtype=torch.float32) for c in state["features"]], dim=1)
    y = torch.as_tensor(table[label_column].to_numpy(), dtype=torch.long)
    with torch.no_grad():
        logits = model(x)
    return {
        "holdout_loss": torch.nn.functional.cross_entropy(logits, y).item(),
        "holdout_accuracy": (logits.argmax(1) == y).float().mean().item(),
    }


def optional_shard(name: str) -> Any:
    """This worker's shard of the dataset ``name``, or None when the trainer was given no such dataset."""
    try:
        return trainers.get_dataset_shard(name)
    except KeyError:
        return None


def _summed(prefix: str, totals: Any) -> dict[str, float]:
    """Loss and accuracy over every worker's rows (an all-reduce when there are several)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(totals)
    loss_sum, correct, rows = totals.tolist()
    return {
        f"{prefix}_loss": loss_sum / max(rows, 1),
        f"{prefix}_accuracy": correct / max(rows, 1),
        f"{prefix}_rows": int(rows),
    }
