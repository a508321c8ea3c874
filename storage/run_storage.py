"""RunStorage: one run's folder: record reports and checkpoints, apply retention, resume.

It keeps a commit's steps in the order that makes a crash at any point safe (docs/design.md,
"Storage layout of a run"): the workers' staged upload, its commit (``storage.commit``), the
snapshot naming it (the commit point, ``storage.snapshot``), then the deletions retention asks
for. On ``open`` everything the snapshot does not name (staging, half-committed folders) is removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from storage.checkpoint import Checkpoint
from storage.commit import adopt_folder, commit_folder, is_committed, try_delete
from storage.config import CheckpointConfig
from storage.errors import RunInProgressError, StorageError
from storage.filesystem import display_path, exists, is_local, pafs, read_bytes, resolve_filesystem, write_bytes
from storage.health import GoodputAccount, RunHealth, Timeline, write_health_file
from storage.layout import CHECKPOINT_PREFIX, COMMIT_MARKER, RunLayout, check_dir_name, join_run
from storage.lease import Lease
from storage.memory_peak import MemoryPeak
from storage.metrics_log import KeptRange, MetricsLog, ReportEntry, kept_ranges, last_report, read_history, segments
from storage.positions import DataResume, RoundPosition
from storage.protocol import ReportRound
from storage.ray_run_format import RAY_SNAPSHOT, RayRun, read_ray_run
from storage.retention import decide, flatten, rank_best_first, score_of
from storage.snapshot import (
    DROPPED_KEPT,
    PENDING_VALIDATION,
    VALIDATED,
    CheckpointRecord,
    DroppedCheckpoint,
    RunSnapshot,
    read_snapshot,
    write_snapshot,
)
from storage.upload import CheckpointUploadError, retry

T = TypeVar("T")

#: Metrics-only reports are flushed to the metrics log (and run.json) at most this often; commits
#: flush at once.
METRICS_FLUSH_INTERVAL_S = 10.0


class RunStorage:
    """The folder ``{storage_path}/{name}`` of one run, on any ``pyarrow.fs`` filesystem."""

    def __init__(
        self,
        storage_path: str,
        name: str,
        *,
        filesystem: pafs.FileSystem | None = None,
        checkpoint_config: CheckpointConfig | None = None,
        lease_stale_after_s: float = 30.0,
        check_timeout_s: float = 5.0,
        resume_from_checkpoint: Checkpoint | None = None,
    ) -> None:
        self.filesystem, root = resolve_filesystem(storage_path, filesystem)
        self.name = name
        self.run_path = join_run(root, name)
        self.run_uri = display_path(self.filesystem, self.run_path)
        self.layout = RunLayout(self.run_path)
        self.checkpoint_config = checkpoint_config or CheckpointConfig()
        self.lease_stale_after_s = lease_stale_after_s
        self.check_timeout_s = check_timeout_s
        self.snapshot = RunSnapshot(name=name)
        #: Where the run starts while it has committed no checkpoint (the trainer's
        #: ``resume_from_checkpoint``); once it has one, its own checkpoints win.
        self.resume_from_checkpoint = resume_from_checkpoint
        #: Folder names of the checkpoints best last, when the run's record ranks them without a
        #: rule (a ``ray.train`` run read by ``load_run``); None: ranked by ``checkpoint_config``.
        self.ranked: list[str] | None = None
        self._lease: Lease | None = None
        self._last_write = 0.0
        #: The run's history of metrics: appended as reports arrive, written before run.json; this
        #: process holds only its tail.
        self.log = MetricsLog(self.filesystem, self.layout, still_owner=self._check_lease)

    @classmethod
    def at(cls, run_path: str, filesystem: pafs.FileSystem | None = None, **options: Any) -> RunStorage:
        """The run whose folder is ``run_path`` (local or a URI, as ``Result.path``/``TrainSummary.run_path``
        give it); ``options`` as for the constructor."""
        fs, inner = resolve_filesystem(run_path, filesystem)
        parent, _, name = inner.rstrip("/").rpartition("/")
        return cls(parent or "/", name, filesystem=fs, **options)

    # -- opening and closing -------------------------------------------------------------------

    def open(self, owner: str) -> RunSnapshot:
        """Check the storage answers, take the lease, load the snapshot (resume) or start one.

        A folder ``ray.train`` wrote is resumed from Ray's snapshot, its kept checkpoints the run's
        first (``storage.ray_run_format``; a format flowtrain does not read raises
        ``RayRunFormatError`` and the folder is not touched).

        Fails within ``check_timeout_s`` with a ``StorageError`` naming the path and the operation
        when the storage cannot be written, and with ``RunInProgressError`` when another live
        process owns the run.
        """
        self._checked("create the run folder", lambda: self.filesystem.create_dir(self.run_path, recursive=True))
        self._take_lease(owner)
        try:
            found = self._read_snapshot()
            if found is None:
                ray_run = self._checked(
                    "read the ray.train run snapshot",
                    lambda: read_ray_run(self.filesystem, self.run_path, self.name, self.run_uri),
                )
                found = self._adopt(ray_run) if ray_run is not None else None
            if found is not None:
                self.snapshot = found
                self.snapshot.finished = False
                self.snapshot.error = None
                self._forget_missing_checkpoints()
            self.snapshot.score_attribute = self.checkpoint_config.checkpoint_score_attribute
            self.snapshot.score_order = self.checkpoint_config.checkpoint_score_order
            self._remove_untracked()
            self._log_unlogged_reports()
            self._rewind()
            self._write()
        except BaseException:
            self.close()
            raise
        return self.snapshot

    def finish(self, error: str | None = None) -> None:
        """Record the end of the run (``error`` when it failed), clean staging, release the lease."""
        self.snapshot.finished = error is None
        self.snapshot.error = error
        self._write()
        self.close()  # cleans staging too

    def close(self) -> None:
        """Release the lease without marking the run finished (crash or interrupt). Idempotent.

        Staged uploads of a failed report go too: they are never resumed from.
        """
        if self._lease is not None:
            with contextlib.suppress(RunInProgressError):  # staging may be another driver's by now
                self._lease.check()
                try_delete(self.filesystem, self.layout.staging_root)
            self._lease.release()
            self._lease = None

    def verify_and_tidy(self, owner: str) -> list[Checkpoint]:
        """Check a run after training and clean it up; return its kept checkpoints, best first.

        Under the run's lease (a live run makes this fail with ``RunInProgressError``): every
        checkpoint the snapshot names must be there, and committed on object stores (else a
        ``StorageError`` names it); retention is applied with this storage's ``CheckpointConfig``;
        folders the snapshot does not name, staging left by a crash and failed deletions are
        removed. Unlike ``open`` this never forgets reports, so a finished run's history stays whole.
        """
        if not self._checked("look for the run snapshot", lambda: exists(self.filesystem, self.layout.snapshot)):
            raise StorageError(f"no run at {self.run_uri}: it has no run.json.")
        self._take_lease(owner)
        try:
            found = self._read_snapshot()
            if found is None:  # removed since it was looked for
                raise StorageError(f"no run at {self.run_uri}: it has no run.json.")
            self.snapshot = found
            for record in self.snapshot.checkpoints:
                self._check_committed(record.dir_name)
            self._apply_retention()
            self._remove_untracked()
            self._write()
        finally:
            self.close()
        return [checkpoint for checkpoint, _ in self.best_checkpoints]

    def _log_unlogged_reports(self) -> None:
        """Move the reports a run.json of format 1 or a ``ray.train`` folder holds into the metrics
        log, unless the log holds them already (a run.json.prev of format 1 read after a failed
        write)."""
        unlogged, self.snapshot.unlogged_reports = self.snapshot.unlogged_reports, []
        if unlogged and not self._checked("list the metrics log", lambda: segments(self.filesystem, self.layout)):
            for entry in unlogged:
                self.log.append(entry.attempt, entry.report_index, entry.metrics)
            self.log.flush()

    def _rewind(self) -> None:
        """Forget the reports after the latest checkpoint (every report while there is none)."""
        self.snapshot.num_reports = self.snapshot.kept_reports()
        self.log.cut(self.snapshot.num_reports, attempt=self.snapshot.attempt + 1)  # the attempt that follows

    def _adopt(self, ray_run: RayRun) -> RunSnapshot:
        """The ``ray.train`` run in this folder as this run's snapshot. Ray's snapshot is its
        checkpoints' commit point; on object stores they get flowtrain's commit marker now."""
        if not is_local(self.filesystem):
            for path in (self.layout.path_of(record.dir_name) for record in ray_run.snapshot.checkpoints):
                if exists(self.filesystem, path):
                    write_bytes(self.filesystem, f"{path}/{COMMIT_MARKER}", b"")
        return ray_run.snapshot

    @property
    def lease_path(self) -> str | None:
        """The file in the run folder this driver keeps while it owns the run (None: not open). A
        worker that cannot see it does not share the run's storage."""
        return self._lease.path if self._lease is not None else None

    def _read_snapshot(self) -> RunSnapshot | None:
        return self._checked("read the run snapshot", lambda: read_snapshot(self.filesystem, self.layout, self.run_uri))

    def _take_lease(self, owner: str) -> None:
        lease = Lease(
            self.filesystem, self.run_path, owner, stale_after_s=self.lease_stale_after_s, display=self.run_uri
        )
        self._checked("write the run's lease", lease.acquire)
        self._lease = lease

    def _check_committed(self, dir_name: str) -> None:
        path = self.layout.path_of(dir_name)
        if self.filesystem.get_file_info(path).type != pafs.FileType.Directory:
            raise StorageError(
                f"checkpoint {dir_name} is named in {self.run_uri}/run.json but missing at {display_path(self.filesystem, path)}."
            )
        if not is_committed(self.filesystem, path):
            raise StorageError(
                f"checkpoint {display_path(self.filesystem, path)} has no commit marker: its upload never finished."
            )

    # -- what the controller calls --------------------------------------------------------------

    def start_attempt(self) -> int:
        """Begin a new attempt and return its id; uploads of older attempts can no longer commit."""
        self.snapshot.attempt += 1
        self._write()
        self._check_lease()  # as in _delete_dropped: the staging may be the new owner's by now
        try_delete(self.filesystem, self.layout.staging_root)
        return self.snapshot.attempt

    def record_report(self, round_: ReportRound) -> Checkpoint | None:
        """Record one report round (rank 0's metrics); when it carries a checkpoint, commit it as
        ``ReportRound``'s fields say and return it. A ``dir_name`` one of the run's kept checkpoints
        has is refused with ``ValueError``; the commit's own retries are added to ``upload``'s count.
        """
        metrics, report_index, attempt = round_.metrics, round_.report_index, round_.attempt
        if attempt != self.snapshot.attempt:
            raise StorageError(
                f"report {report_index} of attempt {attempt} arrived after attempt {self.snapshot.attempt} began "
                f"at {self.run_uri}; it is not committed."
            )
        position = self.log.append(attempt, report_index, metrics)
        self.snapshot.num_reports = self.log.length
        self._keep_peaks(round_.memory)
        if not round_.commits:
            if time.monotonic() - self._last_write > METRICS_FLUSH_INTERVAL_S:
                self._write()
            return None
        try:
            return self._commit(round_, position)
        except BaseException:
            # Failed before its checkpoint was recorded: the history must not keep this report as
            # if it had been. Once recorded, the two stay together.
            if (
                not any(c.report == position for c in self.snapshot.checkpoints[-1:])
                and self.log.length == position + 1
            ):
                self.log.cut(position, attempt=attempt)
                self.snapshot.num_reports = position
            raise

    def _commit(self, round_: ReportRound, position: int) -> Checkpoint:
        """Commit ``round_``'s checkpoint (its report is the history's ``position``-th) and return it."""
        metrics, validation, dir_name, upload = round_.metrics, round_.validation, round_.dir_name, round_.upload
        staged, staging = round_.staged, self.layout.staging_path(round_.attempt, round_.report_index)
        self._check_lease()  # before its commit: the folder it goes to may be another driver's by now
        attribute = self.checkpoint_config.checkpoint_score_attribute
        if attribute is not None and not validation:  # a validation may report the score later
            try:
                score_of(metrics, attribute)
            except KeyError as error:
                try_delete(self.filesystem, staging)
                raise ValueError(error.args[0]) from None
        seq, name = self._name_checkpoint(dir_name, staging if staged else None)
        final = self.layout.path_of(name)
        if round_.in_place:
            adopt_folder(self.filesystem, staging if staged else None, final, still_owner=self._check_lease)
        else:
            announce = (lambda: self._announce(name)) if dir_name is not None else None
            commit_retries = commit_folder(
                self.filesystem, staging, final, announce=announce, still_owner=self._check_lease
            )
            if upload is not None:
                upload = dataclasses.replace(upload, retries=upload.retries + commit_retries)
        self.snapshot.checkpoints.append(
            CheckpointRecord(
                seq=seq,
                dir_name=name,
                metrics=metrics,
                report=position,
                **({"status": PENDING_VALIDATION, "validation": validation} if validation else {}),
                upload=upload,
                data_position=round_.data_position,
            )
        )
        self.snapshot.next_seq = seq + 1
        if name in self.snapshot.to_delete:  # announced before its commit (see _announce)
            self.snapshot.to_delete.remove(name)
        self._apply_retention()  # writes the commit point: from here the checkpoint exists
        return Checkpoint(final, self.filesystem)

    def _name_checkpoint(self, requested: str | None, staging: str | None) -> tuple[int, str]:
        """The sequence number and folder name of the next checkpoint. A requested name one of the
        kept checkpoints has is refused (Ray Train asks for unique names and would mix the two
        checkpoints' files in one folder); the default name skips numbers a requested name took."""
        seq = self.snapshot.next_seq
        named = {c.dir_name for c in self.snapshot.checkpoints}
        if requested is None:
            while RunLayout.checkpoint_name(seq) in named:
                seq += 1
            return seq, RunLayout.checkpoint_name(seq)
        check_dir_name(requested)
        if requested in named:
            if staging is not None:
                try_delete(self.filesystem, staging)
            raise ValueError(
                f"report(checkpoint_dir_name={requested!r}): the run already keeps a checkpoint of that name "
                f"({display_path(self.filesystem, self.layout.path_of(requested))}). Give each checkpoint its own "
                "name, e.g. with the epoch or step in it."
            )
        return seq, requested

    def record_validation(self, dir_name: str, metrics: dict[str, Any], status: str) -> None:
        """Record how the validation of checkpoint ``dir_name`` ended (VALIDATED merges ``metrics``
        into its metrics; VALIDATION_TIMEOUT / VALIDATION_FAILED keep them), then apply retention."""
        for record in self.snapshot.checkpoints:
            if record.dir_name == dir_name:
                if status == VALIDATED:
                    record.metrics = {**record.metrics, **metrics}  # a new dict: the report's own row stays as reported
                record.status = status
                self._apply_retention()
                return

    @property
    def pending_validations(self) -> list[CheckpointRecord]:
        """Kept checkpoints whose validation has not ended, oldest first."""
        return [c for c in self.snapshot.checkpoints if c.status == PENDING_VALIDATION]

    def _rankable(self) -> list[tuple[int, dict[str, Any]]]:
        """(seq, metrics) of the kept checkpoints, for ranking."""
        return [(c.seq, c.metrics) for c in self.snapshot.checkpoints]

    def _apply_retention(self) -> None:
        # Checkpoints awaiting validation are kept whatever their score.
        decided = decide(self._rankable(), self.checkpoint_config, exempt={c.seq for c in self.pending_validations})
        dropped = [c for c in self.snapshot.checkpoints if not decided[c.seq].kept]
        self.snapshot.checkpoints = [c for c in self.snapshot.checkpoints if decided[c.seq].kept]
        self.snapshot.dropped.extend(self._dropped_record(c, decided[c.seq].why) for c in dropped)
        del self.snapshot.dropped[:-DROPPED_KEPT]
        self.snapshot.to_delete.extend(c.dir_name for c in dropped)
        self._write()  # what is kept is on record before anything is deleted
        self._delete_dropped()

    def _dropped_record(self, checkpoint: CheckpointRecord, why: str) -> DroppedCheckpoint:
        attribute = self.checkpoint_config.checkpoint_score_attribute
        score = flatten(checkpoint.metrics).get(attribute) if attribute is not None else None
        return DroppedCheckpoint(
            checkpoint.seq, checkpoint.dir_name, checkpoint.report, score, why, checkpoint.upload, checkpoint.metrics
        )

    def rewind_to_latest_checkpoint(self) -> Checkpoint | None:
        """Forget reports made after the latest checkpoint (a restart reports them again)."""
        self._rewind()
        self._write()
        return self.latest_checkpoint

    def record_tracking(self, tracker: str, state: dict[str, Any]) -> None:
        """Keep ``state`` (JSON values) under ``tracker`` in the run's record, written at once: a
        tracker that created something for this run (an MLflow run) finds it again on resume."""
        self.snapshot.tracking[tracker] = state
        self._write()

    def record_data_resume(self, note: DataResume) -> None:
        """Note how this attempt resumed the data position of the checkpoint it starts from: what
        was skipped, and whether that is exact."""
        latest = self.snapshot.latest
        checkpoint = latest.dir_name if latest is not None else None
        self.append("data_resumes", dataclasses.replace(note, attempt=self.snapshot.attempt, checkpoint=checkpoint))

    def append(self, name: str, record: Any) -> None:
        """Add ``record`` to the run record's list ``name`` and write it at once: ``"restarts"``
        (how a failed attempt's workers were restarted), ``"stragglers"`` (an episode),
        ``"preflight"`` (the check of the ``fit()`` call under way)."""
        getattr(self.snapshot, name).append(record)
        self._write()

    def record_goodput(self, account: GoodputAccount, workers_parked: str | None = None) -> None:
        """Keep the goodput account of the ``fit()`` call that ends now, and whether its workers
        were parked for the next one (None: it did not end cleanly with a worker group)."""
        self.snapshot.goodput.append(account)
        if workers_parked is not None:
            self.snapshot.workers_parked.append(workers_parked)
        self._write()

    def record_timeline(self, timeline: Timeline) -> str:
        """Keep a ``fit()`` call's timeline in the run's ``.health/`` folder; return its path there."""
        name = f"timeline-attempt{timeline.first_attempt:04d}.json"
        return write_health_file(self.filesystem, self.layout, name, json.dumps(timeline.to_json()).encode())

    def latest_timeline(self) -> Timeline | None:
        """The timeline of the run's latest ``fit()`` call, or None when it has none."""
        selector = pafs.FileSelector(self.layout.health_path(""), allow_not_found=True)
        names = sorted(
            info.base_name
            for info in self.filesystem.get_file_info(selector)
            if info.base_name.startswith("timeline-") and info.base_name.endswith(".json")
        )
        if not names:
            return None
        return Timeline.from_json(json.loads(read_bytes(self.filesystem, self.layout.health_path(names[-1]))))

    def put_health_file(self, local_path: str, name: str) -> str:
        """Copy the local file ``local_path`` into the run's ``.health/`` folder as ``name``; return
        where it is, as a path or URI a person can open."""
        with open(local_path, "rb") as source:
            path = write_health_file(self.filesystem, self.layout, name, source.read())
        return display_path(self.filesystem, path)

    def _keep_peaks(self, memory: tuple[MemoryPeak | None, ...]) -> None:
        """Each rank's peak memory in the run: the larger of what is kept and what it reports now."""
        kept = self.snapshot.peak_memory
        kept.extend([None] * (len(memory) - len(kept)))  # nothing when it holds every rank already
        for rank, peak in enumerate(memory):
            if peak is not None:  # a rank sends its peak only when it grew
                kept[rank] = peak.at_least(kept[rank])

    def record_failure(self) -> int:
        """Count a worker-group failure in the snapshot (a driver restart does not reset it); return the count."""
        self.snapshot.num_failures += 1
        self._write()
        return self.snapshot.num_failures

    def record_preemption(self) -> int:
        """Count a restart after a preemption in the snapshot, as ``record_failure`` does; return the count."""
        self.snapshot.num_preemptions += 1
        self._write()
        return self.snapshot.num_preemptions

    # -- what Result reads -----------------------------------------------------------------------

    @property
    def num_failures(self) -> int:
        return self.snapshot.num_failures

    @property
    def num_preemptions(self) -> int:
        return self.snapshot.num_preemptions

    @property
    def health(self) -> RunHealth:
        """Each rank's peak memory, the run's straggler episodes, goodput accounts and pre-flight checks
        (the snapshot's lists of the same names)."""
        return RunHealth(*(tuple(getattr(self.snapshot, field.name)) for field in dataclasses.fields(RunHealth)))

    @property
    def metrics_history(self) -> MetricsHistory:
        """Rank 0's metrics of every recorded report, in order, read from the run's storage (its
        metrics log, or the reports a run.json of format 1 or a ``ray.train`` folder holds) each
        time it is iterated."""
        return MetricsHistory(self)

    @property
    def num_reports(self) -> int:
        """Reports in the run's history."""
        return self.snapshot.num_reports

    @property
    def last_metrics(self) -> dict[str, Any] | None:
        """Rank 0's metrics of the history's last report (``Result.metrics``), or None."""
        if not self.snapshot.num_reports:
            return None
        if self.log.tail and self.log.length == self.snapshot.num_reports:
            return self.log.tail[-1]
        if self.snapshot.unlogged_reports:
            return self.snapshot.unlogged_reports[-1].metrics
        last = last_report(self.filesystem, self.layout)
        return last.metrics if last is not None else None

    def reports(self, ranges: list[KeptRange] | None = None) -> Iterator[ReportEntry]:
        """Every recorded report, in order (``ranges``: where the log held them when
        ``history_now`` looked)."""
        self.log.flush()
        if self.snapshot.unlogged_reports:
            return iter(self.snapshot.unlogged_reports)
        return read_history(self.filesystem, self.layout, ranges)

    def history_now(self) -> Sequence[dict[str, Any]]:
        """The history as it is now, for a ``Result``: the reports this process holds when they are
        all of it, else a view of the log that later runs in the same folder do not change."""
        if len(self.log.tail) == self.snapshot.num_reports and self.log.length == self.snapshot.num_reports:
            return list(self.log.tail)
        self.log.flush()
        return MetricsHistory(self, kept_ranges(self.filesystem, self.layout), self.snapshot.num_reports)

    @property
    def latest_checkpoint(self) -> Checkpoint | None:
        """What the next attempt starts from: the newest committed checkpoint, or, while the run
        has none, the trainer's ``resume_from_checkpoint`` (None for a fresh start)."""
        return self.committed_checkpoint or self.resume_from_checkpoint

    @property
    def latest_data_position(self) -> RoundPosition | None:
        """The data position kept with the newest committed checkpoint (None without one, or
        when none was kept): what the next attempt resumes with ``latest_checkpoint``."""
        latest = self.snapshot.latest
        return latest.data_position if latest is not None else None

    @property
    def committed_checkpoint(self) -> Checkpoint | None:
        """The run's newest committed checkpoint (``Result.checkpoint``), or None."""
        latest = self.snapshot.latest
        return Checkpoint(self.layout.path_of(latest.dir_name), self.filesystem) if latest is not None else None

    @property
    def best_checkpoints(self) -> list[tuple[Checkpoint, dict[str, Any]]]:
        """The kept checkpoints with their metrics, best first by the CheckpointConfig's rule (or
        as the ``ray.train`` run read by ``load_run`` ranked them)."""
        if self.ranked is not None:
            named = {c.dir_name: c for c in self.snapshot.checkpoints}
            kept = [named[name] for name in reversed(self.ranked)]
        else:
            records = {c.seq: c for c in self.snapshot.checkpoints}
            kept = [records[seq] for seq in rank_best_first(self._rankable(), self.checkpoint_config)]
        return [(Checkpoint(self.layout.path_of(c.dir_name), self.filesystem), c.metrics) for c in kept]

    # -- internals --------------------------------------------------------------------------------

    def _announce(self, name: str) -> None:
        """List a checkpoint folder of a name the user chose for deletion before it is committed:
        ``open`` cannot recognise it as a leftover the way it does ``checkpoint_*`` folders, so a
        crash before the commit point then leaves nothing behind."""
        if name not in self.snapshot.to_delete:
            self.snapshot.to_delete.append(name)
            self._write()

    def _forget_missing_checkpoints(self) -> None:
        """Drop, warning of each, the checkpoints run.json names whose folder is gone: checked before any
        worker starts, so a resume starts from the newest that still exists, not from a missing folder."""
        selector = pafs.FileSelector(self.run_path, allow_not_found=True)
        listed = self._checked("list the run folder", lambda: self.filesystem.get_file_info(selector))
        folders = {entry.base_name for entry in listed if entry.type == pafs.FileType.Directory}
        present = []
        for record in self.snapshot.checkpoints:
            path = f"{self.run_path}/{record.dir_name}"
            if record.dir_name in folders and (  # local: committed by an atomic rename, the folder is the proof
                is_local(self.filesystem)
                or self._checked("look for a commit marker", functools.partial(is_committed, self.filesystem, path))
            ):
                present.append(record)
                continue
            warnings.warn(
                f"checkpoint {display_path(self.filesystem, path)} is named in {self.run_uri}/run.json but is "
                "missing (deleted by hand?); the run resumes from the newest checkpoint that still exists.",
                UserWarning,
                stacklevel=3,
            )
        self.snapshot.checkpoints = present

    def _remove_untracked(self) -> None:
        named = {c.dir_name for c in self.snapshot.checkpoints}
        for entry in self.filesystem.get_file_info(pafs.FileSelector(self.run_path, allow_not_found=True)):
            folder = entry.base_name
            if entry.type == pafs.FileType.Directory and folder.startswith(CHECKPOINT_PREFIX) and folder not in named:
                try_delete(self.filesystem, entry.path)
        try_delete(self.filesystem, self.layout.staging_root)
        self.snapshot.to_delete = [d for d in self.snapshot.to_delete if d not in named]
        self._delete_dropped()

    def _delete_dropped(self) -> None:
        self._check_lease()  # the write before it can outlast the lease: a dropped name may be the new owner's now
        self.snapshot.to_delete = [
            d for d in self.snapshot.to_delete if not try_delete(self.filesystem, f"{self.run_path}/{d}")
        ]

    def _check_lease(self) -> None:
        """Raise ``RunInProgressError`` when this driver may no longer own the run (``Lease.check``)."""
        if self._lease is not None:
            self._lease.check()

    def _write(self) -> None:
        where = f"{self.run_uri}/run.json"
        try:
            # Retried like a checkpoint's files: run.json is a checkpoint's commit point, and one
            # passing error from the store must not fail a run whose files are all uploaded.
            retry(
                self._write_log_and_snapshot,
                destination=where,
                what="the run snapshot",
                before_each_try=self._check_lease,
            )
        except CheckpointUploadError as error:  # retry's form of every OSError but RunInProgressError
            raise StorageError(
                f"cannot write the run snapshot at {where} (tries: {error.attempts}): {error.last_error}"
            ) from error
        self._last_write = time.monotonic()

    def _write_log_and_snapshot(self) -> None:
        self.log.flush()  # first: the run.json it leads to never names a report the log lacks
        write_snapshot(self.filesystem, self.layout, self.snapshot, still_owner=self._check_lease)

    def _checked(self, operation: str, action: Callable[[], T]) -> T:
        """Run a storage call, failing within ``check_timeout_s`` with the path and the operation."""
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["value"] = action()
            except BaseException as error:  # noqa: BLE001 - carried to the caller's thread
                outcome["error"] = error

        thread = threading.Thread(target=target, name=f"flowtrain-storage-{operation}", daemon=True)
        thread.start()
        thread.join(self.check_timeout_s)
        if thread.is_alive():
            raise StorageError(f"cannot {operation} at {self.run_uri}: no answer within {self.check_timeout_s:g} s.")
        error = outcome.get("error")
        if isinstance(error, OSError) and not isinstance(error, StorageError):
            raise StorageError(f"cannot {operation} at {self.run_uri}: {error}") from error
        if error is not None:
            raise error  # not I/O, or a StorageError: it names the run already (RunInProgressError among them)
        return outcome["value"]


class MetricsHistory(Sequence[dict[str, Any]]):
    """Rank 0's metrics of each report of a run, read from its storage each time it is iterated,
    so that holding it costs nothing. Indexing reads up to the report asked for.

    ``ranges`` and ``length``: the history as ``RunStorage.history_now`` found it; None: the
    run's history whenever it is read."""

    def __init__(self, run: RunStorage, ranges: list[KeptRange] | None = None, length: int | None = None) -> None:
        self._run = run
        self._ranges = ranges
        self._length = length

    def __len__(self) -> int:
        return self._run.num_reports if self._length is None else self._length

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (entry.metrics for entry in self._run.reports(self._ranges))

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return list(self)[index]
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(f"report {index} of a history of {len(self)}")
        return next(itertools.islice(iter(self), position, None))


def load_run(path: str, filesystem: pafs.FileSystem | None = None) -> RunStorage:
    """Read the run at ``path`` (its folder, local or URI) without taking it over, e.g. for
    ``Result.from_path``; its checkpoints are ranked by the rule the run recorded.

    A folder only ``ray.train`` wrote is read from Ray's snapshot: its kept checkpoints, ranked as
    Ray ranked them, and one report per checkpoint (``storage.ray_run_format``; a format flowtrain
    does not read raises ``RayRunFormatError``).
    """
    view = RunStorage.at(path, filesystem)
    if not exists(view.filesystem, view.run_path):
        raise StorageError(
            f"Experiment folder {view.run_uri} doesn't exist: there is no run at that path (is this the run "
            "folder, Result.path?)"
        )
    found = read_snapshot(view.filesystem, view.layout, view.run_uri)
    if found is None:
        ray_run = read_ray_run(view.filesystem, view.run_path, view.name, view.run_uri)
        if ray_run is None:
            raise StorageError(
                f"no run at {view.run_uri}: it has no run.json, nor ray.train's {RAY_SNAPSHOT} (is this the "
                "run folder, Result.path?)"
            )
        found, view.ranked = ray_run.snapshot, ray_run.ranked
    view.snapshot = found
    view.checkpoint_config = CheckpointConfig(
        checkpoint_score_attribute=found.score_attribute, checkpoint_score_order=found.score_order
    )
    return view
