"""Bad inputs fail early with an error naming the field, and never cost what is already stored.

Each test first stores a small finished run ("kept") next to where the bad input points, then
checks that its checkpoints and metrics are untouched after the failure.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
import threading

import pyarrow.fs as pafs
import pytest

from faulty_fs import RecordingHandler
from loops import resume_after_checkpoint
from run_history import recorded_reports
from trainers import (
    Checkpoint,
    CheckpointConfig,
    ControllerError,
    DataParallelTrainer,
    RunConfig,
    ScalingConfig,
    WorkerGroupError,
    report,
)


def epoch_loop(config: dict) -> None:
    """Reports one checkpointed epoch at a time and resumes after the checkpoint it is given."""
    start = resume_after_checkpoint("epoch.txt")
    for epoch in range(start, config["epochs"]):
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "epoch.txt"), "w") as f:
                f.write(str(epoch))
            metrics = {"epoch": epoch, "start": start}
            if epoch != config.get("drop_score_at"):  # else it lacks what the CheckpointConfig ranks by
                metrics["loss"] = 1.0 / (epoch + 1)
            report(metrics, checkpoint=Checkpoint.from_directory(folder))


def local_fit(storage_path, name, epochs, **kwargs):
    run_config = RunConfig(name=name, storage_path=str(storage_path), **kwargs.pop("run", {}))
    trainer = DataParallelTrainer(
        epoch_loop,
        train_loop_config={"epochs": epochs, **kwargs},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=run_config,
    )
    return trainer.fit()


def stored(run_dir) -> dict[str, str]:
    """Every file of a run folder and its content (the lease's claims aside), to compare before and after."""
    found = {}
    for folder, _, files in os.walk(run_dir):
        for name in files:
            if not name.startswith("lease."):
                path = os.path.join(folder, name)
                found[os.path.relpath(path, run_dir)] = pathlib.Path(path).read_text()
    return found


@pytest.fixture
def kept(tmp_path):
    """A finished run of 3 epochs stored at ``tmp_path/kept``; yields a check that it is intact."""
    local_fit(tmp_path, "kept", 3)
    before = stored(tmp_path / "kept")
    assert sum(name.endswith("epoch.txt") for name in before) == 3

    def still_intact() -> None:
        assert stored(tmp_path / "kept") == before

    return still_intact


def history(run_dir) -> list[int]:
    return [entry["metrics"]["epoch"] for entry in recorded_reports(run_dir)]


def test_unsupported_uri_scheme_fails_naming_storage_path_and_scheme(tmp_path, kept):
    with pytest.raises(ValueError, match=r"storage_path='foo://x'.*URI scheme 'foo' is not supported"):
        local_fit("foo://x", "kept", 3)
    kept()


def test_deleted_newest_checkpoint_resumes_from_the_newest_that_exists(tmp_path, kept):
    local_fit(tmp_path, "run", 3)
    missing = tmp_path / "run" / "checkpoint_000002"
    for name in os.listdir(missing):
        os.remove(missing / name)
    os.rmdir(missing)

    with pytest.warns(UserWarning, match=r"checkpoint .*checkpoint_000002 is named in .*run.json but is missing"):
        result = local_fit(tmp_path, "run", 4)

    # Epoch 2 is trained again from checkpoint 1; its lost report is not counted twice.
    assert history(tmp_path / "run") == [0, 1, 2, 3]
    assert list(result.metrics_dataframe["start"]) == [0, 0, 2, 2]
    for seq, epoch in [(0, 0), (1, 1)]:
        assert (tmp_path / "run" / f"checkpoint_{seq:06d}" / "epoch.txt").read_text() == str(epoch)
    kept()


def test_from_directory_of_a_missing_folder_raises_at_once(tmp_path, kept):
    with pytest.raises(ValueError, match=r"Checkpoint.from_directory\(path='.*nowhere'\): .* does not exist"):
        Checkpoint.from_directory(str(tmp_path / "nowhere"))
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ValueError, match=r"from_directory\(path=.*a-file.* is a file, not a folder"):
        Checkpoint.from_directory(tmp_path / "a-file")
    with pytest.raises(TypeError, match=r"from_directory\(path=3\)"):
        Checkpoint.from_directory(3)
    kept()


def test_report_lacking_the_score_attribute_leaves_no_staging(tmp_path, kept):
    score = {"run": {"checkpoint_config": CheckpointConfig(checkpoint_score_attribute="loss")}}
    with pytest.raises(WorkerGroupError, match="checkpoint_score_attribute='loss' is not among the reported metrics"):
        local_fit(tmp_path, "run", 4, drop_score_at=2, **score)
    run_dir = tmp_path / "run"
    assert not (run_dir / ".staging").exists()
    assert history(run_dir) == [0, 1]
    assert sorted(p for p in os.listdir(run_dir) if p.startswith("checkpoint_")) == [
        "checkpoint_000000",
        "checkpoint_000001",
    ]
    kept()


def fails_upload_of_report_2(op: str, path: str) -> bool:
    return "/.staging/" in path and "report_000002" in path and op in ("write", "create_dir", "copy_file")


def fails_commit_of_report_2(op: str, path: str) -> bool:
    return op in ("move", "create_dir") and path.endswith("checkpoint_000002")


@pytest.mark.parametrize("fail_when", [fails_upload_of_report_2, fails_commit_of_report_2])
def test_report_whose_checkpoint_fails_to_store_leaves_no_staging(tmp_path, kept, fail_when):
    handler = RecordingHandler(fail_when=fail_when)
    filesystem = pafs.PyFileSystem(handler)
    with pytest.raises((WorkerGroupError, ControllerError), match="injected failure"):
        local_fit(tmp_path, "run", 4, run={"storage_filesystem": filesystem})
    run_dir = tmp_path / "run"
    assert any("report_000002" in path or "checkpoint_000002" in path for _, path in handler.ops)
    assert not (run_dir / ".staging").exists()
    assert history(run_dir) == [0, 1]
    assert sorted(p for p in os.listdir(run_dir) if p.startswith("checkpoint_")) == [
        "checkpoint_000000",
        "checkpoint_000001",
    ]
    kept()


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("field", ["train_loop_config", "train_loop_per_worker"])
def test_unpicklable_input_fails_before_the_run_folder_exists(tmp_path, kept, field):
    lock = threading.Lock()

    def holds_a_lock(config):
        with lock:
            pass

    trainer = DataParallelTrainer(
        holds_a_lock if field == "train_loop_per_worker" else epoch_loop,
        train_loop_config={"epochs": 1, "lock": lock} if field == "train_loop_config" else {"epochs": 1},
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="run", storage_path=str(tmp_path)),
    )
    with pytest.raises(TypeError, match=rf"{field}=.* cannot be sent to the workers: it does not pickle"):
        trainer.fit()
    assert not (tmp_path / "run").exists()
    kept()


@pytest.mark.parametrize(
    ("given", "uri"),
    [("s3://bucket/runs", True), ("file:///tmp/runs", True), ("/tmp/runs", False), ("runs", False), ("~/runs", False)],
)
def test_one_rule_tells_a_uri_from_a_local_path(given, uri, tmp_path, monkeypatch):
    from storage.filesystem import absolute, is_uri

    monkeypatch.chdir(tmp_path)
    assert is_uri(given) is uri
    # A URI is kept as given; a local path is made absolute against the driver's working directory.
    expected = given if uri or given.startswith("/") else os.path.join(str(tmp_path), given)
    assert absolute(given) == expected
    if not uri:
        assert is_uri(pathlib.Path(given)) is False and absolute(pathlib.Path(given)) == expected
