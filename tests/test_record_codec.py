"""One codec writes and reads the run record's typed records (``storage.codec``): the JSON on disk
is what the hand-written methods wrote before it, byte for byte, and records of older and newer
writers are read."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math

import pytest

from storage.codec import UNWRITTEN, Record, Round6, from_json, to_json
from storage.health import (
    GoodputAccount,
    MemoryPeak,
    PreflightRecord,
    StragglerRecord,
    Timeline,
    TimelineMark,
    TimelineRound,
)
from storage.metric_values import TAG, decode, encode
from storage.metrics_log import ReportEntry
from storage.positions import (
    DataResume,
    LoaderRecord,
    RankPosition,
    RoundPosition,
    ShardRecord,
    SkippedRows,
    SkippedSamples,
)
from storage.snapshot import CheckpointRecord, DroppedCheckpoint, RestartRecord, RunSnapshot
from storage.upload import UploadStats
from trainers.doctor import CheckResult, DoctorReport, NodeFacts

NAN = math.nan


def _snapshot() -> RunSnapshot:
    """A snapshot holding every kind of record, in every shape it takes."""
    first = RankPosition({"train": ShardRecord(1, 40), "val": ShardRecord(0, 3)}, (LoaderRecord(2, 5),))
    return RunSnapshot(
        name="run",
        attempt=3,
        num_failures=1,
        num_preemptions=2,
        num_reports=9,
        checkpoints=[
            CheckpointRecord(
                0,
                "checkpoint_000000",
                {"loss": 0.5, "t": (1, 2), "when": datetime.datetime(2024, 1, 2, 3, 4, 5), "nan": NAN},
                3,
                validation={"fn_kwargs": {"a": 1}, "timeout_s": 3.0},
                upload=UploadStats(123, 1.23456789, 2),
                data_position=RoundPosition(3, (first, None, RankPosition())),
            ),
            CheckpointRecord(
                1,
                "c1",
                {},
                5,
                status="VALIDATED",
                data_position=RoundPosition(
                    2,
                    (
                        RankPosition({"train": ShardRecord(1, 40)}),
                        RankPosition(loaders=(LoaderRecord(2, 5), LoaderRecord(0, 0))),
                    ),
                ),
            ),
            CheckpointRecord(2, "c2", {"x": [1, (2, 3)]}, 7),
        ],
        next_seq=3,
        to_delete=["c0x"],
        dropped=[
            DroppedCheckpoint(5, "d", 1, 0.3, "why", UploadStats(1, 0.5)),
            DroppedCheckpoint(6, "e", 2, None, "why2", None, {"m": (1,)}),
        ],
        finished=True,
        error="boom",
        updated_at=12.5,
        score_attribute="loss",
        score_order="min",
        tracking={"mlflow": {"run_id": "abc"}},
        data_resumes=[
            DataResume(
                False, ("a", "b"), {"train": SkippedRows(1, 40)}, (SkippedSamples(2, 5),), attempt=2, checkpoint="c1"
            ),
            DataResume(exact=True),
        ],
        restarts=[RestartRecord(1, kept=(0, 2), replaced={3: "died", 1: "hung"}), RestartRecord(2, full_restart="why")],
        peak_memory=[MemoryPeak(100), None, MemoryPeak(5, 6, 7, 8), MemoryPeak(5, limit_bytes=9)],
        stragglers=[StragglerRecord(1, 2, "node", 3, 4, 1.5, 0.25, 0.125)],
        goodput=[GoodputAccount(10.123456789, 1.0, 2.5, 0.1, 0.2, 0.3, 0.4, 0.0012345678, 0.0, 0.7777777777)],
        preflight=[
            PreflightRecord(1.23456789, (9.87654321, 1.0), 3.14159265, ("eth0", "")),
            PreflightRecord(0.5, (), None),
        ],
        workers_parked=["parked 2 of 2", "not parked: x"],
    )


#: run.json of ``_snapshot()`` as the hand-written ``to_json`` methods wrote it (commit 9eda33d).
SNAPSHOT = {'name': 'run', 'attempt': 3, 'num_failures': 1, 'num_preemptions': 2, 'num_reports': 9, 'checkpoints': [{'seq': 0, 'dir_name': 'checkpoint_000000', 'metrics': {'loss': 0.5, 't': {'__flowtrain_value__': 'tuple', 'value': [1, 2]}, 'when': {'__flowtrain_value__': 'datetime', 'value': '2024-01-02T03:04:05'}, 'nan': NAN}, 'report': 3, 'status': 'COMMITTED', 'validation': {'fn_kwargs': {'a': 1}, 'timeout_s': 3.0}, 'upload': {'bytes': 123, 'seconds': 1.234568, 'retries': 2}, 'data_position': {'world_size': 3, 'ranks': [{'datasets': {'train': {'epoch': 1, 'rows': 40}, 'val': {'epoch': 0, 'rows': 3}}, 'loaders': [{'epoch': 2, 'samples': 5}]}, None, {}]}}, {'seq': 1, 'dir_name': 'c1', 'metrics': {}, 'report': 5, 'status': 'VALIDATED', 'validation': False, 'upload': None, 'data_position': {'world_size': 2, 'ranks': [{'datasets': {'train': {'epoch': 1, 'rows': 40}}}, {'loaders': [{'epoch': 2, 'samples': 5}, {'epoch': 0, 'samples': 0}]}]}}, {'seq': 2, 'dir_name': 'c2', 'metrics': {'x': [1, {'__flowtrain_value__': 'tuple', 'value': [2, 3]}]}, 'report': 7, 'status': 'COMMITTED', 'validation': False, 'upload': None, 'data_position': None}], 'next_seq': 3, 'to_delete': ['c0x'], 'dropped': [{'seq': 5, 'dir_name': 'd', 'report': 1, 'score': 0.3, 'why': 'why', 'upload': {'bytes': 1, 'seconds': 0.5, 'retries': 0}, 'metrics': None}, {'seq': 6, 'dir_name': 'e', 'report': 2, 'score': None, 'why': 'why2', 'upload': None, 'metrics': {'m': {'__flowtrain_value__': 'tuple', 'value': [1]}}}], 'finished': True, 'error': 'boom', 'updated_at': 12.5, 'score_attribute': 'loss', 'score_order': 'min', 'tracking': {'mlflow': {'run_id': 'abc'}}, 'data_resumes': [{'attempt': 2, 'checkpoint': 'c1', 'exact': False, 'why': ['a', 'b'], 'datasets': {'train': {'epoch': 1, 'rows_skipped': 40}}, 'loaders': [{'epoch': 2, 'samples_skipped': 5}]}, {'attempt': None, 'checkpoint': None, 'exact': True, 'why': [], 'datasets': {}, 'loaders': []}], 'restarts': [{'attempt': 1, 'kept': [0, 2], 'replaced': {'1': 'hung', '3': 'died'}, 'full_restart': None}, {'attempt': 2, 'kept': [], 'replaced': {}, 'full_restart': 'why'}], 'peak_memory': [{'rss_bytes': 100}, None, {'rss_bytes': 5, 'cuda_allocated_bytes': 6, 'cuda_reserved_bytes': 7, 'limit_bytes': 8}, {'rss_bytes': 5, 'limit_bytes': 9}], 'stragglers': [{'attempt': 1, 'rank': 2, 'node': 'node', 'report_index': 3, 'steps': 4, 'ratio': 1.5, 'step_s': 0.25, 'median_step_s': 0.125}], 'goodput': [{'wall_s': 10.123457, 'starting_s': 1.0, 'training_s': 2.5, 'checkpoint_s': 0.1, 'restarting_s': 0.2, 'rolled_back_s': 0.3, 'waiting_s': 0.4, 'worker_hours': 0.001235, 'gpu_hours': 0.0, 'data_wait_s': 0.777778}], 'preflight': [{'seconds': 1.2346, 'gflops': [9.8765, 1.0], 'bus_gbps': 3.14159265, 'interfaces': ['eth0', '']}, {'seconds': 0.5, 'gflops': [], 'bus_gbps': None, 'interfaces': []}], 'workers_parked': ['parked 2 of 2', 'not parked: x'], 'format': 2}  # fmt: skip


def test_run_json_is_written_byte_for_byte_as_before_and_reads_back_the_same():
    snapshot = _snapshot()
    written = snapshot.to_json()
    assert written == json.dumps(SNAPSHOT, allow_nan=True).encode()
    again = RunSnapshot.from_json(written)
    assert again.to_json() == written
    assert again.checkpoints[0].metrics["t"] == (1, 2)  # metric values keep their types (storage.metric_values)
    assert isinstance(again.checkpoints[0].metrics["when"], datetime.datetime)
    assert again.restarts[0].replaced == {1: "hung", 3: "died"} and again.restarts[0].kept == (0, 2)
    assert again.data_resumes == snapshot.data_resumes and again.peak_memory == snapshot.peak_memory
    # Seconds are written to the microsecond (the pre-flight figures to 4 decimals); memory keeps every digit.
    assert snapshot.goodput[0].wall_s == 10.123456789 and again.goodput[0].wall_s == 10.123457
    assert again.preflight[0] == PreflightRecord(1.2346, (9.8765, 1.0), 3.14159265, ("eth0", ""))
    assert again.checkpoints[1:] == snapshot.checkpoints[1:]


def test_an_older_and_a_newer_writers_run_json_is_read():
    """An older writer's run.json lacks fields added since (they take their defaults); a newer
    one's has fields this one does not know (they are ignored)."""
    body = json.loads(json.dumps(SNAPSHOT, allow_nan=True))
    for name in ("workers_parked", "preflight", "data_resumes", "restarts"):
        del body[name]
    del body["goodput"][0]["data_wait_s"]
    del body["dropped"][0]["metrics"], body["dropped"][0]["upload"]["retries"]
    body["added_by_a_newer_writer"] = {"x": 1}
    body["checkpoints"][0]["data_position"]["ranks"][0]["added"] = 1
    body["stragglers"][0]["added"] = 2
    snapshot = RunSnapshot.from_json(json.dumps(body, allow_nan=True).encode())
    assert snapshot.workers_parked == [] and snapshot.preflight == [] and snapshot.restarts == []
    assert snapshot.goodput[0].data_wait_s == 0.0 and snapshot.dropped[0].metrics is None
    assert snapshot.dropped[0].upload == UploadStats(1, 0.5, 0)
    assert snapshot.checkpoints[0].data_position == _snapshot().checkpoints[0].data_position
    assert snapshot.stragglers == _snapshot().stragglers


#: The timeline file and the doctor's ``--json`` report of the records below, as written before.
TIMELINE = {'run_name': 'run', 'world_size': 2, 'phases': [['starting', 0.0, 1.5], ['training', 1.5, 3.25]], 'rolled_back': [[1.0, 2.0]], 'rounds': [[0.5, 1, 0, False, [0.1, None]], [1.0, 1, 1, True, [0.2, 0.3]]], 'marks': [{'t': 1.2, 'attempt': 1, 'rank': 1, 'what': 'died'}]}  # fmt: skip
DOCTOR = {'checks': [{'name': 'node', 'status': 'ok', 'found': 'fine', 'fix': '', 'where': ''}, {'name': 'storage', 'status': 'FAIL', 'found': 'bad', 'fix': 'fix it', 'where': 'node x'}], 'driver': {'node_id': 'abc', 'ip': '1.2.3.4', 'hostname': 'h', 'ray_version': '2.60', 'python_version': '3.11.7', 'flowtrain_version': None, 'visible_gpus': 2, 'gpu_source': 'dev', 'resources': {'CPU': 2.0, 'GPU': 1.0}}, 'nodes': [{'node_id': 'abc', 'ip': '1.2.3.4', 'hostname': 'h', 'ray_version': '2.60', 'python_version': '3.11.7', 'flowtrain_version': None, 'visible_gpus': 2, 'gpu_source': 'dev', 'resources': {'CPU': 2.0, 'GPU': 1.0}}], 'failed': 1}  # fmt: skip


def test_the_timeline_file_and_the_doctor_report_are_written_as_before():
    timeline = Timeline(
        "run",
        2,
        (("starting", 0.0, 1.5), ("training", 1.5, 3.25)),
        ((1.0, 2.0),),
        (TimelineRound(0.5, 1, 0, False, (0.1, None)), TimelineRound(1.0, 1, 1, True, (0.2, 0.3))),
        (TimelineMark(1.2, 1, 1, "died"),),
    )
    assert json.dumps(timeline.to_json()) == json.dumps(TIMELINE)  # a round as a list: [t, attempt, ...]
    assert Timeline.from_json(TIMELINE) == timeline
    node = NodeFacts("abc", "1.2.3.4", "h", "2.60", "3.11.7", None, 2, "dev", {"CPU": 2.0, "GPU": 1.0})
    checks = (CheckResult("node", "ok", "fine"), CheckResult("storage", "FAIL", "bad", "fix it", "node x"))
    report = DoctorReport(checks, node, (node,))
    assert json.dumps(report.to_json()) == json.dumps(DOCTOR)
    assert DoctorReport.from_json(DOCTOR) == report  # "failed" is the report's count, not a field


def test_every_record_reads_back_what_it_wrote():
    snapshot = _snapshot()
    records: list[Record] = [
        *snapshot.checkpoints[1:],  # the first holds NaN, never equal to itself (the test above reads it)
        *snapshot.dropped,
        *snapshot.data_resumes,
        *snapshot.restarts,
        *filter(None, snapshot.peak_memory),
        *snapshot.stragglers,
        *snapshot.goodput,
        *snapshot.preflight,
        ReportEntry(1, 2, {"a": 1.5}),
    ]
    for record in records:
        written = json.dumps(encode(record.to_json()))  # as run.json writes it: metric values tagged
        again = type(record).from_json(decode(json.loads(written)))
        assert again == record or again.to_json() == record.to_json(), record  # == but for rounded figures


@dataclasses.dataclass(frozen=True)
class _Inner(Record):
    n: int
    x: float = 0.0


@dataclasses.dataclass
class _Outer(Record):
    inner: _Inner
    by_rank: dict[int, _Inner] = dataclasses.field(default_factory=dict)
    pairs: tuple[tuple[str, float], ...] = ()
    maybe: _Inner | None = None
    anything: object = None
    free: dict[str, object] = dataclasses.field(default_factory=dict)
    cache: list[int] = dataclasses.field(default_factory=list, metadata=UNWRITTEN)
    took: Round6 = 0.0


def test_the_codecs_rules():
    outer = _Outer(
        _Inner(1), {10: _Inner(2, 0.5), 2: _Inner(3)}, (("a", 1.5),), None, (1, 2), {"t": (3,)}, [7], 0.1234567
    )
    body = to_json(outer)
    assert body == {
        "inner": {"n": 1, "x": 0.0},
        "by_rank": {"2": {"n": 3, "x": 0.0}, "10": {"n": 2, "x": 0.5}},  # int keys as text, in order
        "pairs": [["a", 1.5]],
        "maybe": None,
        "anything": (1, 2),  # a value hinted Any (or object) is left for storage.metric_values to tag
        "free": {"t": (3,)},
        "took": 0.123457,  # Round6: to the microsecond on disk
    }
    assert list(body["by_rank"]) == ["2", "10"]
    again = from_json(_Outer, json.loads(json.dumps(body)))
    assert again.by_rank == {2: _Inner(3), 10: _Inner(2, 0.5)} and again.pairs == (("a", 1.5),)
    assert again.cache == []  # not written, so not read
    assert from_json(_Inner, {"n": 4, "x": 2, "new": "ignored"}) == _Inner(4, 2.0)  # a float, though written 2
    assert isinstance(from_json(_Inner, {"n": 4, "x": 2}).x, float)
    assert from_json(_Inner, [5, 1.5]) == _Inner(5, 1.5)  # a record written as a list is read by position
    with pytest.raises(TypeError):
        from_json(_Inner, {"x": 1.0})  # a field without a default must be there


def test_a_record_that_never_changes_is_encoded_once_and_written_the_same():
    # run.json rewrites every kept DroppedCheckpoint at each commit: a commit must cost the same
    # with 32 of them as with none (issue 59), and what is written must not change.
    metrics = {"loss": 0.25, "epoch": 3, "nested": {"acc": float("nan")}}
    dropped = DroppedCheckpoint(4, "checkpoint_000004", 41, 0.25, "not among the 2 best", None, metrics)
    body = to_json(dropped)
    assert to_json(dropped) is body
    fresh = to_json(DroppedCheckpoint(4, "checkpoint_000004", 41, 0.25, "not among the 2 best", None, dict(metrics)))
    assert json.dumps(encode(fresh), sort_keys=True) == json.dumps(encode(body), sort_keys=True)
    assert dropped == DroppedCheckpoint(4, "checkpoint_000004", 41, 0.25, "not among the 2 best", None, metrics)
    renamed = dataclasses.replace(dropped, dir_name="epoch_4")
    assert to_json(renamed)["dir_name"] == "epoch_4" and body["dir_name"] == "checkpoint_000004"
    plain = DroppedCheckpoint(5, "checkpoint_000005", 51, None, "older", None, {"loss": 0.2})
    to_json(plain)
    assert RunSnapshot.from_json(RunSnapshot(name="r", dropped=[plain]).to_json()).dropped == [plain]
    # Its metric values are tagged once too: a commit's walk over the values passes the body by.
    tagged = DroppedCheckpoint(6, "c6", 61, (1, 2), "older", None, {"pair": (1, 2), TAG: "a user's key"})
    assert encode(to_json(tagged)) is to_json(tagged)
    for _ in range(2):  # the first write encodes it, the second reuses what the first made
        assert RunSnapshot.from_json(RunSnapshot(name="r", dropped=[tagged]).to_json()).dropped == [tagged]
