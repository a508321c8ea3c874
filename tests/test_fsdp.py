"""FSDP (torch's fully_shard) under TorchTrainer on 2 CPU workers over gloo: same losses as DDP,
checkpoints that reload (full state dict from rank 0, and sharded DCP with resume)."""

from __future__ import annotations

import os

import pytest
import torch

import integration_loops
from trainers import RunConfig, ScalingConfig
from trainers.torch import TorchTrainer

EPOCHS = 4
# Same seed, same data, same arithmetic up to the order of float32 reductions.
LOSS_TOLERANCE = dict(rtol=1e-5, atol=1e-6)

pytestmark = pytest.mark.usefixtures("ray_local")


def fit(tmp_path, strategy, *, epochs=EPOCHS, name=None):
    return TorchTrainer(
        integration_loops.sharded_loop,
        train_loop_config={"strategy": strategy, "epochs": epochs},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=name or strategy, storage_path=str(tmp_path)),
    ).fit()


def full_state(result):
    with result.checkpoint.as_directory() as folder:
        return torch.load(os.path.join(folder, "model.pt"))


def test_fsdp_reaches_the_ddp_losses_and_its_checkpoint_reloads(tmp_path):
    ddp, fsdp = fit(tmp_path, "ddp"), fit(tmp_path, "fsdp")

    ddp_losses, fsdp_losses = list(ddp.metrics_dataframe["loss"]), list(fsdp.metrics_dataframe["loss"])
    assert len(fsdp_losses) == EPOCHS and fsdp_losses[-1] < fsdp_losses[0]
    torch.testing.assert_close(torch.tensor(fsdp_losses), torch.tensor(ddp_losses), **LOSS_TOLERANCE)

    # The gathered FSDP weights load into the plain, unsharded model (strict) and equal DDP's.
    model = integration_loops.mlp()
    model.load_state_dict(full_state(fsdp))
    for name, value in full_state(ddp).items():
        torch.testing.assert_close(model.state_dict()[name], value, **LOSS_TOLERANCE)


def test_user_fully_shard_saves_sharded_checkpoints_and_resumes_to_the_same_losses(tmp_path):
    first = fit(tmp_path, "fully_shard", epochs=2, name="sharded")
    with first.checkpoint.as_directory() as folder:
        files = sorted(os.listdir(folder))
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "epoch.txt"]  # each rank's shard, merged

    resumed = fit(tmp_path, "fully_shard", epochs=EPOCHS, name="sharded")
    assert list(resumed.metrics_dataframe["epoch"]) == list(range(EPOCHS))  # epochs 2, 3 after 0, 1
    uninterrupted = fit(tmp_path, "ddp")
    torch.testing.assert_close(
        torch.tensor(list(resumed.metrics_dataframe["loss"])),
        torch.tensor(list(uninterrupted.metrics_dataframe["loss"])),
        **LOSS_TOLERANCE,
    )

    # The sharded checkpoint also reloads in one process, without FSDP.
    with resumed.checkpoint.as_directory() as folder:
        state = integration_loops.load_sharded_checkpoint(folder)
    model = integration_loops.mlp()
    model.load_state_dict(state)
    for name, value in full_state(uninterrupted).items():
        torch.testing.assert_close(model.state_dict()[name], value, **LOSS_TOLERANCE)
