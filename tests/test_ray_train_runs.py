"""Runs carried over from ray.train: a run folder ray.train 2.60 wrote is continued by ``fit()``
and read by ``Result.from_path``.

One real ray.train fit (tests/ray_train_user_script.py, 2 workers, a checkpoint per epoch) is
shared by the module; an untouched copy of its folder is what ``from_path`` reads.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil

import pyarrow.fs as pafs
import pytest
import torch

from faulty_s3 import moto_s3
from storage import RayRunFormatError, RunStorage, StorageError
from storage.ray_run_format import RAY_SNAPSHOT
from test_ray_train_compat import SCRIPT, switch_imports
from trainers import Result

RAY_EPOCHS = 3


def files_of(folder: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def epoch_in(checkpoint) -> int:
    with checkpoint.as_directory() as folder:
        return torch.load(os.path.join(folder, "model.pt"))["epoch"]


@pytest.fixture(scope="module")
def ray_run(_ray_session, tmp_path_factory):
    """The Result of a ray.train fit of 3 epochs keeping every checkpoint, and a copy of its folder."""
    import ray_train_user_script  # its own imports are ray.train's

    root = tmp_path_factory.mktemp("ray-train-run")
    result = ray_train_user_script.main(str(root / "results"), epochs=RAY_EPOCHS, num_to_keep=None)
    assert len(result.best_checkpoints) == RAY_EPOCHS
    pristine = root / "pristine" / pathlib.Path(result.path).name
    shutil.copytree(result.path, pristine)
    return result, pristine


def by_epoch(best_checkpoints) -> dict[int, tuple[str, dict]]:
    """{epoch: (checkpoint folder name, metrics)} of a Result's best_checkpoints."""
    return {metrics["epoch"]: (os.path.basename(c.path), metrics) for c, metrics in best_checkpoints}


def test_fit_with_switched_imports_continues_the_ray_train_run(ray_run, ray_local, tmp_path):
    ray_result, _ = ray_run
    folder = pathlib.Path(ray_result.path)
    ray_snapshot = (folder / RAY_SNAPSHOT).read_bytes()
    ray_checkpoints = by_epoch(ray_result.best_checkpoints)

    module_path = tmp_path / "switched_user_script.py"
    module_path.write_text(switch_imports(SCRIPT.read_text()))
    spec = importlib.util.spec_from_file_location("switched_user_script", module_path)
    switched = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(switched)
    # Same storage_path and name; only num_to_keep changes, so retention has Ray's checkpoints to judge.
    result = switched.main(str(folder.parent), epochs=6, num_to_keep=4)

    frame = result.metrics_dataframe
    assert list(frame["epoch"]) == list(range(6))  # the loop went on from Ray's epoch 2: nothing twice
    carried = frame.iloc[:RAY_EPOCHS].to_dict("records")
    assert carried == [ray_checkpoints[epoch][1] for epoch in range(RAY_EPOCHS)]

    losses = dict(zip(frame["epoch"], frame["loss"], strict=True))
    kept = set(sorted(losses, key=losses.get)[:4]) | {5}  # the 4 best by loss, plus the latest
    assert set(by_epoch(result.best_checkpoints)) == kept
    for epoch, (name, _) in ray_checkpoints.items():  # Ray's folders, adopted where they are
        assert (folder / name).is_dir() == (epoch in kept)
        if epoch in kept:
            assert by_epoch(result.best_checkpoints)[epoch][0] == name
    assert any(epoch < RAY_EPOCHS for epoch in kept)  # 4 of 6 kept: at least one is Ray's
    assert epoch_in(result.checkpoint) == 5
    assert (folder / RAY_SNAPSHOT).read_bytes() == ray_snapshot
    assert list(Result.from_path(result.path).metrics_dataframe["epoch"]) == list(range(6))


def test_from_path_reads_a_ray_train_run_folder(ray_run):
    ray_result, pristine = ray_run
    before = files_of(pristine)

    result = Result.from_path(pristine)

    assert result.path == str(pristine)
    assert result.metrics == ray_result.metrics
    assert os.path.basename(result.checkpoint.path) == os.path.basename(ray_result.checkpoint.path)
    assert epoch_in(result.checkpoint) == RAY_EPOCHS - 1
    # Ray's order (its CheckpointConfig ranked by loss, best last), its folders and metrics.
    assert [(os.path.basename(c.path), m) for c, m in result.best_checkpoints] == [
        (os.path.basename(c.path), m) for c, m in ray_result.best_checkpoints
    ]
    assert all(pathlib.Path(c.path).parent == pristine for c, _ in result.best_checkpoints)
    assert list(result.metrics_dataframe["epoch"]) == list(range(RAY_EPOCHS))  # report order
    best_loss = min(m["loss"] for _, m in ray_result.best_checkpoints)
    assert result.get_best_checkpoint("loss", "min").path == next(
        c.path for c, m in result.best_checkpoints if m["loss"] == best_loss
    )
    assert files_of(pristine) == before  # read only


def test_ray_train_checkpoints_count_as_committed_on_object_stores(ray_run):
    _, pristine = ray_run
    names = [e["checkpoint_dir_name"] for e in json.loads((pristine / RAY_SNAPSHOT).read_text())["checkpoint_results"]]
    with moto_s3() as s3:  # the bucket is flowtrain-test
        pafs.copy_files(
            str(pristine),
            "flowtrain-test/runs/ray-train-user",
            source_filesystem=pafs.LocalFileSystem(),
            destination_filesystem=s3,
        )
        storage = RunStorage("s3://flowtrain-test/runs", "ray-train-user", filesystem=s3)
        storage.open("me")
        storage.close()
        assert [os.path.basename(c.path) for c, _ in storage.best_checkpoints][::-1] == sorted(names)
        assert epoch_in(storage.latest_checkpoint) == RAY_EPOCHS - 1
        with s3.open_input_stream(f"flowtrain-test/runs/ray-train-user/{RAY_SNAPSHOT}") as f:
            assert f.read() == (pristine / RAY_SNAPSHOT).read_bytes()


@pytest.mark.parametrize(
    "snapshot, names",
    [
        (
            {
                "ray_version": "3.1.0",
                "checkpoint_results": [{"version": 1, "checkpoint_dir_name": "checkpoint_a", "metrics": {}}],
                "checkpoint_report_indices": [0],
            },
            ["Ray 3.1.0", "checkpoint record version 1"],
        ),
        ({"checkpoints": []}, ["an unknown Ray version", "'ray_version'"]),
    ],
)
def test_a_ray_snapshot_in_another_format_is_refused_naming_the_version(tmp_path, snapshot, names):
    folder = tmp_path / "ray-run"
    (folder / "checkpoint_a").mkdir(parents=True)
    (folder / RAY_SNAPSHOT).write_text(json.dumps(snapshot))
    before = files_of(folder)

    with pytest.raises(RayRunFormatError) as caught:
        Result.from_path(folder)
    message = str(caught.value)
    assert all(name in message for name in names) and "Ray 2.60.0" in message, message
    assert isinstance(caught.value, StorageError) and isinstance(caught.value, RuntimeError)

    with pytest.raises(RayRunFormatError):  # what fit() does first: the run is not started over
        RunStorage(str(tmp_path), "ray-run").open("me")
    assert files_of(folder) == before
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint_a", RAY_SNAPSHOT]
