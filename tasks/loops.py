"""Training loops the pipeline ships with, named by import path (``tasks.loops:tabular_mlp_loop``).

These run on the training workers, so this module imports no Prefect: only torch and ``trainers``.
"""

from __future__ import annotations

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
    ``valid_loss`` and ``valid_accuracy``. Every epoch is checkpointed; a restart or a rerun of the
    same run resumes at the next epoch.
    """
    import torch

    from trainers.torch import prepare_model

    label = config["label_column"]
    train_shard = trainers.get_dataset_shard("train")
    features = list(config.get("feature_columns") or [c for c in train_shard.schema().names if c != label])
    num_classes = int(config.get("num_classes", 2))
    batch_size = int(config.get("batch_size", 64))

    torch.manual_seed(int(config.get("seed", 0)))
    model = torch.nn.Sequential(
        torch.nn.BatchNorm1d(len(features), affine=False),  # tabular columns come in wildly different scales
        torch.nn.Linear(len(features), int(config.get("hidden", 32))),
        torch.nn.ReLU(),
        torch.nn.Linear(int(config.get("hidden", 32)), num_classes),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=float(config.get("lr", 0.01)))
    start_epoch = 0
    if checkpoint := trainers.get_checkpoint():
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "model.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
    model = prepare_model(model)
    valid_shard = _optional_shard("valid")

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
            totals = torch.zeros(3)
            with torch.no_grad():
                for x, y in batches(valid_shard):
                    logits = model(x)
                    loss = torch.nn.functional.cross_entropy(logits, y, reduction="sum")
                    totals += torch.tensor([loss.item(), (logits.argmax(1) == y).sum().item(), len(y)])
            metrics.update(_summed("valid", totals))
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if trainers.get_context().get_world_rank() == 0:
                inner = getattr(model, "module", model)
                state = {"model": inner.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "features": features}
                torch.save(state, os.path.join(folder, "model.pt"))
                checkpoint = Checkpoint.from_directory(folder)
            trainers.report(metrics, checkpoint=checkpoint)


def _optional_shard(name: str) -> Any:
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
    return {f"{prefix}_loss": loss_sum / max(rows, 1), f"{prefix}_accuracy": correct / max(rows, 1), f"{prefix}_rows": int(rows)}
