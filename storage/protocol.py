"""``RunRecord``: what training asks of a run's storage, so its users can be read (and tested with a
fake) without ``RunStorage``'s opening, tidying and filesystem details."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from storage.checkpoint import Checkpoint
from storage.layout import RunLayout
from storage.snapshot import CheckpointRecord, RestartRecord, RunSnapshot

if TYPE_CHECKING:
    import pyarrow.fs as pafs


class RunRecord(Protocol):
    """One run's record as the controller and the checkpoint validations use it (``RunStorage``)."""

    layout: RunLayout
    snapshot: RunSnapshot
    run_uri: str
    filesystem: pafs.FileSystem

    def start_attempt(self) -> int: ...
    def record_report(
        self,
        metrics: dict[str, Any],
        *,
        report_index: int,
        attempt: int,
        staged: bool,
        validation: Any = False,
        dir_name: str | None = None,
        in_place: bool = False,
        upload: dict[str, Any] | None = None,
        data_position: dict[str, Any] | None = None,
    ) -> Checkpoint | None: ...
    def record_validation(self, dir_name: str, metrics: dict[str, Any], status: str) -> None: ...
    def record_data_resume(self, note: dict[str, Any]) -> None: ...
    def record_restart(self, restart: RestartRecord) -> None: ...
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
    def latest_data_position(self) -> dict[str, Any] | None: ...
    @property
    def pending_validations(self) -> list[CheckpointRecord]: ...
