"""``RunRecord``: what training asks of a run's storage, so its users can be read (and tested with a
fake) without ``RunStorage``'s opening, tidying and filesystem details."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

from storage.checkpoint import Checkpoint
from storage.health import GoodputAccount, Timeline
from storage.layout import RunLayout
from storage.memory_peak import MemoryPeak
from storage.positions import DataResume, RoundPosition
from storage.snapshot import CheckpointRecord, RunSnapshot
from storage.upload import UploadStats

if TYPE_CHECKING:
    import pyarrow.fs as pafs


@dataclasses.dataclass(frozen=True)
class ReportRound:
    """One report round (every rank's ``report()`` of one step), as the controller asks the run's
    storage to record it: rank 0's metrics, and, when a rank passed a checkpoint, everything its
    commit keeps beside them. Built from the round's events in one place
    (``trainers._internal.run.round_commit``)."""

    metrics: dict[str, Any]
    report_index: int
    attempt: int
    #: A rank passed a checkpoint: its files wait in the attempt's staging folder, to be committed.
    staged: bool = False
    #: The validation the round asked for, as ``trainers.validation.request_to_json`` writes it;
    #: False when none. The checkpoint is kept, whatever its score, until ``record_validation``.
    validation: Any = False
    #: ``report(checkpoint_dir_name=...)``: the checkpoint folder's name (None: ``checkpoint_NNNNNN``).
    dir_name: str | None = None
    #: A worker already put the checkpoint at ``dir_name`` in the run folder
    #: (``CheckpointUploadMode.NO_UPLOAD``): it is recorded where it is.
    in_place: bool = False
    #: The ranks' uploads together (``UploadStats.combine``), kept beside the metrics.
    upload: UploadStats | None = None
    #: Where every rank's data stood (``trainers._internal.session.data_position.round_position``).
    data_position: RoundPosition | None = None
    #: Every rank's peak memory so far in this attempt, by world rank (None: not measured).
    memory: tuple[MemoryPeak | None, ...] = ()

    @property
    def commits(self) -> bool:
        """Whether recording this round commits a checkpoint."""
        return self.staged or self.in_place


class RunRecord(Protocol):
    """One run's record as the controller and the checkpoint validations use it (``RunStorage``)."""

    layout: RunLayout
    snapshot: RunSnapshot
    run_uri: str
    filesystem: pafs.FileSystem

    def start_attempt(self) -> int: ...
    def record_report(self, round_: ReportRound) -> Checkpoint | None: ...
    def record_validation(self, dir_name: str, metrics: dict[str, Any], status: str) -> None: ...
    def record_data_resume(self, note: DataResume) -> None: ...
    def append(self, name: str, record: Any) -> None: ...
    def record_goodput(self, account: GoodputAccount, workers_parked: str | None = None) -> None: ...
    def record_timeline(self, timeline: Timeline) -> str: ...
    def record_failure(self) -> int: ...
    def record_preemption(self) -> int: ...
    def rewind_to_latest_checkpoint(self) -> Checkpoint | None: ...
    @property
    def num_failures(self) -> int: ...
    @property
    def num_preemptions(self) -> int: ...
    @property
    def latest_checkpoint(self) -> Checkpoint | None: ...
    @property
    def latest_data_position(self) -> RoundPosition | None: ...
    @property
    def pending_validations(self) -> list[CheckpointRecord]: ...
