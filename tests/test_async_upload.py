"""report() with CheckpointUploadMode.ASYNC: returns before the upload, keeps report order."""

from __future__ import annotations

import dataclasses
import glob
import os
import pathlib
import tempfile
import threading

import pyarrow.fs as pafs
import pytest

import loops
from faulty_fs import RecordingHandler
from faulty_s3 import moto_s3
from storage import Checkpoint
from storage.layout import COMMIT_MARKER
from trainers import CheckpointConfig, CheckpointUploadMode, DataParallelTrainer, RunConfig, ScalingConfig
from trainers._internal.events.messages import ReportEvent
from worker_sessions import make_session


class GatedHandler(RecordingHandler):
    """Writes block until the test opens the gate, like a slow object store."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()

    def open_output_stream(self, path, metadata):
        assert self.gate.wait(30), "the test never opened the gate"
        return super().open_output_stream(path, metadata)


def write_checkpoint(folder, text):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "model.txt"), "w") as f:
        f.write(text)
    return Checkpoint.from_directory(folder)


def test_async_report_returns_before_the_upload_and_keeps_order(tmp_path):
    copies_before = set(glob.glob(os.path.join(tempfile.gettempdir(), "flowtrain-upload-*")))
    handler = GatedHandler()
    events = []
    session = make_session(tmp_path, pafs.PyFileSystem(handler), events)

    source = tmp_path / "user-folder"
    session.report({"step": 0}, write_checkpoint(str(source), "zero"), CheckpointUploadMode.ASYNC)
    # report() came back although the storage has not accepted a byte yet.
    assert events == [] and handler.gate.is_set() is False
    # The user may delete or reuse the folder at once: the upload works from a local copy.
    write_checkpoint(str(source), "changed after report")
    # (the next checkpoint's files; nothing of the first upload may touch them)

    uploader = threading.Thread(target=lambda: session.report({"step": 1}, None))
    uploader.start()  # a metrics-only report queues behind the upload
    uploader.join(0.5)
    assert uploader.is_alive() and events == []

    handler.gate.set()
    uploader.join(10)
    session.flush()
    assert [(e.index, e.metrics["step"], e.staged) for e in events if isinstance(e, ReportEvent)] == [
        (0, 0, True),
        (1, 1, False),
    ]
    staged = tmp_path / "run" / ".staging" / "attempt_0001" / "report_000000" / "model.txt"
    assert staged.read_text() == "zero"
    # The local copy is gone once uploaded.
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "flowtrain-upload-*"))) == copies_before
    # What the loop wrote after report() returned is still there: the default deletion of an ASYNC
    # report took the folder's files when report() was called, never after the upload.
    assert (source / "model.txt").read_text() == "changed after report"


def test_async_release_empties_the_folder_before_report_returns(tmp_path):
    handler = GatedHandler()
    events = []
    session = make_session(tmp_path, pafs.PyFileSystem(handler), events)
    source = tmp_path / "user-folder"
    write_checkpoint(str(source), "zero")
    os.makedirs(source / "shards")
    (source / "shards" / "part0.bin").write_bytes(b"0" * 10)

    session.report({"step": 0}, Checkpoint.from_directory(str(source)), CheckpointUploadMode.ASYNC)
    assert handler.gate.is_set() is False  # nothing uploaded yet, and yet:
    assert source.is_dir() and os.listdir(source) == []  # the folder stays, for the next checkpoint
    handler.gate.set()
    session.flush()
    staged = tmp_path / "run" / ".staging" / "attempt_0001" / "report_000000"
    assert (staged / "model.txt").read_text() == "zero" and (staged / "shards" / "part0.bin").read_bytes() == b"0" * 10


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as fs:  # the bucket is flowtrain-test
        yield fs


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("storage", ["local", "s3"])
def test_one_folder_reused_for_async_checkpoints_commits_each_epoch_whole(tmp_path, storage, request):
    """Issue 34.1: with the default deletion, an upload that finished while the loop was writing
    the next epoch into the same folder deleted those files (a FileNotFoundError, or a checkpoint
    committed empty)."""
    epochs = 10
    if storage == "s3":
        filesystem = request.getfixturevalue("s3")
        run_config = RunConfig(
            name=f"reuse-{tmp_path.name}", storage_path="s3://flowtrain-test/reuse", storage_filesystem=filesystem
        )
    else:
        filesystem = pafs.LocalFileSystem()
        run_config = RunConfig(name="reuse", storage_path=str(tmp_path / "runs"))
    run_config = dataclasses.replace(run_config, checkpoint_config=CheckpointConfig(num_to_keep=None))
    result = DataParallelTrainer(
        loops.reused_folder_async_loop,
        train_loop_config={"epochs": epochs, "scratch": str(tmp_path / "scratch")},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config,
    ).fit()
    assert result.error is None
    assert list(result.metrics_dataframe["epoch"]) == list(range(epochs))
    kept = sorted(result.best_checkpoints, key=lambda pair: pair[1]["epoch"])
    assert [metrics["epoch"] for _, metrics in kept] == list(range(epochs))
    for checkpoint, metrics in kept:
        epoch = metrics["epoch"]
        with checkpoint.as_directory() as folder:
            files = sorted(n for n in os.listdir(folder) if n != COMMIT_MARKER)
            assert files == sorted(
                f"{kind}_rank{rank}.txt" for rank in (0, 1) for kind in ("weights", f"epoch_{epoch}")
            ), f"epoch {epoch}: {files}"
            for name in files:
                assert pathlib.Path(folder, name).read_text() == str(epoch)


def test_failed_async_upload_surfaces_in_the_loop(tmp_path):
    handler = RecordingHandler(fail_when=lambda op, path: op == "write" and path.endswith("model.txt"))
    events = []
    session = make_session(tmp_path, pafs.PyFileSystem(handler), events)
    session.report({"step": 0}, write_checkpoint(str(tmp_path / "src"), "x"), CheckpointUploadMode.ASYNC)
    with pytest.raises(OSError, match="injected failure"):
        session.flush()
    assert events == []


def test_unknown_upload_mode_is_named(tmp_path):
    session = make_session(tmp_path, pafs.LocalFileSystem(), [])
    with pytest.raises(
        ValueError, match=r"checkpoint_upload_mode='async'\): must be CheckpointUploadMode.SYNC or ASYNC"
    ):
        session.report({"step": 0}, None, "async")


def test_a_loop_that_raises_after_an_async_report_sends_the_report_first(tmp_path):
    """The round a rank reported before it raised must reach the controller before its failure:
    the failure waits for the background upload of that report."""
    import trainers
    from trainers._internal.events.messages import FailedEvent
    from trainers._internal.session.train_thread import run_training_function

    handler = GatedHandler()
    events = []
    session = make_session(tmp_path, pafs.PyFileSystem(handler), events)
    raised = threading.Event()

    def loop():
        checkpoint = write_checkpoint(str(tmp_path / "local"), "last round")
        trainers.report({"step": 0}, checkpoint=checkpoint, checkpoint_upload_mode=CheckpointUploadMode.ASYNC)
        raised.set()
        raise RuntimeError("fails right after its report")

    thread = threading.Thread(target=run_training_function, args=(loop, None, False, session, events.append))
    thread.start()
    assert raised.wait(30)
    thread.join(timeout=0.5)  # long enough for a failure sent without waiting to show up
    assert not any(isinstance(e, FailedEvent) for e in events), "the failure overtook the report still uploading"
    handler.gate.set()
    thread.join(30)
    assert [type(e).__name__ for e in events] == ["ReportEvent", "FailedEvent"]


class LosesAFile(RecordingHandler):
    """A store that acknowledges every write but keeps no copy of ``lost``, as a broken gateway might."""

    def __init__(self, lost):
        super().__init__()
        self.lost = lost

    def open_output_stream(self, path, metadata):
        if path.endswith(self.lost):
            return pafs.LocalFileSystem().open_output_stream(os.devnull)
        return super().open_output_stream(path, metadata)


@pytest.mark.parametrize("mode", [CheckpointUploadMode.SYNC, CheckpointUploadMode.ASYNC])
def test_an_upload_missing_a_file_is_not_reported_as_staged(tmp_path, mode):
    from storage.upload import CheckpointUploadError

    events = []
    session = make_session(tmp_path, pafs.PyFileSystem(LosesAFile("optimizer.txt")), events)
    source = write_checkpoint(str(tmp_path / "src"), "weights")
    (tmp_path / "src" / "optimizer.txt").write_text("moments")
    with pytest.raises(CheckpointUploadError, match=r"missing 1 of its 2 files \(optimizer.txt\)"):
        session.report({"step": 0}, source, mode)
        session.flush()
    assert events == []  # nothing reached the controller, so nothing is committed
