"""Result as Ray Train 2.60 has it: its constructor, ``path`` inside ``filesystem``, ``config``,
and the exception types Ray's users catch (RuntimeError), keeping flowtrain's own."""

from __future__ import annotations

import os
import pathlib

import pyarrow.fs as pafs
import pytest

import trainers as train
from faulty_fs import RecordingHandler
from storage import Checkpoint, StorageError
from trainers import CheckpointConfig, DataParallelTrainer, Result, RunConfig, ScalingConfig


def test_result_takes_rays_constructor_parameters_and_repr():
    fs = pafs.LocalFileSystem()
    result = Result(
        {"iter": 0, "metric": 1.0}, Checkpoint("/bucket/path/ckpt0"), None, "/bucket/path", None, None, fs, 7
    )
    assert result.filesystem is fs and result.return_value == 7
    text = repr(result)
    assert "Checkpoint(filesystem=local, path=/bucket/path/ckpt0)" in text
    assert "metrics={'iter': 0, 'metric': 1.0}" in text
    assert Result(metrics={}, checkpoint=None, error=None, path="/p").filesystem.type_name == "local"
    with pytest.raises(DeprecationWarning, match="Result.config"):
        _ = result.config


def test_fit_leaves_pandas_unimported_until_metrics_dataframe_is_read(tmp_path):
    """Importing pandas costs a process ~0.3 s and 30 MB: fit() pays it only for a caller that
    reads the frame (issue 36)."""
    import subprocess
    import sys

    code = f"""
import sys, trainers as train
from trainers import DataParallelTrainer, RunConfig, ScalingConfig
def loop():
    train.report({{"loss": {{"train": 0.5}}}})
result = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=0),
                             run_config=RunConfig(name="lazy", storage_path={str(tmp_path)!r})).fit()
print("pandas" in sys.modules, result.metrics_dataframe.to_dict("records"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False [{'loss/train': 0.5}]"


def test_get_best_checkpoint_errors_are_runtime_errors_and_value_errors():
    result = Result(
        metrics={},
        checkpoint=None,
        error=None,
        path="/bucket/path",
        best_checkpoints=[(Checkpoint(f"/bucket/path/ckpt{i}"), {"metric": float(i)}) for i in range(3)],
    )
    assert result.get_best_checkpoint(metric="metric", mode="max").path == "/bucket/path/ckpt2"
    for caught in (RuntimeError, ValueError):
        with pytest.raises(caught, match="no kept checkpoint reported it"):
            result.get_best_checkpoint(metric="invalid_metric", mode="max")
    empty = Result(metrics={}, checkpoint=None, error=None, path="/bucket/path")
    with pytest.raises(RuntimeError, match="kept no checkpoint"):
        empty.get_best_checkpoint("metric", "max")


@pytest.mark.parametrize("as_pathlike", [False, True])
def test_from_path_on_a_folder_without_a_run_raises_a_runtime_error(tmp_path, as_pathlike):
    missing = tmp_path / "nonexistent_experiment"
    with pytest.raises(RuntimeError, match="doesn't exist") as caught:
        Result.from_path(missing if as_pathlike else str(missing))
    assert isinstance(caught.value, StorageError) and isinstance(caught.value, OSError)
    (tmp_path / "existing").mkdir()
    with pytest.raises(RuntimeError, match="has no run.json"):
        Result.from_path(tmp_path / "existing" if as_pathlike else str(tmp_path / "existing"))


def one_checkpoint(config):
    folder = os.path.join(config["scratch"], "c")
    os.makedirs(folder, exist_ok=True)
    pathlib.Path(folder, "model.txt").write_text("w")
    train.report({"loss": 1.0}, checkpoint=Checkpoint.from_directory(folder))


def test_path_is_inside_the_filesystem_for_custom_storage_and_absolute_locally(tmp_path):
    custom = pafs.PyFileSystem(RecordingHandler())

    def fit(name, **storage):
        return DataParallelTrainer(
            one_checkpoint,
            train_loop_config={"scratch": str(tmp_path / "scratch")},
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(name=name, **storage),
        ).fit()

    result = fit("remote", storage_path=str(tmp_path / "bucket"), storage_filesystem=custom)
    assert result.path == f"{tmp_path}/bucket/remote" and "://" not in result.path
    assert result.filesystem is custom and result.uri.endswith(f"faulty://{str(tmp_path).lstrip('/')}/bucket/remote")
    reopened = Result.from_path(result.path, storage_filesystem=result.filesystem)
    assert reopened.checkpoint == result.checkpoint and reopened.metrics == {"loss": 1.0}

    local = fit("local", storage_path=str(tmp_path / "disk"))
    assert local.path == str(tmp_path / "disk" / "local") and local.uri == local.path
    assert Result.from_path(local.path + "/").checkpoint == local.checkpoint


def checkpoints_with_losses(config):
    for loss in config["losses"]:
        train.report({"loss": loss}, checkpoint=Checkpoint.from_directory(config["scratch"]))


@pytest.mark.parametrize(
    "score, losses_in_order",
    [
        pytest.param(None, [0.5, 0.2, 0.9, 0.2], id="no-score: report order"),
        # By score, worst first and ties in report order, as Ray inserts them: the best is last.
        pytest.param("loss", [0.9, 0.5, 0.2, 0.2], id="score: the best last"),
    ],
)
def test_best_checkpoints_are_listed_as_ray_lists_them_the_best_last(tmp_path, score, losses_in_order):
    (tmp_path / "scratch").mkdir()
    result = DataParallelTrainer(
        checkpoints_with_losses,
        train_loop_config={"losses": [0.5, 0.2, 0.9, 0.2], "scratch": str(tmp_path / "scratch")},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(
            name="order",
            storage_path=str(tmp_path),
            checkpoint_config=CheckpointConfig(checkpoint_score_attribute=score, checkpoint_score_order="min"),
        ),
    ).fit()
    for listed in (result.best_checkpoints, Result.from_path(result.path).best_checkpoints):
        assert [m["loss"] for _, m in listed] == losses_in_order
    if score is None:
        assert [os.path.basename(c.path) for c, _ in result.best_checkpoints] == [
            f"checkpoint_00000{i}" for i in range(4)
        ]
    else:  # of the two 0.2 losses the later report is listed last
        assert os.path.basename(result.best_checkpoints[-1][0].path) == "checkpoint_000003"


def test_errors_ray_users_match_on_start_with_rays_words(tmp_path):
    result = Result(
        metrics={}, checkpoint=None, error=None, path="/p", best_checkpoints=[(Checkpoint("/p/c"), {"metric": 1.0})]
    )
    with pytest.raises(RuntimeError) as caught:
        result.get_best_checkpoint(metric="invalid_metric", mode="max")
    assert str(caught.value).startswith("Invalid metric name invalid_metric! ")
    with pytest.raises(TypeError) as caught:
        train.DataConfig(datasets_to_split="hello")
    assert str(caught.value).startswith("`datasets_to_split` should be ") and "'hello'" in str(caught.value)
    with pytest.raises(RuntimeError) as caught:
        Result.from_path(str(tmp_path / "nonexistent_experiment"))
    assert str(caught.value).startswith(f"Experiment folder {tmp_path / 'nonexistent_experiment'} doesn't exist")
