"""The same runs on S3: a moto server on 127.0.0.1, reached through pyarrow's own S3FileSystem."""

from __future__ import annotations

import pathlib

import pyarrow.fs as pafs
import pytest

import loops
from faulty_s3 import moto_s3
from storage import RunStorage, load_run, upload_directory
from storage.protocol import ReportRound
from trainers import CheckpointConfig, Result, RunConfig, ScalingConfig
from trainers.torch import TorchTrainer


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as fs:  # the bucket is flowtrain-test
        yield fs


def listing(fs, path):
    return sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))


def test_run_storage_commits_with_marker_on_s3(s3, tmp_path):
    storage = RunStorage(
        "s3://flowtrain-test/unit", "run", filesystem=s3, checkpoint_config=CheckpointConfig(num_to_keep=1)
    )
    assert storage.run_uri == "s3://flowtrain-test/unit/run"
    storage.open("me")
    attempt = storage.start_attempt()
    for index in range(3):
        (tmp_path / f"src{index}").mkdir()
        (tmp_path / f"src{index}" / "model.txt").write_text(str(index))
        upload_directory(str(tmp_path / f"src{index}"), s3, storage.layout.staging_path(attempt, index))
        storage.record_report(ReportRound({"step": index}, report_index=index, attempt=attempt, staged=True))
    storage.finish()
    assert listing(s3, "flowtrain-test/unit/run") == [".metrics", "checkpoint_000002", "run.json", "run.json.prev"]
    assert [m["step"] for m in load_run("s3://flowtrain-test/unit/run", s3).metrics_history] == [0, 1, 2]
    assert listing(s3, "flowtrain-test/unit/run/checkpoint_000002") == [".committed", "model.txt"]
    view = load_run("s3://flowtrain-test/unit/run", s3)
    with view.latest_checkpoint.as_directory() as folder:
        assert pathlib.Path(f"{folder}/model.txt").read_text() == "2"


@pytest.mark.usefixtures("ray_local")
def test_training_run_on_s3_end_to_end_and_resume(s3):
    def fit(steps):
        return TorchTrainer(
            loops.checkpointing_loop,
            train_loop_config={"steps": steps, "every": 2},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name="e2e",
                storage_path="s3://flowtrain-test/runs",
                storage_filesystem=s3,
                checkpoint_config=CheckpointConfig(num_to_keep=2),
            ),
        ).fit()

    result = fit(5)
    assert result.path == "flowtrain-test/runs/e2e"  # inside result.filesystem, as in Ray
    assert result.uri == "s3://flowtrain-test/runs/e2e"
    assert list(result.metrics_dataframe["step"]) == [0, 1, 2, 3, 4]
    kept = listing(s3, "flowtrain-test/runs/e2e")
    assert [n for n in kept if n.startswith("checkpoint_")] == ["checkpoint_000001", "checkpoint_000002"]
    for checkpoint, _ in result.best_checkpoints:
        assert s3.get_file_info(checkpoint.path + "/step.txt").type == pafs.FileType.File

    resumed = fit(8)  # same name: continues after step 4 (the latest checkpoint)
    assert list(resumed.metrics_dataframe["step"]) == list(range(8))
    with resumed.checkpoint.as_directory() as folder:
        assert pathlib.Path(f"{folder}/step.txt").read_text() == "6"
    rebuilt = Result.from_path(resumed.path, storage_filesystem=s3)
    assert list(rebuilt.metrics_dataframe["step"]) == list(range(8))
