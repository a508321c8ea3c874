"""The run snapshot (run.json): the one record of what a run has committed.

A checkpoint folder is real only when the snapshot names it. The snapshot is written as a new
file that then replaces the old one, and the old one is kept as ``run.json.prev``, so a write
cut off half way never leaves a run without a good snapshot.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any, Literal

from storage.codec import UNWRITTEN, Record, from_json, to_json
from storage.errors import SnapshotCorruptError
from storage.filesystem import exists, pafs, read_bytes, write_bytes
from storage.health import GoodputAccount, PreflightRecord, StragglerRecord
from storage.layout import RunLayout
from storage.memory_peak import MemoryPeak
from storage.metric_values import decode, encode
from storage.metrics_log import ReportEntry
from storage.positions import DataResume, RoundPosition
from storage.upload import UploadStats

#: 2: the reports are in the run's metrics log (``storage.metrics_log``); 1 kept them in run.json.
FORMAT = 2
READ_FORMATS = (1, 2)
#: Dropped checkpoints run.json remembers (the newest): the checkpoints table lists them, and a
#: long run that checkpoints often must not grow its commit point, rewritten at every commit.
DROPPED_KEPT = 32

#: ``CheckpointRecord.status`` values (Ray Train's ``ReportedCheckpointStatus`` names).
COMMITTED = "COMMITTED"
PENDING_VALIDATION = "PENDING_VALIDATION"
VALIDATED = "VALIDATED"
VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
VALIDATION_FAILED = "VALIDATION_FAILED"


@dataclasses.dataclass
class CheckpointRecord(Record):
    """One committed checkpoint: its number, folder name, metrics, and the report it came with."""

    seq: int
    dir_name: str
    #: Rank 0's reported metrics, with its validation's metrics merged in once it is validated.
    metrics: dict[str, Any]
    #: Position of its report in the run's history (``storage.metrics_log``).
    report: int
    #: COMMITTED, or where its validation stands (PENDING_VALIDATION, VALIDATED, ...).
    status: str = COMMITTED
    #: ``report(validation=...)``: False, True or ``{"fn_kwargs": ..., "timeout_s": ...}``; kept so a
    #: resumed run can validate it again.
    validation: Any = False
    #: How its files reached the storage, apart from the user's metrics: bytes summed over the
    #: ranks, the slowest rank's seconds, the tries made again (the ranks' and the commit's); None
    #: when nothing was uploaded (NO_UPLOAD, or written before this field).
    upload: UploadStats | None = None
    #: Where the workers' data iterators stood when it was reported, so a resume starts the epoch
    #: there; None when not kept.
    data_position: RoundPosition | None = None


@dataclasses.dataclass(frozen=True)
class DroppedCheckpoint(Record):
    """What is left of a checkpoint retention dropped: enough for the checkpoints table."""

    #: Never changed once made, and rewritten by every commit (``DROPPED_KEPT``): encoded once, so a
    #: commit costs the same with 0 and with 32 of them.
    JSON_ONCE = True

    seq: int
    dir_name: str
    #: Position of its report in the run's history (``storage.metrics_log``).
    report: int
    #: Its score attribute's value when it was dropped (a validation's, when it came from one);
    #: None without a score attribute.
    score: Any
    #: Why retention dropped it, as ``storage.retention`` said.
    why: str
    #: As ``CheckpointRecord.upload``.
    upload: UploadStats | None = None
    #: The metrics it was reported with (None in a record written before they were kept).
    metrics: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class RestartRecord(Record):
    """How the workers of one failed attempt were restarted: which ranks kept their processes,
    which were replaced and why, or why every worker was restarted."""

    #: The attempt that failed.
    attempt: int
    #: World ranks whose processes serve the next attempt.
    kept: tuple[int, ...] = ()
    #: World rank -> why its process was replaced ("its process died", "its process hung", "it
    #: did not stop within 10 s", ...). Empty with ``full_restart``.
    replaced: dict[int, str] = dataclasses.field(default_factory=dict)
    #: Why every worker was restarted instead of only the failed ranks; None when only ``replaced`` were.
    full_restart: str | None = None

    def describe(self) -> str:
        """One line: "replaced rank 1 (its process died); kept ranks 0, 2" or "restarted every worker: why"."""
        if self.full_restart is not None:
            return f"restarted every worker: {self.full_restart}"
        replaced = "; ".join(f"rank {rank} ({why})" for rank, why in sorted(self.replaced.items()))
        kept = ", ".join(map(str, self.kept)) or "none"
        return f"replaced {replaced or 'no rank'}; kept rank(s) {kept}"


@dataclasses.dataclass
class RunSnapshot:
    """Everything a run has committed: reports, checkpoints, attempts and failures."""

    name: str
    attempt: int = 0
    #: Restarts charged to ``FailureConfig.max_failures`` and to ``max_preemption_failures``:
    #: both budgets live here, so a rerun of ``fit()`` after a driver crash goes on spending them.
    num_failures: int = 0
    num_preemptions: int = 0
    #: Reports in the run's history (its metrics log) as of this snapshot.
    num_reports: int = 0
    checkpoints: list[CheckpointRecord] = dataclasses.field(default_factory=list)
    next_seq: int = 0
    #: Checkpoint folders retention dropped whose deletion has not succeeded yet.
    to_delete: list[str] = dataclasses.field(default_factory=list)
    #: What is left of each checkpoint retention dropped, oldest first (the newest ``DROPPED_KEPT``).
    dropped: list[DroppedCheckpoint] = dataclasses.field(default_factory=list)
    finished: bool = False
    error: str | None = None
    updated_at: float = 0.0
    #: The run's ``CheckpointConfig`` ranking rule, so a reader (``Result.from_path``) lists the
    #: checkpoints as the run ranked them: the score attribute (None: recency) and "max"/"min".
    score_attribute: str | None = None
    score_order: Literal["max", "min"] = "max"
    #: What experiment trackers keep about the run, by tracker (``{"mlflow": {"run_id": ...}}``),
    #: so a resumed run logs on into the same tracked run.
    tracking: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Each start from a checkpoint's data position, oldest first.
    data_resumes: list[DataResume] = dataclasses.field(default_factory=list)
    #: How the workers were restarted after each failed attempt, oldest first.
    restarts: list[RestartRecord] = dataclasses.field(default_factory=list)
    #: Each rank's peak memory in the run (the largest any attempt reached), by world rank; None
    #: for a rank that has not reported it.
    peak_memory: list[MemoryPeak | None] = dataclasses.field(default_factory=list)
    #: Every straggler episode, oldest first.
    stragglers: list[StragglerRecord] = dataclasses.field(default_factory=list)
    #: The goodput account of each ``fit()`` call, oldest first.
    goodput: list[GoodputAccount] = dataclasses.field(default_factory=list)
    #: The pre-flight check of each ``fit()`` call that ran one, oldest first.
    preflight: list[PreflightRecord] = dataclasses.field(default_factory=list)
    #: For each ``fit()`` call that ended cleanly with a worker group, oldest first: whether its
    #: workers were parked for the next ``fit()`` and, where not, why.
    workers_parked: list[str] = dataclasses.field(default_factory=list)

    @property
    def latest(self) -> CheckpointRecord | None:
        """The newest committed checkpoint's record (the highest ``seq``), or None: the one "latest"."""
        return max(self.checkpoints, key=lambda c: c.seq, default=None)

    #: Reports this snapshot holds that the run's metrics log does not, in order: those of a
    #: run.json written before the log (format 1) or of a ``ray.train`` folder. Not written:
    #: ``RunStorage.open`` moves them into the log. Not a field.
    unlogged_reports: list[ReportEntry] = dataclasses.field(
        default_factory=list, compare=False, repr=False, metadata=UNWRITTEN
    )

    def kept_reports(self) -> int:
        """How many reports a restart keeps: those up to the latest checkpoint's (none without one)."""
        latest = self.latest
        return latest.report + 1 if latest is not None else 0

    def to_json(self) -> bytes:
        """The snapshot as run.json; metric values JSON cannot hold are tagged (``storage.metric_values``)."""
        body = {**encode(to_json(self)), "format": FORMAT}
        # Each dropped record's text is made once: a commit writes the table's 32 without dumping
        # them again. The fields around the table are written as json.dumps writes the whole.
        names = list(body)
        at = names.index("dropped")
        before = json.dumps({name: body[name] for name in names[:at]}, allow_nan=True)[:-1]
        after = json.dumps({name: body[name] for name in names[at + 1 :]}, allow_nan=True)[1:]
        dropped = ", ".join(record.text() for record in body["dropped"])
        return f'{before}, "dropped": [{dropped}], {after}'.encode()

    @classmethod
    def from_json(cls, data: bytes) -> RunSnapshot:
        body = decode(json.loads(data))
        if not isinstance(body, dict) or body.get("format") not in READ_FORMATS:
            raise ValueError(f"unknown snapshot format {body.get('format') if isinstance(body, dict) else body!r}")
        body.pop("format")
        snapshot = from_json(cls, body)
        snapshot.unlogged_reports = [ReportEntry.from_json(r) for r in body.get("reports") or []]  # format 1
        if snapshot.unlogged_reports:
            snapshot.num_reports = len(snapshot.unlogged_reports)
            snapshot.dropped = [
                dataclasses.replace(d, metrics=snapshot.unlogged_reports[d.report].metrics)
                if d.metrics is None and 0 <= d.report < len(snapshot.unlogged_reports)
                else d
                for d in snapshot.dropped
            ]
        return snapshot


def write_snapshot(
    fs: pafs.FileSystem, layout: RunLayout, snapshot: RunSnapshot, *, still_owner: Callable[[], None] = lambda: None
) -> None:
    """Write new, keep the current as the previous good copy, then move the new one in place.

    ``still_owner`` (the lease's check) runs before the move: the new copy's write may have been
    stuck in a cut network until another driver took the run over.
    """
    snapshot.updated_at = time.time()
    write_bytes(fs, layout.snapshot_new, snapshot.to_json())
    still_owner()
    if exists(fs, layout.snapshot):
        fs.copy_file(layout.snapshot, layout.snapshot_previous)
    fs.move(layout.snapshot_new, layout.snapshot)


def read_snapshot(fs: pafs.FileSystem, layout: RunLayout, display: str) -> RunSnapshot | None:
    """The run's snapshot; the previous good copy if the current is damaged; None for a new run.

    Raises ``SnapshotCorruptError`` naming the path when neither copy can be read: a damaged run
    is never silently started over.
    """
    problems = []
    for path in (layout.snapshot, layout.snapshot_previous):
        if not exists(fs, path):
            continue
        try:
            return RunSnapshot.from_json(read_bytes(fs, path))
        except (ValueError, TypeError, KeyError) as error:
            problems.append(f"{path}: {error}")
    if problems:
        raise SnapshotCorruptError(
            f"the run state at {display} cannot be read ({'; '.join(problems)}); move the run folder "
            "away to start over, or restore run.json from a backup."
        )
    return None
