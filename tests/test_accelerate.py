"""Hugging Face Accelerate inside TorchTrainer on 2 CPU workers: `Accelerator()` joins the ready group."""

from __future__ import annotations

import pytest
import torch

import integration_loops
from trainers import RunConfig, ScalingConfig
from trainers.torch import TorchTrainer


def plain_torch_reference():
    """One process, whole batches: what 2-rank data parallelism with averaged gradients computes."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = integration_loops.regression_data()
    # Accelerate's sampler deals batch i of 8 rows to rank i % 2: a global step sees 16 rows.
    for start in range(0, integration_loops.NUM_ROWS, integration_loops.GLOBAL_BATCH):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[start : start + 16]), y[start : start + 16]).backward()
        optimizer.step()
    return model.weight.detach()


@pytest.mark.usefixtures("ray_local")
def test_accelerator_finds_the_process_group_and_averages_gradients(tmp_path):
    result = TorchTrainer(
        integration_loops.accelerate_loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="accelerate", storage_path=str(tmp_path)),
    ).fit()

    out = result.return_value
    assert out["distributed_type"] == "DistributedType.MULTI_CPU"
    assert (out["num_processes"], out["process_index"], out["device"]) == (2, 0, "cpu")
    assert out["reduced"] == 3.0  # (0 + 1) + (1 + 1)
    assert out["gathered"] == [1.0, 2.0]
    # 64 rows in batches of 8, dealt to 2 ranks: 4 steps each, gradients identical on both ranks.
    assert out["num_batches"] == 4 and len(result.metrics_dataframe) == 4
    for rank0_grad, rank1_grad in out["grads"]:
        torch.testing.assert_close(rank0_grad, rank1_grad, rtol=0, atol=0)
    torch.testing.assert_close(out["weight"], plain_torch_reference(), rtol=1e-5, atol=1e-6)


def test_accelerate_is_told_each_workers_own_gpu():
    from types import SimpleNamespace

    from trainers.torch.config import _accelerate_env

    def worker(rank, node, gpus):
        return SimpleNamespace(ranks=SimpleNamespace(world_rank=rank), metadata=SimpleNamespace(node_id=node, gpu_ids=gpus))

    # Node a: rank 0 got GPU 3, rank 1 GPU 1; both see "1,3", so rank 0's GPU is cuda:1, not cuda:LOCAL_RANK.
    workers = [worker(0, "a", ("3",)), worker(1, "a", ("1",)), worker(2, "b", ("0",))]
    assert _accelerate_env(workers, use_gpu=True) == {
        0: {"ACCELERATE_TORCH_DEVICE": "cuda:1"},
        1: {"ACCELERATE_TORCH_DEVICE": "cuda:0"},
        2: {"ACCELERATE_TORCH_DEVICE": "cuda:0"},
    }
    assert _accelerate_env(workers[:1], use_gpu=False) == {
        0: {"ACCELERATE_USE_CPU": "true", "ACCELERATE_TORCH_DEVICE": "cpu"}
    }
