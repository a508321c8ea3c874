"""The run's metrics history as an append-only log (``storage.metrics_log``), on real files.

Every report once and in order across restarts (each a rewind to the latest checkpoint) and
segment rolls, on local disk (appended) and on a filesystem that cannot append (each segment
rewritten, as on S3); run.json bounded whatever the history's length; a run folder written
before the log (run.json format 1) resumed with the same history; a line cut off by a crash
skipped; a ``Result`` unchanged by a later run in the same folder. The same through ``fit()``
on real Ray workers: a restart's rewind and ``Result.from_path``.
"""

from __future__ import annotations

import json
import os
import pathlib

import pyarrow.fs as pafs
import pytest

from faulty_fs import faulty_fs
from run_history import recorded_reports
from storage import CheckpointConfig, RunStorage, load_run, metrics_log
from storage.layout import RunLayout
from storage.metrics_log import read_history, segments
from test_storage_run import report


def steps(history) -> list[int]:
    return [metrics["step"] for metrics in history]


def restarted_run(storage: RunStorage) -> list[int]:
    """Two attempts: the first reports steps 0-11 with a checkpoint at 7 and fails; the second
    resumes after step 7 and reports 8-14. Returns the steps the history must hold."""
    storage.open("me")
    attempt = storage.start_attempt()
    for step in range(12):
        report(storage, attempt, step, {"step": step, "pair": (step, attempt)}, checkpoint=step == 7)
    storage.record_failure()
    assert storage.rewind_to_latest_checkpoint() is not None
    assert storage.num_reports == 8
    attempt = storage.start_attempt()
    for index, step in enumerate(range(8, 15)):
        report(storage, attempt, index, {"step": step, "pair": (step, attempt)})
    storage.finish()
    return list(range(15))


@pytest.mark.parametrize("appends", [True, False], ids=["local-appends", "object-store-rewrites"])
def test_every_report_once_in_order_across_a_rewind_and_segment_rolls(tmp_path, monkeypatch, appends):
    monkeypatch.setattr(metrics_log, "SEGMENT_REPORTS", 4)
    fs, handler = (pafs.LocalFileSystem(), None) if appends else faulty_fs()
    storage = RunStorage(str(tmp_path), "run", filesystem=fs)
    expected = restarted_run(storage)

    view = load_run(str(tmp_path / "run"), fs)
    assert steps(view.metrics_history) == expected and len(view.metrics_history) == 15
    assert [m["pair"] for m in view.metrics_history][7:9] == [(7, 1), (8, 2)]  # step 8 as attempt 2 made it
    assert view.last_metrics == {"step": 14, "pair": (14, 2)}
    assert view.metrics_history[9]["step"] == 9 and view.metrics_history[-1]["step"] == 14
    names = [os.path.basename(path) for path in segments(fs, RunLayout(str(tmp_path / "run")))]
    # Attempt 1's reports in 3 segments of at most 4, the cut at attempt 2's start, its 7 in 2.
    assert names == [
        "00000001-0000.jsonl",
        "00000001-0001.jsonl",
        "00000001-0002.jsonl",
        "00000002-0000.jsonl",
        "00000002-0001.jsonl",
    ]
    if handler is not None:  # no appends where the filesystem has none: each flush rewrites its segment
        assert not [op for op, _ in handler.ops if op == "append"]


def test_run_json_stays_small_whatever_the_history_and_the_driver_keeps_a_bounded_tail(tmp_path, monkeypatch):
    from storage import run_storage

    monkeypatch.setattr(metrics_log, "TAIL_REPORTS", 50)
    monkeypatch.setattr(run_storage, "DROPPED_KEPT", 2)
    sizes = []
    storage = RunStorage(str(tmp_path), "run", checkpoint_config=CheckpointConfig(num_to_keep=1))
    storage.open("me")
    attempt = storage.start_attempt()
    for step in range(2000):
        report(storage, attempt, step, {"step": step, "loss": 1 / (step + 1)}, checkpoint=step % 500 == 499)
        if step % 500 == 499:
            sizes.append((tmp_path / "run" / "run.json").stat().st_size)
    assert len(storage.log.tail) == 50 and storage.log.tail[-1]["step"] == 1999
    # 500 reports add nothing; a checkpoint adds its dropped predecessor's record, up to DROPPED_KEPT.
    assert sizes[1] - sizes[0] < 300 and abs(sizes[3] - sizes[2]) < 20, sizes
    assert len(storage.history_now()) == 2000  # read from the log: more than the tail
    storage.finish()
    assert steps(load_run(str(tmp_path / "run")).metrics_history) == list(range(2000))


def test_a_result_keeps_its_history_when_a_later_run_reuses_the_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics_log, "TAIL_REPORTS", 3)  # so the first run's history is read from the log
    first = RunStorage(str(tmp_path), "run")
    first.open("a")
    attempt = first.start_attempt()
    for step in range(6):
        report(first, attempt, step, {"step": step}, checkpoint=step == 2)
    first.finish()
    history = first.history_now()

    second = RunStorage(str(tmp_path), "run")
    second.open("b")  # resumes after step 2: steps 3.. are made again, differently
    attempt = second.start_attempt()
    for index in range(5):
        report(second, attempt, index, {"step": 3 + index, "again": True})
    second.finish()
    assert steps(history) == [0, 1, 2, 3, 4, 5] and not any("again" in m for m in history)
    assert steps(load_run(str(tmp_path / "run")).metrics_history) == [0, 1, 2, 3, 4, 5, 6, 7]


def test_a_line_cut_off_by_a_crash_is_skipped(tmp_path):
    storage = RunStorage(str(tmp_path), "run")
    storage.open("me")
    attempt = storage.start_attempt()
    for step in range(3):
        report(storage, attempt, step, {"step": step})
    storage.finish()
    (segment,) = (tmp_path / "run" / ".metrics").iterdir()
    with open(segment, "ab") as out:
        out.write(b'{"report": 3, "attempt": 1, "index": 3, "metr')  # the driver died mid-write
    assert steps(load_run(str(tmp_path / "run")).metrics_history) == [0, 1, 2]
    assert [line["report"] for line in map(json.loads, segment.read_text().splitlines()[1:3])] == [0, 1]


def test_local_lines_are_appended_in_batches_and_a_failed_batch_is_written_by_the_next_flush(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics_log, "APPEND_LINES", 3)
    fs, layout = pafs.LocalFileSystem(), RunLayout(str(tmp_path / "run"))
    lease_fails = [False, True, True, True]  # the first batch's check passes, the next three fail

    def lease_check() -> None:
        if lease_fails and lease_fails.pop(0):
            raise OSError("the lease could not be checked")

    log = metrics_log.MetricsLog(fs, layout, still_owner=lease_check)
    for step in range(4):
        log.append(1, step, {"step": step})
    # The header and 2 reports made the first batch of 3, written before any flush was asked for.
    assert steps(entry.metrics for entry in read_history(fs, layout)) == [0, 1]
    for step in range(4, 7):
        log.append(1, step, {"step": step})  # each try at the next batch fails: its lines wait
    assert steps(entry.metrics for entry in read_history(fs, layout)) == [0, 1] and not lease_fails
    log.flush()
    assert steps(entry.metrics for entry in read_history(fs, layout)) == list(range(7))


def format_1_run(folder: pathlib.Path) -> list[dict]:
    """A run folder as flowtrain wrote it before the metrics log: every report in run.json
    (format 1), a checkpoint at the third report, and one dropped before it."""
    reports = [
        {
            "attempt": 1,
            "report_index": i,
            "metrics": {"step": i, "when": {"__flowtrain_value__": "tuple", "value": [i, 1]}},
        }
        for i in range(4)
    ]
    (folder / "checkpoint_000001").mkdir(parents=True)
    (folder / "checkpoint_000001" / "model.txt").write_text("step 2")
    checkpoint = {"seq": 1, "dir_name": "checkpoint_000001", "metrics": reports[2]["metrics"], "report": 2}
    dropped = {"seq": 0, "dir_name": "checkpoint_000000", "report": 0, "score": None, "why": "not among the best 1"}
    body = {
        "name": folder.name,
        "attempt": 1,
        "num_failures": 0,
        "num_preemptions": 0,
        "reports": reports,
        "checkpoints": [checkpoint],
        "next_seq": 2,
        "dropped": [dropped],
        "finished": False,
        "format": 1,
    }
    (folder / "run.json").write_text(json.dumps(body))
    return reports


def test_a_run_folder_written_before_the_log_is_read_and_resumed_with_the_same_history(tmp_path):
    from trainers import Result

    folder = tmp_path / "old"
    format_1_run(folder)
    before = Result.from_path(str(folder))
    assert steps(before.metrics_dataframe.to_dict("records")) == [0, 1, 2, 3]
    assert before.metrics == {"step": 3, "when": (3, 1)}
    view = load_run(str(folder))
    assert view.snapshot.dropped[0].metrics == {"step": 0, "when": (0, 1)}  # for the checkpoints table

    storage = RunStorage(str(tmp_path), "old")
    storage.open("me")  # moves the reports into the log, then forgets those after the checkpoint
    assert steps(storage.metrics_history) == [0, 1, 2]
    attempt = storage.start_attempt()
    report(storage, attempt, 0, {"step": 3, "when": (3, 2)})
    storage.finish()
    after = Result.from_path(str(folder))
    assert list(after.metrics_dataframe["step"]) == [0, 1, 2, 3] and after.metrics["when"] == (3, 2)
    assert [r["metrics"]["when"] for r in recorded_reports(folder)] == [(0, 1), (1, 1), (2, 1), (3, 2)]
    assert json.loads((folder / "run.json").read_text())["format"] == 2
    assert "reports" not in json.loads((folder / "run.json").read_text())


@pytest.mark.usefixtures("ray_local")
def test_fit_restarts_and_from_path_give_every_report_once_in_order(tmp_path):
    from loops import checkpointing_loop
    from trainers import FailureConfig, Result, RunConfig, ScalingConfig
    from trainers.torch import TorchTrainer

    config = {"steps": 6, "every": 2, "fail_at": 3, "fail_marker": str(tmp_path / "failed")}
    result = TorchTrainer(
        checkpointing_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="run", storage_path=str(tmp_path), failure_config=FailureConfig(max_failures=1)),
    ).fit()
    assert list(result.metrics_dataframe["step"]) == [0, 1, 2, 3, 4, 5]
    assert [r["attempt"] for r in recorded_reports(tmp_path / "run")] == [1, 1, 1, 2, 2, 2]  # 3 was made again
    again = Result.from_path(result.path)
    assert list(again.metrics_dataframe["step"]) == [0, 1, 2, 3, 4, 5] and again.metrics == result.metrics
    assert "reports" not in json.loads((tmp_path / "run" / "run.json").read_text())
    assert sum(1 for _ in read_history(pafs.LocalFileSystem(), RunLayout(result.path))) == 6
