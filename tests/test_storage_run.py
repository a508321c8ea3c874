"""RunStorage on real files: commit, snapshot, retention order, resume, lease, faults. No Ray."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import threading
import time

import pyarrow.fs as pafs
import pytest

from faulty_fs import faulty_fs
from storage import (
    Checkpoint,
    CheckpointConfig,
    RunInProgressError,
    RunStorage,
    SnapshotCorruptError,
    StorageError,
    load_run,
    upload_directory,
)
from storage.layout import RunLayout
from storage.protocol import ReportRound
from storage.snapshot import RunSnapshot, write_snapshot


def stage(storage: RunStorage, attempt: int, index: int, content: str, fs=None) -> None:
    """What a worker's report() does: upload its checkpoint files into the staging folder."""
    local = storage.layout.staging_path(attempt, index) + ".src"
    os.makedirs(local, exist_ok=True)
    with open(os.path.join(local, "model.txt"), "w") as f:
        f.write(content)
    with open(os.path.join(local, "optimizer.txt"), "w") as f:
        f.write("state")
    upload_directory(local, fs or storage.filesystem, storage.layout.staging_path(attempt, index))


def report(storage, attempt, index, metrics, checkpoint=False):
    if checkpoint:
        stage(storage, attempt, index, f"step {index}")
    return storage.record_report(ReportRound(metrics, report_index=index, attempt=attempt, staged=checkpoint))


def folders(path) -> list[str]:
    return sorted(name for name in os.listdir(path) if name.startswith("checkpoint_"))


def test_commit_retention_and_result_paths(tmp_path):
    config = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min")
    storage = RunStorage(str(tmp_path), "run", checkpoint_config=config)
    storage.open("me")
    attempt = storage.start_attempt()
    losses = [0.9, 0.2, 0.5, 0.7, 0.6]
    for index, loss in enumerate(losses):
        committed = report(storage, attempt, index, {"loss": loss, "step": index}, checkpoint=True)
        assert committed.path == str(tmp_path / "run" / f"checkpoint_{index:06d}")
        assert pathlib.Path(committed.path, "model.txt").read_text() == f"step {index}"
        assert len(folders(tmp_path / "run")) <= 3
    # best two by loss: 0.2 (#1) and 0.5 (#2), plus the latest (#4).
    assert folders(tmp_path / "run") == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000004"]
    assert [m["loss"] for _, m in storage.best_checkpoints] == [0.2, 0.5, 0.6]
    assert storage.latest_checkpoint.path.endswith("checkpoint_000004")
    for checkpoint, _ in storage.best_checkpoints:
        assert os.path.isdir(checkpoint.path)
    assert not os.path.exists(storage.layout.staging_path(attempt, 0))
    storage.finish()
    assert claims(tmp_path / "run") == []

    view = load_run(str(tmp_path / "run"))
    assert [m["step"] for m in view.metrics_history] == [0, 1, 2, 3, 4]
    assert view.latest_checkpoint == storage.latest_checkpoint
    assert view.snapshot.finished


def test_snapshot_is_written_before_anything_is_deleted(tmp_path):
    fs, handler = faulty_fs()
    storage = RunStorage(str(tmp_path), "run", filesystem=fs, checkpoint_config=CheckpointConfig(num_to_keep=1))
    storage.open("me")
    attempt = storage.start_attempt()
    report(storage, attempt, 0, {"step": 0}, checkpoint=True)
    handler.ops.clear()
    report(storage, attempt, 1, {"step": 1}, checkpoint=True)
    snapshot_moves = [i for i, (op, path) in enumerate(handler.ops) if op == "move" and path.endswith("/run.json")]
    deletions = [
        i for i, (op, path) in enumerate(handler.ops) if op == "delete_dir" and path.endswith("checkpoint_000000")
    ]
    assert snapshot_moves and deletions
    assert snapshot_moves[0] < deletions[0]
    names = [c["dir_name"] for c in json.loads((tmp_path / "run" / "run.json").read_text())["checkpoints"]]
    assert names == ["checkpoint_000001"]
    storage.close()  # its heartbeat calls back into Python: not a thread to leave at interpreter exit


def test_a_snapshot_write_stuck_until_another_driver_took_over_is_never_moved_in(tmp_path):
    """Regression (the namespace-cluster test of a Prefect host cut off mid-run): the cut driver's
    write of run.json.new, stuck in the cut network, landed once the link was back, and the
    driver then moved it over the run.json of the rerun that had taken the run over."""
    layout = RunLayout(str(tmp_path))
    write_snapshot(pafs.LocalFileSystem(), layout, RunSnapshot(name="run", attempt=2))  # the new owner's
    lease_lost = threading.Event()

    def stuck_until_taken_over(op, path):
        if op == "write" and path == layout.snapshot_new:
            lease_lost.set()  # the write lands, long after the lease's heartbeat stopped
        return False

    def still_owner():
        if lease_lost.is_set():
            raise RunInProgressError("this driver lost the run's lease")

    fs, handler = faulty_fs(fail_when=stuck_until_taken_over)
    with pytest.raises(RunInProgressError, match="lost the run's lease"):
        write_snapshot(fs, layout, RunSnapshot(name="run", attempt=1), still_owner=still_owner)
    assert json.loads(pathlib.Path(layout.snapshot).read_text())["attempt"] == 2
    assert [op for op, _ in handler.ops] == ["write"]


def test_failed_deletion_is_retried_later_and_never_fatal(tmp_path):
    blocked = {"on": True}
    fs, _ = faulty_fs(
        fail_when=lambda op, path: blocked["on"] and op == "delete_dir" and path.endswith("checkpoint_000000")
    )
    storage = RunStorage(str(tmp_path), "run", filesystem=fs, checkpoint_config=CheckpointConfig(num_to_keep=1))
    storage.open("me")
    attempt = storage.start_attempt()
    report(storage, attempt, 0, {"step": 0}, checkpoint=True)
    report(storage, attempt, 1, {"step": 1}, checkpoint=True)  # deleting #0 fails: no error
    assert "checkpoint_000000" in folders(tmp_path / "run")
    assert storage.snapshot.to_delete == ["checkpoint_000000"]
    blocked["on"] = False
    report(storage, attempt, 2, {"step": 2}, checkpoint=True)
    assert folders(tmp_path / "run") == ["checkpoint_000002"]
    storage.close()


def test_resume_continues_history_from_latest_checkpoint(tmp_path):
    first = RunStorage(str(tmp_path), "run")
    first.open("a")
    attempt = first.start_attempt()
    report(first, attempt, 0, {"step": 0})
    report(first, attempt, 1, {"step": 1}, checkpoint=True)
    report(first, attempt, 2, {"step": 2})  # after the checkpoint: redone on resume
    first.record_failure()
    first.close()  # the driver died here

    second = RunStorage(str(tmp_path), "run")
    second.open("b")
    assert [m["step"] for m in second.metrics_history] == [0, 1]
    assert second.num_failures == 1  # counts survive a driver restart
    resumed = second.start_attempt()
    assert resumed == attempt + 1
    with second.latest_checkpoint.as_directory() as folder:
        assert pathlib.Path(folder, "model.txt").read_text() == "step 1"
    report(second, resumed, 0, {"step": 2})
    assert [m["step"] for m in second.metrics_history] == [0, 1, 2]


def test_a_report_from_an_old_attempt_cannot_commit(tmp_path):
    storage = RunStorage(str(tmp_path), "run")
    storage.open("me")
    old = storage.start_attempt()
    stage(storage, old, 0, "stale")
    storage.start_attempt()
    with pytest.raises(StorageError, match=r"report 0 of attempt 1 arrived after attempt 2 began"):
        storage.record_report(ReportRound({"step": 0}, report_index=0, attempt=old, staged=True))
    assert folders(tmp_path / "run") == []


@pytest.mark.parametrize("local", [True, False], ids=["rename", "copy-and-marker"])
def test_a_checkpoint_that_failed_mid_commit_is_never_named_or_restored(tmp_path, local, monkeypatch):
    # Dies half way: the rename fails, or (object-store style) one file of two is copied.
    fs, _ = faulty_fs(
        fail_when=lambda op, path: (
            (op == "move" and path.endswith("checkpoint_000001"))
            or (op == "copy_file" and path.endswith("checkpoint_000001/optimizer.txt"))
        )
    )
    if local:  # take the local-disk commit path (rename), still through the faulty handler
        from storage import commit as commit_module

        monkeypatch.setattr(commit_module, "is_local", lambda f: True)
    storage = RunStorage(str(tmp_path), "run", filesystem=fs)
    storage.open("me")
    attempt = storage.start_attempt()
    report(storage, attempt, 0, {"step": 0}, checkpoint=True)
    with pytest.raises(OSError, match="injected failure"):
        report(storage, attempt, 1, {"step": 1}, checkpoint=True)
    storage.close()  # the driver gives up

    resumed = RunStorage(str(tmp_path), "run")
    resumed.open("again")
    assert resumed.latest_checkpoint.path.endswith("checkpoint_000000")
    assert [c.dir_name for c in resumed.snapshot.checkpoints] == ["checkpoint_000000"]
    assert not (tmp_path / "run" / ".staging").exists()  # half-done uploads are cleaned up
    assert folders(tmp_path / "run") == ["checkpoint_000000"]  # the partial folder is gone


def test_untracked_checkpoint_folders_are_removed_on_open(tmp_path):
    storage = RunStorage(str(tmp_path), "run")
    storage.open("me")
    attempt = storage.start_attempt()
    report(storage, attempt, 0, {"step": 0}, checkpoint=True)
    storage.close()
    os.makedirs(tmp_path / "run" / "checkpoint_000007")  # e.g. copied but never named before a crash
    RunStorage(str(tmp_path), "run").open("next")
    assert folders(tmp_path / "run") == ["checkpoint_000000"]


def test_truncated_snapshot_falls_back_to_previous_good_copy(tmp_path):
    storage = RunStorage(str(tmp_path), "run")
    storage.open("me")
    attempt = storage.start_attempt()
    report(storage, attempt, 0, {"step": 0}, checkpoint=True)
    report(storage, attempt, 1, {"step": 1}, checkpoint=True)
    storage.close()
    path = tmp_path / "run" / "run.json"
    path.write_bytes(path.read_bytes()[:40])  # torn write
    resumed = RunStorage(str(tmp_path), "run")
    resumed.open("again")
    assert resumed.latest_checkpoint is not None  # the previous good snapshot named a checkpoint


def test_unreadable_snapshot_fails_naming_the_path_and_never_restarts(tmp_path):
    storage = RunStorage(str(tmp_path), "run")
    storage.open("me")
    storage.start_attempt()
    storage.close()
    for name in ("run.json", "run.json.prev"):
        (tmp_path / "run" / name).write_text("{not json")
    with pytest.raises(SnapshotCorruptError, match=str(tmp_path / "run")):
        RunStorage(str(tmp_path), "run").open("again")
    assert (tmp_path / "run" / "run.json").read_text() == "{not json"  # nothing overwritten


def test_second_live_run_fails_fast_and_deletes_nothing(tmp_path):
    first = RunStorage(str(tmp_path), "run")
    first.open("first-owner")
    attempt = first.start_attempt()
    report(first, attempt, 0, {"step": 0}, checkpoint=True)
    stage(first, attempt, 1, "in flight")  # the first run is mid-upload
    with pytest.raises(RunInProgressError, match=r"run in progress: .*run is owned by first-owner") as refused:
        RunStorage(str(tmp_path), "run").open("second-owner")
    assert refused.value.retry_after_s > 0  # refused at once, while the first owner's lease is fresh
    assert os.path.isdir(first.layout.staging_path(attempt, 1))
    assert folders(tmp_path / "run") == ["checkpoint_000000"]
    report(first, attempt, 1, {"step": 1}, checkpoint=True)  # the first run goes on unharmed
    first.finish()


def test_stale_lease_is_taken_over(tmp_path):
    # Not much shorter: an owner that cannot renew its heartbeat within half of it stops writing.
    dead = RunStorage(str(tmp_path), "run", lease_stale_after_s=1.0)
    dead.open("dead-owner")
    dead._lease._stop.set()  # the owner's heartbeat stops as if its process died
    time.sleep(1.2)
    alive = RunStorage(str(tmp_path), "run", lease_stale_after_s=1.0)
    alive.open("new-owner")
    assert [claim["owner"] for claim in claims(tmp_path / "run")] == ["new-owner"]
    alive.close()


def test_unwritable_path_fails_naming_path_and_operation(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(StorageError, match=r"cannot create the run folder at .*a-file/run"):
        RunStorage(str(blocker), "run").open("me")


def test_storage_that_does_not_answer_fails_within_the_timeout(tmp_path):
    answered = threading.Event()
    fs, _ = faulty_fs(delay_s=2.0, fail_when=lambda op, path: answered.set())  # called once the delay is over
    # The 2 s call would have succeeded: the error says the 1 s timeout ended the wait.
    with pytest.raises(StorageError, match=r"cannot create the run folder at .*: no answer within 1 s"):
        RunStorage(str(tmp_path), "run", filesystem=fs, check_timeout_s=1).open("me")
    # A thread still inside a Python filesystem's call when the interpreter exits aborts it
    # (once pyarrow's S3 was used in the process): let the slow call end here.
    assert answered.wait(30)


def test_checkpoint_api(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "w.bin").write_bytes(b"weights")
    checkpoint = Checkpoint.from_directory(str(source))
    with checkpoint.as_directory() as folder:
        assert pathlib.Path(folder, "w.bin").read_bytes() == b"weights"
    copy = checkpoint.to_directory(str(tmp_path / "copy"))
    assert pathlib.Path(copy, "w.bin").read_bytes() == b"weights"
    checkpoint.set_metadata({"epoch": 3})
    checkpoint.update_metadata({"lr": 0.1})
    assert checkpoint.get_metadata() == {"epoch": 3, "lr": 0.1}
    again = pickle.loads(pickle.dumps(checkpoint))
    assert again == checkpoint and again.get_metadata()["epoch"] == 3

    fs, _ = faulty_fs()  # a non-local filesystem: as_directory gives a temporary copy
    remote = Checkpoint(str(source), fs)
    with remote.as_directory() as folder:
        assert folder != str(source) and pathlib.Path(folder, "w.bin").read_bytes() == b"weights"
    assert not os.path.exists(folder)


def test_non_local_filesystem_commits_with_a_marker(tmp_path):
    fs, handler = faulty_fs()
    storage = RunStorage(str(tmp_path), "run", filesystem=fs)
    storage.open("me")
    attempt = storage.start_attempt()
    committed = report(storage, attempt, 0, {"step": 0}, checkpoint=True)
    assert os.path.exists(os.path.join(committed.path, ".committed"))
    writes = [path for op, path in handler.ops if op in ("write", "move")]
    marker = writes.index(committed.path + "/.committed")
    snapshot = max(i for i, p in enumerate(writes) if p.endswith("/run.json"))
    assert marker < snapshot  # the marker is in place before the snapshot names the folder
    storage.close()


def claims(run_dir) -> list[dict]:
    """The claims on the run's lease (its holder's, once it is held)."""
    return [json.loads(path.read_text()) for path in sorted(run_dir.glob("lease.*.json"))]


def write_lease(run_dir, *, host: str, pid: int, age_s: float = 0.0) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    body = {"owner": f"{host}:{pid}:old", "host": host, "pid": pid, "heartbeat": time.time() - age_s}
    (run_dir / "lease.old.json").write_text(json.dumps(body))


def test_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path):
    import socket
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process now
    write_lease(tmp_path / "run", host=socket.gethostname(), pid=gone.pid)
    storage = RunStorage(str(tmp_path), "run", lease_stale_after_s=3600)  # staleness alone would refuse
    storage.open("new-owner")
    assert [claim["owner"] for claim in claims(tmp_path / "run")] == ["new-owner"]  # the dead one's removed
    storage.close()


@pytest.mark.parametrize("where", ["live process on this host", "process on another host"])
def test_lease_of_a_live_holder_names_it_and_when_it_goes_stale(tmp_path, where):
    import socket

    host = socket.gethostname() if where.endswith("this host") else "elsewhere.example"
    pid = os.getppid() if where.endswith("this host") else 1  # pid 1 on another host says nothing here
    write_lease(tmp_path / "run", host=host, pid=pid, age_s=10)
    with pytest.raises(RunInProgressError, match=rf"host {host}, pid {pid}, .*goes stale in (19|20) s") as caught:
        RunStorage(str(tmp_path), "run", lease_stale_after_s=30).open("new-owner")
    assert (caught.value.holder_host, caught.value.holder_pid) == (host, pid)
    assert 0 < caught.value.retry_after_s <= 20
    assert [claim["pid"] for claim in claims(tmp_path / "run")] == [pid]  # not taken, nothing left behind


def test_a_passing_error_writing_run_json_is_retried_and_the_checkpoint_committed(tmp_path):
    # A checkpoint's commit point is its line in run.json: one passing error from the store there
    # must not fail a run whose files are all uploaded (the chaos soak's snapshot-transient fault).
    failures = []

    def once_at_commit(op: str, path: str) -> bool:
        if op == "write" and path.endswith("run.json.new") and staged_done and not failures:
            failures.append(path)
            return True
        return False

    staged_done = False
    fs, handler = faulty_fs(fail_when=once_at_commit)
    storage = RunStorage(str(tmp_path), "run", filesystem=fs)
    storage.open("me")
    attempt = storage.start_attempt()
    stage(storage, attempt, 0, "step 0")
    staged_done = True
    storage.record_report(ReportRound({"step": 0}, report_index=0, attempt=attempt, staged=True))
    storage.close()

    assert len(failures) == 1
    resumed = RunStorage(str(tmp_path), "run")
    resumed.open("again")
    assert resumed.latest_checkpoint.path.endswith("checkpoint_000000")
    assert (tmp_path / "run" / "checkpoint_000000" / "model.txt").read_text() == "step 0"


def test_a_lasting_error_writing_run_json_fails_at_once_naming_the_file(tmp_path):
    def denied(op: str, path: str) -> bool:
        if op == "write" and path.endswith("run.json.new") and armed:
            raise PermissionError(13, "injected: permission denied", path)
        return False

    armed = False
    fs, handler = faulty_fs(fail_when=denied)
    storage = RunStorage(str(tmp_path), "run", filesystem=fs)
    storage.open("me")
    attempt = storage.start_attempt()
    stage(storage, attempt, 0, "step 0")
    armed, seen = True, len(handler.ops)
    with pytest.raises(
        StorageError, match=r"cannot write the run snapshot at .*run/run.json \(tries: 1\): PermissionError"
    ):
        storage.record_report(ReportRound({"step": 0}, report_index=0, attempt=attempt, staged=True))
    refused = [path for op, path in handler.ops[seen:] if op == "write" and path.endswith("run.json.new")]
    assert len(refused) == 1  # not retried: waiting cannot fix a denied permission


def test_a_run_opens_from_its_folder_as_from_its_storage_path_and_name(tmp_path):
    from storage import RunStorage
    from storage.lease import new_owner

    by_name = RunStorage(str(tmp_path), "r")
    by_name.open(new_owner())
    by_name.finish()
    by_path = RunStorage.at(by_name.run_uri)
    assert (by_path.run_path, by_path.name, by_path.layout) == (by_name.run_path, "r", by_name.layout)
    assert by_path.open(new_owner("checkpoints")).name == "r"
    owners = {new_owner(), new_owner()}
    assert len(owners) == 2 and new_owner("checkpoints").endswith(":checkpoints")
