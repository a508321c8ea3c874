"""The state behind ``report()``, ``get_checkpoint()`` and ``get_dataset_shard()`` in a worker:
one ``WorkerSession`` per worker process while the training function runs. ``report()`` stages a
checkpoint into the run's storage and pushes one event through ``emit``; it never waits on a timer.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import shutil
import threading
from collections.abc import Callable
from typing import Any

from storage import Checkpoint
from storage.filesystem import pafs
from storage.layout import RunLayout
from storage.retention import flatten
from trainers._checks import pickling_error
from trainers._internal.events.messages import Event, ReportEvent, SyncEvent, TrainingInterrupted
from trainers._internal.health.rank_health import RankHealth
from trainers._internal.session import checkpoint_upload
from trainers._internal.session.data_position import DataPositions
from trainers._internal.session.reported_checkpoints import Answer, Answers, read
from trainers._internal.session.uploader import OrderedUploader
from trainers.backend import FrameworkProcess
from trainers.context import TrainContext, _set_context
from trainers.report_config import CheckpointUploadMode
from trainers.tuning import BROADCAST_WARN_BYTES, SYNC_WAKE_S
from trainers.validation import CheckpointConsistencyMode, resolve_request

logger = logging.getLogger(__name__)


class WorkerSession:
    """Everything one worker needs while its training function runs."""

    def __init__(
        self,
        *,
        context: TrainContext,
        attempt: int,
        layout: RunLayout,
        checkpoint: Checkpoint | None,
        dataset_shards: dict[str, Any],
        emit: Callable[[Event], None],
        score_attribute: str | None = None,
        validation_config: Any = None,
        data_position: DataPositions | None = None,
        framework: type[FrameworkProcess] = FrameworkProcess,
    ) -> None:
        self.context = context
        #: What the framework does in this process (its backend's): memory, and a stopped attempt.
        self.framework = framework
        self.attempt = attempt
        self.layout = layout
        self.checkpoint = checkpoint
        #: Where this worker's data iterators stand (None: ``DataConfig(checkpoint_data_position=False)``).
        self.data_position = data_position
        #: This rank's step times, data waits and peak memory, carried by its reports.
        self.health = RankHealth(framework)
        self.dataset_shards = (
            data_position.track_shards(dataset_shards, self.health) if data_position is not None else dataset_shards
        )
        self.emit = emit
        #: ``CheckpointConfig.checkpoint_score_attribute``: checked in every report with a checkpoint.
        self.score_attribute = score_attribute
        #: The trainer's ``ValidationConfig`` (None: ``report(validation=...)`` is refused).
        self.validation_config = validation_config
        self.answers = Answers()
        self.num_reports = 0
        self.stop_requested = threading.Event()
        self.uploader = OrderedUploader()
        #: ``num_reports`` after the last SYNC report with a checkpoint whose commit
        #: ``get_checkpoint()`` has not yet seen (None: ``self.checkpoint`` is up to date).
        self._unseen_commit: int | None = None
        #: ``checkpoint_dir_name`` values this worker used in this attempt (each names one checkpoint).
        self._dir_names: set[str] = set()
        self.num_syncs = 0
        #: The barrier this rank waits at (a rank is at one barrier at a time), or None.
        self._sync: _SyncPoint | None = None
        #: Set by the controller when a node of this run is being preempted (``get_preemption_info``).
        self.preemption_info: Any = None
        framework.watch_device_memory()

    @property
    def filesystem(self) -> pafs.FileSystem:
        """The filesystem of the run's folder (loaded in this process when first used)."""
        return self.context.storage.storage_filesystem

    def report(
        self,
        metrics: dict[str, Any],
        checkpoint: Checkpoint | None,
        upload_mode: CheckpointUploadMode = CheckpointUploadMode.SYNC,
        *,
        validation: Any = False,
        dir_name: str | None = None,
        delete_local: bool | None = None,
        upload_fn: checkpoint_upload.UploadFn | None = None,
    ) -> None:
        """What ``trainers.report`` does in this worker: check the request, then send the report as
        an event (with the step's health and data position), its checkpoint placed first (see
        ``_send_with_checkpoint``). Raises ``TrainingInterrupted`` once the attempt was stopped."""
        step = self.health.report_starts()
        try:
            self.check_stopped()
            plain, validation, delete_local = self._checked(
                metrics, checkpoint, upload_mode, validation, dir_name, delete_local, upload_fn
            )
            index = self.num_reports
            self.num_reports += 1
            event = ReportEvent(
                self.context.world_rank,
                index,
                plain,
                checkpoint is not None,
                validation,
                dir_name,
                # Taken now, with every report: the rank that passes the checkpoint cannot tell the others.
                data_position=self.data_position.record() if self.data_position is not None else None,
                busy_s=step.busy_s,
                memory=step.memory,
                data_wait_s=step.data_wait_s,
            )
            self._send_with_checkpoint(event, checkpoint, upload_mode, delete_local, upload_fn)
        finally:
            self.health.report_ends()

    def check_stopped(self) -> None:
        """Raise ``TrainingInterrupted`` once the controller stopped this attempt."""
        if self.stop_requested.is_set():
            raise TrainingInterrupted("the controller stopped this attempt")

    def _checked(
        self,
        metrics: Any,
        checkpoint: Any,
        upload_mode: Any,
        validation: Any,
        dir_name: str | None,
        delete_local: bool | None,
        upload_fn: Any,
    ) -> tuple[dict[str, Any], Any, bool]:
        """A ``report()`` call's arguments checked: plain metrics, the validation, whether to delete the checkpoint."""
        if not isinstance(metrics, dict):
            raise TypeError(f"report(metrics={metrics!r}): metrics must be a dict of name to value.")
        if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"report(checkpoint={checkpoint!r}): pass a trainers.Checkpoint, e.g. Checkpoint.from_directory(folder)."
            )
        if not isinstance(upload_mode, CheckpointUploadMode):
            raise ValueError(
                f"report(checkpoint_upload_mode={upload_mode!r}): must be CheckpointUploadMode.SYNC or ASYNC "
                "(flowtrain copies the checkpoint), or NO_UPLOAD (it is already in the run folder)."
            )
        no_upload = upload_mode is CheckpointUploadMode.NO_UPLOAD
        if delete_local is None:
            delete_local = upload_mode.default_delete_local_checkpoint_after_upload()
        delete = not no_upload and delete_local  # NO_UPLOAD uploads nothing, so deletes nothing
        checkpoint_upload.check_request(
            checkpoint,
            no_upload=no_upload,
            dir_name=dir_name,
            upload_fn=upload_fn,
            delete_local=delete,
            layout=self.layout,
            # A metrics-only report leaves the run's filesystem unbuilt (and pyarrow unloaded).
            filesystem=self.filesystem if checkpoint is not None else None,
        )
        if checkpoint is not None and dir_name is not None and not no_upload:
            if dir_name in self._dir_names:
                raise ValueError(
                    f"report(checkpoint_dir_name={dir_name!r}): an earlier report of this worker used that name; "
                    "each checkpoint needs a folder name of its own, e.g. with the epoch or step in it."
                )
            self._dir_names.add(dir_name)
        validation = resolve_request(validation, self.validation_config)
        plain = plain_metrics(metrics)
        if checkpoint is not None and self.score_attribute is not None:
            # With a validation the score may come from it, so it need not be reported here.
            check_score(plain, self.score_attribute, required=self.context.world_rank == 0 and not validation)
        return plain, validation, delete

    def _send_with_checkpoint(
        self,
        event: ReportEvent,
        checkpoint: Checkpoint | None,
        upload_mode: CheckpointUploadMode,
        delete_local: bool,
        upload_fn: Any,
    ) -> None:
        """Send ``event`` once ``checkpoint`` (if any) is where the controller commits it from:
        uploaded to the attempt's staging folder now (SYNC), or from a private copy taken now, in
        the background and in report order (ASYNC), or left where it is (NO_UPLOAD)."""
        if checkpoint is None:  # metrics only: the common report, kept short
            self.uploader.flush()  # earlier background uploads (if any) come first; re-raises their errors
            self.emit(event)
            return
        staging = self.layout.staging_path(self.attempt, event.index)
        persist = dict(
            staging=staging,
            layout=self.layout,
            filesystem=self.filesystem,
            dir_name=event.dir_name,
            upload_fn=upload_fn,
        )
        if upload_mode is CheckpointUploadMode.ASYNC:
            # The upload works from a private copy taken now; the reported folder is never
            # touched after report() returns (the loop may be writing its next checkpoint there).
            local_copy = checkpoint_upload.take_for_upload(
                checkpoint, release=delete_local, layout=self.layout, filesystem=self.filesystem
            )

            def upload_then_report() -> None:
                try:
                    placement = checkpoint_upload.persist(Checkpoint(local_copy, pafs.LocalFileSystem()), **persist)
                finally:
                    shutil.rmtree(local_copy, ignore_errors=True)
                self.emit(_placed(event, placement, uploaded_in_background=True))

            self.uploader.submit(upload_then_report)
            return
        self.uploader.flush()  # earlier background uploads (if any) come first; re-raises their errors
        if upload_mode is CheckpointUploadMode.NO_UPLOAD:
            name = self.layout.checkpoint_dir_name(self.filesystem, checkpoint.filesystem, checkpoint.path)
            event = dataclasses.replace(event, dir_name=name, in_place=True)
            self.checkpoint, self._unseen_commit = checkpoint, None  # already where it stays, as in Ray Train
        else:
            placement = checkpoint_upload.persist(checkpoint, **persist)
            if delete_local:
                kept = self.layout.path_of(placement.dir_name) if placement.in_place and placement.dir_name else staging
                checkpoint_upload.delete_source(checkpoint, keep=Checkpoint(kept, self.filesystem))
            event = _placed(event, placement)
            self._unseen_commit = self.num_reports
        self.emit(event)

    def current_checkpoint(self) -> Checkpoint | None:
        """What ``get_checkpoint()`` returns: the checkpoint this attempt started from, or the newest
        one this worker reported since. As in Ray Train, a SYNC report's checkpoint once its round
        is committed (this waits for that), a NO_UPLOAD one at once; an ASYNC one is not waited for."""
        if self._unseen_commit is not None:
            kept = read(self, CheckpointConsistencyMode.COMMITTED, None)
            if kept:
                self.checkpoint = kept[-1].checkpoint  # kept in commit order: the newest is last
            self._unseen_commit = None
        return self.checkpoint

    def flush(self) -> None:
        """Finish background uploads (called when the training function returns)."""
        self.uploader.flush()

    def answer_checkpoints(self, query_id: int, answer: Answer) -> None:
        """The controller's answer to this worker's ``get_all_reported_checkpoints()`` call."""
        self.answers.put(query_id, answer)

    def synchronize(self, data: Any, caller: str) -> Any:
        """Wait until every rank made its next ``barrier()``/``broadcast_from_rank_zero()`` call,
        then return rank 0's ``data``. The controller gathers the ranks and releases them."""
        self.check_stopped()
        rank = self.context.world_rank
        if rank != 0:
            data = None
        elif data is not None:
            from ray import cloudpickle  # what carries it to the driver and the other ranks

            try:
                size = len(cloudpickle.dumps(data))
            except Exception as error:
                raise TypeError(
                    f"{caller}(data={type(data).__name__}): the data must pickle to reach the other ranks ({error})."
                ) from error
            if size > BROADCAST_WARN_BYTES:
                logger.warning(
                    "%s: %d bytes pickled; it is meant for small values (under %d bytes). Send tensors "
                    "with your framework's collectives.",
                    caller,
                    size,
                    BROADCAST_WARN_BYTES,
                )
        if self.context.world_size == 1:
            return data
        point = self._sync = _SyncPoint(self.num_syncs)  # before the event: the release may come at once
        self.num_syncs += 1
        self.emit(SyncEvent(rank, point.index, data))
        with self.health.waiting():  # on the other ranks: not this rank's step
            while not point.released.wait(SYNC_WAKE_S):
                self.check_stopped()
        self._sync = None
        return point.data

    def release(self, index: int, data: Any) -> None:
        """Every rank reached sync point ``index``: let this rank go on with rank 0's ``data``."""
        point = self._sync
        if point is not None and point.index == index:
            point.data = data
            point.released.set()


@dataclasses.dataclass
class _SyncPoint:
    """One barrier of one rank: released when the controller has seen every rank arrive."""

    index: int
    released: threading.Event = dataclasses.field(default_factory=threading.Event)
    data: Any = None


def _placed(event: ReportEvent, placement: checkpoint_upload.Placement, **more: Any) -> ReportEvent:
    """``event`` saying where its checkpoint went."""
    return dataclasses.replace(
        event, dir_name=placement.dir_name, in_place=placement.in_place, upload=placement.upload, **more
    )


def plain_metrics(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Check and tidy the metrics of one ``report()`` before they leave the worker.

    As in Ray Train, any picklable value is a metric. Tensors and numpy scalars of one element
    become Python numbers; other tensors are detached and copied to the CPU (the driver may have
    no GPU); nested dicts are kept (``"val/loss"`` names ``{"val": {"loss": ...}}``). Raises
    ``TypeError`` naming the metric when a value cannot be pickled (a lock, an open file).
    """
    return {str(key): _plain(value, f"{prefix}{key}") for key, value in metrics.items()}


def _plain(value: Any, name: str) -> Any:
    if isinstance(value, dict):
        return plain_metrics(value, f"{name}/")
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    item = getattr(value, "item", None)
    if isinstance(value, numbers.Number) and callable(item):  # a numpy scalar
        return item()
    numel = getattr(value, "numel", None) or getattr(value, "size", None)
    if callable(item) and (numel() if callable(numel) else numel) == 1:
        return _plain(item(), name)
    if type(value) in (list, tuple):
        return type(value)(_plain(v, f"{name}[{i}]") for i, v in enumerate(value))
    if callable(getattr(value, "detach", None)) and callable(getattr(value, "cpu", None)):
        value = value.detach().cpu()  # a torch tensor: one on a GPU would not unpickle on a driver without one
    error = pickling_error(value)  # cloudpickle is what carries the report to the driver
    if error is not None:
        raise TypeError(
            f"report(metrics): metric {name!r} is {_describe(value)}, which cannot be pickled ({error}); a metric "
            "must reach the driver and the run's record, so report a value that pickles (a number, a string, "
            "a list, an array, a small object), e.g. str(value) or the number it holds."
        ) from error
    return value


def _describe(value: Any) -> str:
    kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
    shape = getattr(value, "shape", None)
    return f"a {kind}" if shape is None else f"a {kind} of shape {tuple(shape)}"


def check_score(metrics: dict[str, Any], attribute: str, *, required: bool) -> None:
    """The score a checkpoint is ranked by must be a number (NaN ranks last); ``required`` (rank 0,
    whose metrics are recorded): it must be present."""
    flat = flatten(metrics)
    if attribute not in flat:
        if required:
            raise ValueError(
                f"report(metrics, checkpoint): CheckpointConfig.checkpoint_score_attribute={attribute!r} is "
                f"not among the reported metrics {sorted(flat)}; report it with every checkpoint, or "
                "change checkpoint_score_attribute."
            )
        return
    score = flat[attribute]
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise TypeError(
            f"report(metrics, checkpoint): metric {attribute!r} (CheckpointConfig.checkpoint_score_attribute) "
            f"is {score!r} of type {type(score).__name__}; checkpoints are ranked by it, so it must be "
            "an int or a float."
        )


_session: WorkerSession | None = None


def set_session(session: WorkerSession | None) -> None:
    """Install (or clear) the session of this process; called by the worker around the loop."""
    global _session
    _session = session
    _set_context(session.context if session is not None else None)


def current_data_positions() -> DataPositions | None:
    """The data positions of the session running here (None outside one, or when turned off)."""
    return _session.data_position if _session is not None else None


def get_session(caller: str) -> WorkerSession:
    if _session is None:
        raise RuntimeError(f"{caller}() works only inside train_loop_per_worker, while a trainer's fit() runs.")
    return _session


def current_session() -> WorkerSession | None:
    """This process's session while a training function runs, else None."""
    return _session
