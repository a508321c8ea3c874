"""report() with CheckpointUploadMode.ASYNC: returns before the upload, keeps report order."""

from __future__ import annotations

import glob
import os
import tempfile
import threading

import pyarrow.fs as pafs
import pytest

from faulty_fs import RecordingHandler
from storage import Checkpoint
from storage.layout import RunLayout
from trainers import CheckpointUploadMode
from trainers._internal.events import ReportEvent
from trainers._internal.session import WorkerSession
from trainers.context import StorageInfo, TrainContext


class GatedHandler(RecordingHandler):
    """Writes block until the test opens the gate, like a slow object store."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()

    def open_output_stream(self, path, metadata):
        assert self.gate.wait(30), "the test never opened the gate"
        return super().open_output_stream(path, metadata)


def make_session(tmp_path, fs, events):
    info = StorageInfo(str(tmp_path), str(tmp_path / "run"), str(tmp_path / "run"), fs)
    context = TrainContext("run", 1, 0, 0, 1, 0, info)
    return WorkerSession(
        context=context,
        attempt=1,
        layout=RunLayout(str(tmp_path / "run")),
        filesystem=fs,
        checkpoint=None,
        dataset_shards={},
        emit=events.append,
    )


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

    uploader = threading.Thread(target=lambda: session.report({"step": 1}, None))
    uploader.start()  # a metrics-only report queues behind the upload
    uploader.join(0.5)
    assert uploader.is_alive() and events == []

    handler.gate.set()
    uploader.join(10)
    session.flush()
    assert [(e.index, e.metrics["step"], e.staged) for e in events if isinstance(e, ReportEvent)] == [(0, 0, True), (1, 1, False)]
    staged = tmp_path / "run" / ".staging" / "attempt_0001" / "report_000000" / "model.txt"
    assert staged.read_text() == "zero"
    # The local copy is gone once uploaded.
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "flowtrain-upload-*"))) == copies_before


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
    with pytest.raises(ValueError, match=r"checkpoint_upload_mode='async'\): must be CheckpointUploadMode.SYNC or ASYNC"):
        session.report({"step": 0}, None, "async")


def test_a_loop_that_raises_after_an_async_report_sends_the_report_first(tmp_path):
    """The round a rank reported before it raised must reach the controller before its failure:
    the failure waits for the background upload of that report."""
    import trainers
    from trainers._internal.events import FailedEvent
    from trainers._internal.worker import run_training_function

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
