"""transformers.Trainer under TorchTrainer on 2 CPU workers: reports, checkpoints, and resume."""

from __future__ import annotations

import os

import pytest

import integration_loops
from trainers import RunConfig, ScalingConfig
from trainers.torch import TorchTrainer

# Nothing may reach the Hugging Face Hub: the model is built from a config.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def fit(tmp_path, max_steps, *, name="transformers", config=None, datasets=None):
    return TorchTrainer(
        integration_loops.transformers_loop,
        train_loop_config={"max_steps": max_steps, "output_dir": str(tmp_path / name), **(config or {})},
        scaling_config=ScalingConfig(num_workers=2),
        datasets=datasets,
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path / "results"),
            worker_runtime_env={"env_vars": OFFLINE},
        ),
    ).fit()


@pytest.mark.usefixtures("ray_local")
def test_transformers_trainer_reports_checkpoints_and_resumes(tmp_path, monkeypatch):
    from trainers.huggingface.transformers import RayTrainReportCallback

    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)

    first = fit(tmp_path, max_steps=4)
    assert first.error is None
    assert first.return_value == {"start_step": 0, "global_step": 4, "world_size": 2, "process_index": 0}
    # A report per save (every 2 steps), carrying what the Trainer logged.
    assert list(first.metrics_dataframe["step"]) == [2, 4]
    assert first.metrics_dataframe["loss"].notna().all()
    with first.checkpoint.as_directory() as folder:
        saved = os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME)
        files = set(os.listdir(saved))
    assert {"trainer_state.json", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"} <= files
    assert "model.safetensors" in files

    second = fit(tmp_path, max_steps=8)
    assert second.error is None
    assert second.return_value["start_step"] == 4 and second.return_value["global_step"] == 8
    # The second run continued at step 4: its reports are steps 6 and 8, after the first run's.
    assert list(second.metrics_dataframe["step"]) == [2, 4, 6, 8]


@pytest.mark.usefixtures("ray_local")
def test_transformers_trainer_takes_a_ray_data_shard_through_prepare_trainer(tmp_path, monkeypatch):
    import numpy as np
    import ray

    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    data = integration_loops.TokenData()
    rows = [
        {"input_ids": ids.numpy(), "labels": int(label)} for ids, label in zip(data.input_ids, data.labels, strict=True)
    ]
    result = fit(
        tmp_path, max_steps=4, name="ray-data", config={"ray_data": True}, datasets={"train": ray.data.from_items(rows)}
    )

    assert result.error is None
    assert result.return_value["global_step"] == 4 and result.return_value["world_size"] == 2
    assert list(result.metrics_dataframe["step"]) == [2, 4]
    assert np.isfinite(result.metrics_dataframe["loss"]).all()
