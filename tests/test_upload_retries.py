"""Checkpoint uploads that hold up: transient storage errors are retried with backoff, a spent
budget ends the run with CheckpointUploadError and keeps the previous checkpoint, ASYNC uploads
run behind report() but before the commit, and every checkpoint's upload seconds and bytes are
recorded in run.json and shown in the checkpoint table.

The runs train 2 workers on the shared test Ray against a moto S3 server, through
``faulty_s3.FaultyS3`` (a real pyarrow S3 filesystem that fails or holds back writes on cue).
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import shutil
import tempfile
import threading

import pyarrow.fs as pafs
import pytest

import faulty_s3
from faulty_fs import RecordingHandler, faulty_fs
from faulty_s3 import BUCKET, log_event, read_events
from faulty_s3 import faulty_s3 as make_faulty_s3
from storage import Checkpoint, RunInProgressError, figures, load_run, upload_directory
from storage.commit import commit_folder
from storage.layout import COMMIT_MARKER, RunLayout
from storage.upload import CheckpointUploadError, RetryPolicy, is_transient
from trainers import (
    CheckpointConfig,
    CheckpointUploadMode,
    DataParallelTrainer,
    Result,
    RunConfig,
    ScalingConfig,
    UserCallback,
    WorkerGroupError,
    errors,
)
from trainers._internal.session import checkpoint_upload

#: The workers' retry policy in these runs: quick, so a spent budget costs milliseconds.
FAST_RETRIES = {"FLOWTRAIN_UPLOAD_BACKOFF_S": "0.01", "FLOWTRAIN_UPLOAD_BACKOFF_MAX_S": "0.05"}
PAYLOAD_BYTES = 150_000


# -- the training loop and what the driver sees ------------------------------------------------------


def upload_loop(config: dict) -> None:
    """Every rank checkpoints its own files each step (``rank_<r>.txt`` holds the step,
    ``rank_<r>.bin`` is (r+1) x PAYLOAD_BYTES); resumes after the step get_checkpoint() holds."""
    import trainers as train

    rank = train.get_context().get_world_rank()
    start = 0
    if (checkpoint := train.get_checkpoint()) is not None:
        with checkpoint.as_directory() as folder:
            start = int(pathlib.Path(folder, f"rank_{rank}.txt").read_text()) + 1
    modes = config.get("modes", ["SYNC"])
    for step in range(start, config["steps"]):
        folder = tempfile.mkdtemp(prefix="upload-retries-")
        with open(os.path.join(folder, f"rank_{rank}.txt"), "w") as f:
            f.write(str(step))
        with open(os.path.join(folder, f"rank_{rank}.bin"), "wb") as f:
            f.write(bytes([step % 256]) * ((rank + 1) * PAYLOAD_BYTES))
        mode = CheckpointUploadMode[modes[step % len(modes)]]
        train.report({"step": step}, checkpoint=Checkpoint.from_directory(folder), checkpoint_upload_mode=mode)
        if config.get("log"):
            log_event(config["log"], f"returned rank {rank} step {step}")
            faulty_s3.REPORT_RETURNED.set()
        shutil.rmtree(folder, ignore_errors=True)  # ASYNC uploads from a copy of its own


def checkpoint_bytes(step: int, world_size: int = 2) -> int:
    """What ``upload_loop`` checkpoints at ``step`` over all ranks."""
    return sum((rank + 1) * PAYLOAD_BYTES + len(str(step)) for rank in range(world_size))


class CommitLog(UserCallback):
    """Logs every committed checkpoint (in the driver) to the shared event log, and keeps the names."""

    def __init__(self, log_path: str | None = None) -> None:
        self.log_path = log_path
        self.committed: list[str] = []

    def after_report(self, run_context, metrics, checkpoint):
        if checkpoint is not None:
            self.committed.append(checkpoint.path.rpartition("/")[2])
            if self.log_path:
                log_event(self.log_path, f"committed {checkpoint.path}")


def fit(name, fs, storage_path, *, steps, callbacks=(), worker_env=FAST_RETRIES, **config):
    return DataParallelTrainer(
        upload_loop,
        train_loop_config={"steps": steps, **config},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=name,
            storage_path=storage_path,
            storage_filesystem=fs,
            callbacks=list(callbacks),
            worker_runtime_env={"env_vars": dict(worker_env)},
        ),
    ).fit()


def listing(fs, path):
    return sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))


def records(fs, run_path):
    with fs.open_input_stream(f"{run_path}/run.json") as stream:
        return json.loads(stream.read())["checkpoints"]


@pytest.fixture(scope="module")
def s3():
    with faulty_s3.moto_s3() as fs:
        yield fs


@pytest.fixture
def fast_driver_retries(monkeypatch):
    """The driver's commit reads the same variables when it copies (not at import)."""
    for name, value in FAST_RETRIES.items():
        monkeypatch.setenv(name, value)


# -- runs on S3 --------------------------------------------------------------------------------------


@pytest.mark.usefixtures("ray_local", "fast_driver_retries")
def test_two_transient_failures_per_file_are_retried_and_each_checkpoint_commits_once_whole(s3, tmp_path):
    log = str(tmp_path / "events.log")
    # Every upload of a rank's file and every copy into a checkpoint folder (and its commit
    # marker) fails twice, then works.
    fs, _ = make_faulty_s3(s3, log, flaky=("/.staging/", "/checkpoint_"), flaky_times=2)
    commits = CommitLog()
    result = fit("flaky", fs, f"s3://{BUCKET}/retries", steps=2, callbacks=[commits])

    assert commits.committed == ["checkpoint_000000", "checkpoint_000001"]  # each exactly once
    run = f"{BUCKET}/retries/flaky"
    # Beside them: run.json and flowtrain's hidden .health/ (the run's timeline).
    assert [n for n in listing(s3, run) if not n.startswith(("run.json", ".health", ".metrics"))] == [
        "checkpoint_000000",
        "checkpoint_000001",
    ]
    for step in range(2):
        folder = f"{run}/checkpoint_{step:06d}"
        assert listing(s3, folder) == [".committed", "rank_0.bin", "rank_0.txt", "rank_1.bin", "rank_1.txt"]
        for rank in range(2):
            with s3.open_input_stream(f"{folder}/rank_{rank}.txt") as f:
                assert f.read() == str(step).encode()
            assert s3.get_file_info(f"{folder}/rank_{rank}.bin").size == (rank + 1) * PAYLOAD_BYTES
    failures = read_events(log)
    for step in range(2):
        for rank in range(2):
            staged = f"/.staging/attempt_0001/report_{step:06d}/rank_{rank}.bin"
            assert sum(line.endswith(staged) for line in failures) == 2, failures
        assert sum(line.endswith(f"/checkpoint_{step:06d}/.committed") for line in failures) == 2
    # Retries: 2 per rank, 2 for the commit's copy and 2 for its marker.
    assert [r["upload"]["retries"] for r in records(s3, run)] == [8, 8]
    assert [r["upload"]["bytes"] for r in records(s3, run)] == [checkpoint_bytes(0), checkpoint_bytes(1)]
    assert result.metrics == {"step": 1}  # the upload figures never join the user's metrics
    assert list(result.metrics_dataframe["step"]) == [0, 1]


@pytest.mark.usefixtures("ray_local", "fast_driver_retries")
def test_storage_that_keeps_failing_ends_the_run_naming_the_path_and_keeps_the_previous_checkpoint(s3, tmp_path):
    log = str(tmp_path / "events.log")
    fs, _ = make_faulty_s3(s3, log, broken=("/report_000001/",))  # from the second checkpoint on
    with pytest.raises(CheckpointUploadError) as caught:
        fit(
            "broken",
            fs,
            f"s3://{BUCKET}/retries",
            steps=3,
            worker_env={**FAST_RETRIES, "FLOWTRAIN_UPLOAD_RETRIES": "2"},
        )
    error = caught.value
    assert isinstance(error, WorkerGroupError)  # what any spent worker budget raises, too
    staging = f"s3://{BUCKET}/retries/broken/.staging/attempt_0001/report_000001"
    assert error.path == staging and error.attempts == 3
    assert "injected failure" in error.last_error
    assert staging in str(error) and "injected failure" in str(error)

    run = f"{BUCKET}/retries/broken"
    assert [n for n in listing(s3, run) if n.startswith("checkpoint_")] == ["checkpoint_000000"]
    assert not listing(s3, f"{run}/.staging")  # the failed upload's files are gone
    restored = Result.from_path(f"s3://{run}", storage_filesystem=s3)
    assert restored.checkpoint.path == f"{run}/checkpoint_000000"
    assert listing(s3, restored.checkpoint.path) == [
        ".committed",
        "rank_0.bin",
        "rank_0.txt",
        "rank_1.bin",
        "rank_1.txt",
    ]
    assert "injected failure" in load_run(f"s3://{run}", s3).snapshot.error

    resumed = fit("broken", s3, f"s3://{BUCKET}/retries", steps=3)  # the storage is well again
    assert list(resumed.metrics_dataframe["step"]) == [0, 1, 2]  # step 0 came from the checkpoint
    assert resumed.checkpoint.path == f"{run}/checkpoint_000002"


@pytest.mark.usefixtures("ray_local")
def test_an_async_report_returns_before_its_slow_upload_and_the_commit_waits_for_the_upload(s3, tmp_path):
    log = str(tmp_path / "events.log")
    # The storage holds each rank's first upload until that rank's report() has returned: an
    # ASYNC report that waited for its upload would stall here (and the log would say so).
    fs, _ = make_faulty_s3(s3, log, gated=("/report_000000/",))
    fit("slow", fs, f"s3://{BUCKET}/retries", steps=2, modes=["ASYNC"], log=log, callbacks=[CommitLog(log)])

    events = read_events(log)
    assert not [e for e in events if e.startswith("gate timed out")], events
    committed = events.index(f"committed {BUCKET}/retries/slow/checkpoint_000000")
    for rank in range(2):
        returned = events.index(f"returned rank {rank} step 0")
        written = [i for i, e in enumerate(events) if e.startswith("written ") and f"/report_000000/rank_{rank}." in e]
        assert len(written) == 2, events
        assert returned < min(written) and max(written) < committed, events
    assert listing(s3, f"{BUCKET}/retries/slow/checkpoint_000000") == [
        ".committed",
        "rank_0.bin",
        "rank_0.txt",
        "rank_1.bin",
        "rank_1.txt",
    ]


# -- what is recorded ------------------------------------------------------------------------------


@pytest.mark.usefixtures("ray_local")
def test_upload_seconds_and_bytes_are_in_the_checkpoint_records_and_the_checkpoint_table(tmp_path):
    from tasks.checkpoints import UPLOAD_COLUMNS, checkpoint_rows

    result = fit("recorded", None, str(tmp_path), steps=2, modes=["SYNC", "ASYNC"], worker_env={})
    body = json.loads((tmp_path / "recorded" / "run.json").read_text())
    for step, record in enumerate(body["checkpoints"]):
        upload = record["upload"]
        assert upload["bytes"] == checkpoint_bytes(step) and upload["retries"] == 0
        assert upload["seconds"] > 0
        assert record["metrics"] == {"step": step}
    assert result.metrics == {"step": 1} and [m for _, m in result.best_checkpoints] == [{"step": 0}, {"step": 1}]

    rows = checkpoint_rows(load_run(result.path).snapshot, CheckpointConfig())
    seconds, megabytes = UPLOAD_COLUMNS
    for step, row in enumerate(rows):
        assert row[megabytes] == float(f"{checkpoint_bytes(step) / 1e6:.4g}")  # as storage.figures writes figures
        assert row[seconds] == figures.seconds(body["checkpoints"][step]["upload"]["seconds"])
    assert list(rows[0])[-3:] == ["status", seconds, megabytes]


# -- the parts, without Ray ------------------------------------------------------------------------


def make_folder(path, files):
    os.makedirs(path, exist_ok=True)
    for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(path, name)), exist_ok=True)
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)
    return str(path)


def test_a_retry_copies_again_only_the_files_that_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWTRAIN_UPLOAD_BACKOFF_S", "0")
    source = make_folder(tmp_path / "src", {"a.bin": b"a" * 10, "sub/b.bin": b"b" * 20, "c.bin": b"c" * 30})
    failed = {}

    def flaky_b(op, path):
        if op == "write" and path.endswith("sub/b.bin") and failed.get(path, 0) < 2:
            failed[path] = failed.get(path, 0) + 1
            return True
        return False

    fs, handler = faulty_fs(fail_when=flaky_b)
    stats = upload_directory(source, fs, str(tmp_path / "dest"))
    assert (stats.bytes, stats.retries) == (60, 2)
    writes = [os.path.relpath(path, tmp_path / "dest") for op, path in handler.ops if op == "write"]
    assert sorted(writes) == ["a.bin", "c.bin", "sub/b.bin", "sub/b.bin", "sub/b.bin"]
    assert (tmp_path / "dest" / "sub" / "b.bin").read_bytes() == b"b" * 20


def test_a_commit_that_outlasts_its_lease_leaves_the_new_owners_folder_alone(tmp_path, monkeypatch):
    """Regression (the namespace-cluster test of a Prefect host cut off mid-run): a driver's copy
    into ``checkpoint_000006``, stuck in the cut network, failed only once the link was back,
    after the rerun had committed its own ``checkpoint_000006``; the cut driver then deleted that
    folder as its own half-done commit. Once the lease is lost, nothing more touches the folder."""
    monkeypatch.setenv("FLOWTRAIN_UPLOAD_BACKOFF_S", "0")
    staged = make_folder(tmp_path / "staged", {"rank0.json": b"cut driver's", "rank1.json": b"cut driver's"})
    final = tmp_path / "checkpoint_000006"
    lease_lost, first = threading.Event(), threading.Lock()

    def stuck_until_taken_over(op, path):
        if op != "copy_file":
            return False
        with first:  # the files are copied in parallel: the first stuck request sees the takeover
            if not lease_lost.is_set():
                make_folder(final, {"rank0.json": b"rerun's", "rank1.json": b"rerun's", COMMIT_MARKER: b""})
                lease_lost.set()
        return True  # each request of the stuck try fails, once the link is back

    def still_owner():
        if lease_lost.is_set():
            raise RunInProgressError("this driver lost the run's lease")

    fs, handler = faulty_fs(fail_when=stuck_until_taken_over)
    with pytest.raises(RunInProgressError, match="lost the run's lease"):
        commit_folder(fs, staged, str(final), still_owner=still_owner)
    assert {p.name: p.read_bytes() for p in final.iterdir()} == {
        "rank0.json": b"rerun's",
        "rank1.json": b"rerun's",
        COMMIT_MARKER: b"",
    }
    changes = sorted(op for op, path in handler.ops if path.startswith(str(final)))
    assert changes == ["copy_file", "copy_file", "create_dir"], changes  # the stuck try's, no more


def test_a_lookup_that_outlasts_its_lease_deletes_no_folder_of_the_new_owner(tmp_path):
    """Regression (stop 63's CI, the same namespace-cluster test): the cut driver's look for its
    staged files was answered only once the link was back, after the rerun had committed its own
    ``checkpoint_000002``; the cut driver took that folder for a half-done commit of its own and
    deleted it, leaving run.json naming a folder that was gone. The lease is checked before any
    change, so the rerun's folder stays whole."""
    staged = make_folder(tmp_path / "staged", {"rank0.json": b"cut driver's"})
    final = tmp_path / "checkpoint_000002"
    lease_lost = threading.Event()

    class AnsweredAfterTheTakeover(RecordingHandler):
        def get_file_info(self, paths):
            if not lease_lost.is_set():  # the first lookup, stuck while the rerun commits
                make_folder(final, {"rank0.json": b"rerun's", COMMIT_MARKER: b""})
                lease_lost.set()
            return super().get_file_info(paths)

    def still_owner():
        if lease_lost.is_set():
            raise RunInProgressError("this driver lost the run's lease")

    handler = AnsweredAfterTheTakeover()
    with pytest.raises(RunInProgressError, match="lost the run's lease"):
        commit_folder(pafs.PyFileSystem(handler), staged, str(final), still_owner=still_owner)
    assert {p.name: p.read_bytes() for p in final.iterdir()} == {"rank0.json": b"rerun's", COMMIT_MARKER: b""}
    assert handler.ops == [], handler.ops  # not one change from the driver that lost the lease


def test_permanent_errors_are_not_retried_and_a_spent_budget_names_the_destination(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWTRAIN_UPLOAD_BACKOFF_S", "0")
    monkeypatch.setenv("FLOWTRAIN_UPLOAD_RETRIES", "3")
    source = make_folder(tmp_path / "src", {"model.bin": b"m"})

    def denied(op, path):
        if op == "write":
            raise PermissionError(13, "Permission denied", path)
        return False

    fs, handler = faulty_fs(fail_when=denied)
    with pytest.raises(CheckpointUploadError, match="not retried") as caught:
        upload_directory(source, fs, str(tmp_path / "dest"))
    assert caught.value.attempts == 1 and caught.value.last_error.startswith("PermissionError")
    assert [op for op, _ in handler.ops if op == "write"] == ["write"]

    fs, handler = faulty_fs(fail_when=lambda op, path: op == "write")  # "injected failure": transient
    with pytest.raises(CheckpointUploadError, match=r"after 4 tries") as caught:
        upload_directory(source, fs, str(tmp_path / "dest"))
    assert caught.value.path == f"faulty://{str(tmp_path / 'dest').lstrip('/')}" and caught.value.attempts == 4
    assert "injected failure" in str(caught.value) and len([op for op, _ in handler.ops if op == "write"]) == 4

    assert not is_transient(OSError("AWS Error NO_SUCH_BUCKET during CreateMultipartUpload operation: gone"))
    assert not is_transient(OSError("AWS Error ACCESS_DENIED during PutObject operation: no"))
    assert not is_transient(OSError(28, "No space left on device"))
    assert is_transient(OSError("AWS Error SLOW_DOWN during UploadPart operation: please reduce your request rate"))
    assert is_transient(ConnectionResetError(104, "Connection reset by peer"))
    assert not is_transient(ValueError("a mistake, not weather"))


def test_the_policy_is_read_from_the_environment_when_used(monkeypatch):
    assert RetryPolicy.from_env({}) == RetryPolicy(retries=4, backoff_s=0.5, backoff_max_s=8.0, threads=8)
    monkeypatch.setenv("FLOWTRAIN_UPLOAD_RETRIES", "7")
    assert RetryPolicy.from_env().attempts == 8
    monkeypatch.setenv("FLOWTRAIN_UPLOAD_RETRIES", "many")
    with pytest.raises(ValueError, match="FLOWTRAIN_UPLOAD_RETRIES='many'"):
        RetryPolicy.from_env()
    policy = RetryPolicy()
    for retry, step in enumerate([0.5, 1, 2, 4, 8, 8]):  # doubling, capped at 8 s, jittered to [step/2, step]
        assert policy.delay(retry, draw=lambda: 0.0) == step / 2 and policy.delay(retry, draw=lambda: 1.0) == step


def test_the_run_error_pickles_and_is_caught_as_either_type():
    upload = CheckpointUploadError(
        "could not copy", path="s3://b/run/.staging/x", attempts=5, last_error="OSError: 503"
    )
    error_type = errors.run_error_type(WorkerGroupError, [upload])
    error = error_type("Training failed", {1: upload}, attempt=1)
    again = pickle.loads(pickle.dumps(error))
    assert isinstance(again, CheckpointUploadError) and isinstance(again, WorkerGroupError)
    assert (again.path, again.attempts, again.last_error) == ("s3://b/run/.staging/x", 5, "OSError: 503")
    assert errors.run_error_type(WorkerGroupError, [RuntimeError("x")]) is WorkerGroupError


def test_a_users_upload_function_is_called_once_and_its_error_passes_through(tmp_path):
    calls = []

    def upload_fn(checkpoint, name):
        calls.append(name)
        raise ConnectionResetError(104, "the user's own store")

    source = Checkpoint.from_directory(make_folder(tmp_path / "src", {"m.bin": b"m"}))
    layout = RunLayout(str(tmp_path / "run"))
    with pytest.raises(ConnectionResetError):
        checkpoint_upload.persist(
            source,
            staging=layout.staging_path(1, 0),
            layout=layout,
            filesystem=pafs.LocalFileSystem(),
            dir_name=None,
            upload_fn=upload_fn,
        )
    assert calls == [".staging/attempt_0001/report_000000"]
