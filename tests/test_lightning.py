"""PyTorch Lightning under TorchTrainer on 2 CPU workers: per-epoch reports and a loadable checkpoint."""

from __future__ import annotations

import os

import pytest
import torch

import integration_loops
from trainers import RunConfig, ScalingConfig
from trainers.torch import TorchTrainer

EPOCHS = 3


def fit(tmp_path, epochs):
    return TorchTrainer(
        integration_loops.lightning_loop,
        train_loop_config={"epochs": epochs},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="lightning", storage_path=str(tmp_path)),
    ).fit()


@pytest.mark.usefixtures("ray_local")
def test_lightning_module_trains_reports_every_epoch_and_checkpoint_loads_and_resumes(tmp_path):
    from trainers.lightning import RayTrainReportCallback

    result = fit(tmp_path, EPOCHS)

    assert result.error is None
    assert result.return_value["world_size"] == 2 and result.return_value["global_rank"] == 0
    assert result.return_value["sampler"] == "DistributedSampler"
    frame = result.metrics_dataframe
    assert list(frame["epoch"]) == list(range(EPOCHS))
    # 64 rows, 8 per batch, split over 2 ranks: 4 optimizer steps per epoch.
    assert list(frame["step"]) == [4 * (epoch + 1) for epoch in range(EPOCHS)]
    losses = list(frame["train_loss"])
    assert losses[-1] < losses[0]

    with result.checkpoint.as_directory() as folder:
        path = os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME)
        restored = integration_loops.lightning_regressor().load_from_checkpoint(path)
        saved = torch.load(path, weights_only=False)
    assert saved["epoch"] == EPOCHS - 1 and saved["global_step"] == 4 * EPOCHS
    for name, value in result.return_value["state"].items():
        torch.testing.assert_close(restored.state_dict()[name], value)

    # The same run again, one epoch longer: Lightning resumes from the reported checkpoint.
    resumed = fit(tmp_path, EPOCHS + 1)
    assert list(resumed.metrics_dataframe["epoch"]) == list(range(EPOCHS + 1))
    assert resumed.metrics_dataframe["step"].iloc[-1] == 4 * (EPOCHS + 1)
