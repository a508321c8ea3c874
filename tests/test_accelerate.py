"""Hugging Face Accelerate inside TorchTrainer on 2 CPU workers: `Accelerator()` joins the ready group."""

from __future__ import annotations

import os

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


def test_accelerate_is_told_each_workers_own_gpu(monkeypatch):
    from types import SimpleNamespace

    from trainers.context import StorageInfo, TrainContext, _set_context
    from trainers.torch.config import TorchConfig, _accelerate_env

    def worker(rank, node, gpus):
        return SimpleNamespace(
            ranks=SimpleNamespace(world_rank=rank), metadata=SimpleNamespace(node_id=node, gpu_ids=gpus)
        )

    assert _accelerate_env([worker(0, "a", ())], use_gpu=False) == {
        0: {"ACCELERATE_USE_CPU": "true", "ACCELERATE_TORCH_DEVICE": "cpu"}
    }
    assert _accelerate_env([worker(0, "a", ("3",))], use_gpu=True) == {}  # told in its training function

    # The trainer gave this worker the second GPU it sees (accelerator_ids index CUDA_VISIBLE_DEVICES):
    # Accelerate must use cuda:1, not cuda:LOCAL_RANK.
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "")  # restored after the test
    storage = StorageInfo("/tmp", "/tmp/run", "/tmp/run", None)
    for ids, device in (((), ""), ((1,), "cuda:1")):
        _set_context(TrainContext("run", 2, 0, 0, 2, 0, storage, accelerator_ids=ids))
        try:
            with TorchConfig().train_func_context():
                assert os.environ["ACCELERATE_TORCH_DEVICE"] == device
        finally:
            _set_context(None)
