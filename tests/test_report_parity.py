"""report()'s checkpoint options as Ray Train 2.60 has them: checkpoint_dir_name,
CheckpointUploadMode.NO_UPLOAD, checkpoint_upload_fn, delete_local_checkpoint_after_upload,
get_checkpoint() after a SYNC report, and the trainers' resume_from_checkpoint."""

from __future__ import annotations

import json
import os
import shutil

import pyarrow.fs as pafs
import pytest

import trainers as train
from faulty_fs import faulty_fs
from storage import Checkpoint, CheckpointConfig, RunStorage, upload_directory
from storage.layout import RunLayout
from storage.protocol import ReportRound
from trainers import CheckpointUploadMode, DataParallelTrainer, RunConfig, ScalingConfig, WorkerGroupError
from trainers._internal.session.worker_session import WorkerSession
from trainers.context import StorageInfo, TrainContext


def write(folder, name="model.txt", text="weights"):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as f:
        f.write(text)
    return Checkpoint.from_directory(folder)


def read(checkpoint, name="model.txt"):
    with checkpoint.as_directory() as folder:
        return open(os.path.join(folder, name)).read()


def run_dir(config):
    return train.get_context().get_storage().experiment_fs_path


def local_fit(loop, tmp_path, name="run", **run):
    """One run in this process (num_workers=0): the controller, storage and commits are the real ones."""
    return DataParallelTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name=name, storage_path=str(tmp_path), **run),
    ).fit()


def make_session(tmp_path, events):
    info = StorageInfo(str(tmp_path), str(tmp_path / "run"), str(tmp_path / "run"), pafs.LocalFileSystem())
    (tmp_path / "run").mkdir(exist_ok=True)
    return WorkerSession(
        context=TrainContext("run", 1, 0, 0, 1, 0, info),
        attempt=1,
        layout=RunLayout(str(tmp_path / "run")),
        checkpoint=None,
        dataset_shards={},
        emit=events.append,
    )


# -- checkpoint_dir_name ---------------------------------------------------------------------------


def named_loop(config):
    seen = []
    for step, name in enumerate(["epoch_0", None, "epoch_2"]):
        checkpoint = write(os.path.join(config["scratch"], str(step)), text=f"step {step}")
        train.report({"step": step}, checkpoint=checkpoint, checkpoint_dir_name=name)
        seen.append(train.get_checkpoint().path)  # a SYNC report's checkpoint, once committed
    return seen


def test_checkpoint_dir_name_names_the_committed_folder_and_get_checkpoint_sees_it(tmp_path):
    result = DataParallelTrainer(
        named_loop,
        train_loop_config={"scratch": str(tmp_path / "scratch")},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="run", storage_path=str(tmp_path)),
    ).fit()
    run = tmp_path / "run"
    assert result.return_value == [str(run / "epoch_0"), str(run / "checkpoint_000001"), str(run / "epoch_2")]
    assert sorted(p.name for p in run.iterdir() if p.is_dir() and not p.name.startswith(".")) == [
        "checkpoint_000001",
        "epoch_0",
        "epoch_2",
    ]
    assert result.checkpoint.path == str(run / "epoch_2") and read(result.checkpoint) == "step 2"
    assert sorted(os.path.basename(c.path) for c, _ in result.best_checkpoints) == [
        "checkpoint_000001",
        "epoch_0",
        "epoch_2",
    ]
    # A later fit() of the same run resumes from the named folder.
    assert train.Result.from_path(str(run)).checkpoint.path == str(run / "epoch_2")


def reuse_loop(config):
    for step in range(2):
        train.report(
            {"step": step}, checkpoint=write(os.path.join(config["scratch"], str(step))), checkpoint_dir_name="same"
        )


def test_a_checkpoint_dir_name_used_twice_is_refused(tmp_path):
    with pytest.raises(WorkerGroupError) as caught:
        DataParallelTrainer(
            reuse_loop,
            train_loop_config={"scratch": str(tmp_path / "scratch")},
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(name="run", storage_path=str(tmp_path)),
        ).fit()
    error = caught.value.worker_failures[0]
    assert isinstance(error, ValueError) and "checkpoint_dir_name='same'" in str(error)
    # The first one is committed and kept, whole.
    assert read(Checkpoint(str(tmp_path / "run" / "same"))) == "weights"


def stage(storage, attempt, index, tmp_path):
    upload_directory(
        str(write(str(tmp_path / f"src{index}")).path), storage.filesystem, storage.layout.staging_path(attempt, index)
    )


def test_storage_refuses_a_kept_name_and_default_names_skip_taken_ones(tmp_path):
    storage = RunStorage(str(tmp_path), "run")
    storage.open("me")
    attempt = storage.start_attempt()
    stage(storage, attempt, 0, tmp_path)
    storage.record_report(
        ReportRound({"i": 0}, report_index=0, attempt=attempt, staged=True, dir_name="checkpoint_000001")
    )
    stage(storage, attempt, 1, tmp_path)
    assert storage.record_report(ReportRound({"i": 1}, report_index=1, attempt=attempt, staged=True)).path.endswith(
        "checkpoint_000002"
    )
    stage(storage, attempt, 2, tmp_path)
    with pytest.raises(ValueError, match="already keeps a checkpoint of that name"):
        storage.record_report(
            ReportRound({"i": 2}, report_index=2, attempt=attempt, staged=True, dir_name="checkpoint_000001")
        )
    storage.close()


def test_a_named_folder_left_by_a_commit_cut_short_is_removed_on_resume(tmp_path):
    """A name the user chose is not recognisably ours, so it is on record for deletion before the
    files move: a crash between the move and the commit point leaves no orphan behind."""
    armed = {"on": False}
    fs, _ = faulty_fs(fail_when=lambda op, path: armed["on"] and op == "move" and path.endswith("/run.json"))
    storage = RunStorage(str(tmp_path), "run", filesystem=fs)
    storage.open("me")
    attempt = storage.start_attempt()
    stage(storage, attempt, 0, tmp_path)
    # The write-ahead record is written first; fail the next snapshot write (the commit point).
    real_write = storage._write
    calls = {"n": 0}

    def write_then_fail():
        calls["n"] += 1
        armed["on"] = calls["n"] >= 2
        real_write()

    storage._write = write_then_fail
    with pytest.raises(OSError, match="injected failure"):
        storage.record_report(ReportRound({"i": 0}, report_index=0, attempt=attempt, staged=True, dir_name="epoch_0"))
    assert (tmp_path / "run" / "epoch_0").is_dir()  # moved, but never committed
    storage.close()
    resumed = RunStorage(str(tmp_path), "run")
    resumed.open("again")
    assert not (tmp_path / "run" / "epoch_0").exists()
    assert resumed.committed_checkpoint is None
    resumed.close()


# -- NO_UPLOAD -------------------------------------------------------------------------------------


def no_upload_loop(config):
    seen = []
    for step in range(2):
        checkpoint = write(os.path.join(run_dir(config), f"mine_{step}"), text=f"step {step}")
        train.report({"step": step}, checkpoint=checkpoint, checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
        seen.append(train.get_checkpoint() == checkpoint)
    return seen


def test_no_upload_records_the_checkpoint_where_it_is_and_retention_deletes_it(tmp_path):
    result = local_fit(no_upload_loop, tmp_path, checkpoint_config=CheckpointConfig(num_to_keep=1))
    run = tmp_path / "run"
    assert result.return_value == [True, True]  # get_checkpoint() is the reported one at once
    assert result.checkpoint.path == str(run / "mine_1") and read(result.checkpoint) == "step 1"
    assert not (run / "mine_0").exists()  # dropped by retention like any checkpoint
    names = [c["dir_name"] for c in json.loads((run / "run.json").read_text())["checkpoints"]]
    assert names == ["mine_1"]


def test_no_upload_of_a_folder_outside_the_run_folder_is_refused(tmp_path):
    session = make_session(tmp_path, [])
    with pytest.raises(ValueError, match="not a folder directly inside the run folder"):
        session.report({}, write(str(tmp_path / "elsewhere")), CheckpointUploadMode.NO_UPLOAD)
    assert session.num_reports == 0


# -- checkpoint_upload_fn ----------------------------------------------------------------------------


def upload_fn_loop(config):
    names = []

    def upload(checkpoint, checkpoint_dir_name):
        names.append(checkpoint_dir_name)
        target = train.get_context().get_storage().experiment_fs_path + "/" + checkpoint_dir_name
        shutil.copytree(checkpoint.path, target)
        with open(os.path.join(target, "by_fn.txt"), "w") as f:
            f.write("yes")
        return Checkpoint.from_directory(target)

    checkpoint = write(os.path.join(config["scratch"], "0"))
    train.report({"step": 0}, checkpoint=checkpoint, checkpoint_dir_name="custom", checkpoint_upload_fn=upload)
    return names


def test_checkpoint_upload_fn_does_the_upload_and_the_result_is_committed(tmp_path):
    result = DataParallelTrainer(
        upload_fn_loop,
        train_loop_config={"scratch": str(tmp_path / "scratch")},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="run", storage_path=str(tmp_path)),
    ).fit()
    [name] = result.return_value
    assert name.startswith(".staging/")  # written to staging, then committed by the run
    assert result.checkpoint.path == str(tmp_path / "run" / "custom")
    assert read(result.checkpoint, "by_fn.txt") == "yes" and read(result.checkpoint) == "weights"


def test_checkpoint_upload_fn_must_return_a_checkpoint_inside_the_run_folder(tmp_path):
    session = make_session(tmp_path, [])
    outside = lambda checkpoint, name: Checkpoint.from_directory(checkpoint.path)  # noqa: E731
    with pytest.raises(ValueError, match="outside the run folder"):
        session.report({}, write(str(tmp_path / "local")), CheckpointUploadMode.SYNC, upload_fn=outside)
    with pytest.raises(TypeError, match="must return the uploaded checkpoint"):
        session.report({}, write(str(tmp_path / "local")), CheckpointUploadMode.SYNC, upload_fn=lambda c, n: n)


# -- delete_local_checkpoint_after_upload -----------------------------------------------------------


@pytest.mark.parametrize(
    "mode, delete, deleted",
    [
        (CheckpointUploadMode.SYNC, None, False),
        (CheckpointUploadMode.SYNC, True, True),
        (CheckpointUploadMode.ASYNC, None, True),
        (CheckpointUploadMode.ASYNC, False, False),
    ],
)
def test_delete_local_checkpoint_after_upload_follows_ray_defaults(tmp_path, mode, delete, deleted):
    events = []
    session = make_session(tmp_path, events)
    source = write(str(tmp_path / "local"))
    session.report({}, source, mode, delete_local=delete)
    session.flush()
    assert len(events) == 1 and events[0].staged
    assert (tmp_path / "run" / ".staging" / "attempt_0001" / "report_000000" / "model.txt").read_text() == "weights"
    # deleted: its files are gone (an ASYNC report leaves the folder itself, empty, for the next checkpoint)
    assert (not os.path.exists(source.path) or not os.listdir(source.path)) is deleted


def test_deleting_a_checkpoint_folder_that_holds_the_run_is_refused(tmp_path):
    session = make_session(tmp_path, [])
    with pytest.raises(ValueError, match="run folder .* is inside the checkpoint folder"):
        session.report({}, Checkpoint.from_directory(str(tmp_path)), CheckpointUploadMode.SYNC, delete_local=True)


# -- resume_from_checkpoint ---------------------------------------------------------------------------


def resume_loop(config):
    checkpoint = train.get_checkpoint()
    start = read(checkpoint) if checkpoint else None
    train.report({"start": start}, checkpoint=write(os.path.join(config["scratch"], "x"), text="own"))
    return start


def test_resume_from_checkpoint_starts_a_new_run_and_the_runs_own_checkpoints_win(tmp_path):
    given = write(str(tmp_path / "given"), text="given")

    def fit():
        return DataParallelTrainer(
            resume_loop,
            train_loop_config={"scratch": str(tmp_path / "scratch")},
            scaling_config=ScalingConfig(num_workers=0),
            run_config=RunConfig(name="run", storage_path=str(tmp_path)),
            resume_from_checkpoint=given,
        ).fit()

    first = fit()
    assert first.return_value == "given"  # storage held no checkpoint: starts from the given one
    assert read(first.checkpoint) == "own"
    second = fit()  # same run: its own checkpoint wins
    assert second.return_value == "own"


# -- two workers on Ray: names, get_checkpoint() on every rank, SYNC and NO_UPLOAD merged -----------


def two_rank_loop(config):
    rank = train.get_context().get_world_rank()
    seen = []
    # Step 0: both ranks upload, default name. Step 1: both upload, rank 0's name counts.
    for step, name in enumerate([None, "named_1"]):
        checkpoint = write(os.path.join(config["scratch"], f"{rank}_{step}"), name=f"shard_{rank}.txt")
        train.report(
            {"step": step}, checkpoint=checkpoint, checkpoint_dir_name=name if rank == 0 else f"ignored_{step}"
        )
        seen.append(os.path.basename(train.get_checkpoint().path))
    # Step 2: rank 0 uploads, rank 1 writes straight into the run folder: one checkpoint of both.
    if rank == 0:
        train.report(
            {"step": 2},
            checkpoint=write(os.path.join(config["scratch"], "0_2"), name="shard_0.txt"),
            checkpoint_dir_name="mixed_2",
        )
    else:
        placed = write(os.path.join(run_dir(config), "mixed_2"), name="shard_1.txt")
        train.report({"step": 2}, checkpoint=placed, checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
        seen.append(os.path.basename(train.get_checkpoint().path))
    with open(os.path.join(config["scratch"], f"seen_{rank}.json"), "w") as f:
        json.dump(seen, f)


def test_two_ranks_see_each_committed_checkpoint_and_merge_upload_modes(tmp_path, ray_local):
    scratch = tmp_path / "scratch"
    result = DataParallelTrainer(
        two_rank_loop,
        train_loop_config={"scratch": str(scratch)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="run", storage_path=str(tmp_path)),
    ).fit()
    assert json.loads((scratch / "seen_0.json").read_text()) == ["checkpoint_000000", "named_1"]
    assert json.loads((scratch / "seen_1.json").read_text()) == ["checkpoint_000000", "named_1", "mixed_2"]
    assert result.checkpoint.path == str(tmp_path / "run" / "mixed_2")
    assert [os.path.basename(c.path) for c, _ in result.best_checkpoints] == ["checkpoint_000000", "named_1", "mixed_2"]
    assert sorted(os.listdir(result.checkpoint.path)) == ["shard_0.txt", "shard_1.txt"]
    assert sorted(os.listdir(tmp_path / "run" / "named_1")) == ["shard_0.txt", "shard_1.txt"]
