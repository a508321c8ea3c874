"""Lightning's sharding strategies on 2 CPU workers over gloo: RayDeepSpeedStrategy (ZeRO-3) and
RayFSDPStrategy train, report a checkpoint every epoch through RayTrainReportCallback, and a new
pl.Trainer resumes from get_checkpoint()."""

from __future__ import annotations

import os

import pytest
import torch

import deepspeed_loops
from trainers import RunConfig, ScalingConfig
from trainers.torch import TorchTrainer

EPOCHS = 2
# 64 rows in batches of 8, split over 2 ranks: 4 optimizer steps per epoch.
STEPS_PER_EPOCH = 4

pytestmark = pytest.mark.usefixtures("ray_local")


def fit(tmp_path, **config):
    return TorchTrainer(
        deepspeed_loops.lightning_sharded_loop,
        train_loop_config={"epochs": EPOCHS, **config},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=config["strategy"], storage_path=str(tmp_path)),
    ).fit()


def check_reports_and_resume(result):
    frame = result.metrics_dataframe
    # EPOCHS epochs, then the resumed trainer's one more: it continued, it did not start over.
    assert list(frame["epoch"]) == list(range(EPOCHS + 1))
    assert list(frame["step"]) == [STEPS_PER_EPOCH * (epoch + 1) for epoch in range(EPOCHS + 1)]
    losses = list(frame["train_loss"])
    assert losses[-1] < losses[0]
    assert result.return_value["global_step"] == STEPS_PER_EPOCH * (EPOCHS + 1)


def test_ray_deepspeed_strategy_zero3_trains_on_cpu_reports_each_ranks_shard_and_resumes(tmp_path):
    result = fit(tmp_path, strategy="deepspeed", stage=3)
    check_reports_and_resume(result)
    # Every rank's ZeRO-3 shards, merged into the one reported checkpoint folder.
    files = result.return_value["files"]
    for rank in (0, 1):
        assert f"checkpoint.ckpt/checkpoint/zero_pp_rank_{rank}_mp_rank_00_model_states.pt" in files
        assert f"checkpoint.ckpt/checkpoint/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" in files
    assert "checkpoint.ckpt/latest" in files


def test_ray_fsdp_strategy_trains_on_cpu_and_its_full_checkpoint_loads_without_fsdp(tmp_path):
    from trainers.lightning import RayTrainReportCallback

    result = fit(tmp_path, strategy="fsdp")
    check_reports_and_resume(result)
    assert result.return_value["files"] == ["checkpoint.ckpt"]  # the full state dict, from rank 0
    with result.checkpoint.as_directory() as folder:
        path = os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME)
        restored = deepspeed_loops.lightning_regressor().load_from_checkpoint(path)
    assert torch.isfinite(restored.net[0].weight).all()
    assert restored.net[0].weight.shape == (8, 4)  # whole, not a shard
