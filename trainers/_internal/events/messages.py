"""What a worker tells the controller: its reports, barriers, questions and end, one small
picklable object per event (sent in batches over the worker's socket or Ray's long poll); and the
failures the controller finds itself (a hang, a group that did not start) in the same form."""

from __future__ import annotations

import contextlib
import dataclasses
import queue
from typing import Any, TypeVar

from storage.memory_peak import MemoryPeak
from storage.positions import RankPosition

#: The rank under which a failure to start the whole group is recorded.
LAUNCH = -1
_T = TypeVar("_T")


# Plain records: what they share with other records (storage's, gbdt's) is the form of a field list.
@dataclasses.dataclass(frozen=True)
class ReportEvent:
    """Worker ``world_rank`` called ``report()`` for the ``index``-th time in this attempt."""

    world_rank: int
    index: int
    metrics: dict[str, Any]
    #: True when this rank reported a checkpoint: its files are in the staging folder of
    #: ``index``, or (``in_place``) already at ``dir_name`` in the run folder.
    staged: bool
    #: ``report(validation=...)``: False, True or a ``trainers.ValidationTaskConfig``.
    validation: Any = False
    #: The checkpoint folder's name: ``report(checkpoint_dir_name=...)``, or where the checkpoint
    #: already is with ``in_place``. None: the default name.
    dir_name: str | None = None
    #: The checkpoint was written straight into the run folder (``CheckpointUploadMode.NO_UPLOAD``,
    #: or a ``checkpoint_upload_fn`` that put it there): it is recorded where it is.
    in_place: bool = False
    #: What this rank's upload of the checkpoint took (a ``storage.upload.UploadStats``), or None.
    upload: Any = None
    #: Where this rank's data iterators stood when it reported (``DataPositions.record``), or None.
    data_position: RankPosition | None = None
    #: The upload ran in the background (``CheckpointUploadMode.ASYNC``): it blocked no training.
    uploaded_in_background: bool = False
    #: Seconds of its own work in the step this report ends (``StepHealth.busy_s``): what stragglers
    #: are judged on; None when not measured (an attempt's first report).
    busy_s: float | None = None
    #: Its peak memory in this attempt when it grew past what it last sent (by 1 MiB or 1%), else None.
    memory: MemoryPeak | None = None
    #: Seconds its loop waited for its next batch since its previous report (``StepHealth.data_wait_s``).
    data_wait_s: float = 0.0


def checkpoint_placement(round_: list[ReportEvent]) -> dict[str, Any]:
    """Where the checkpoint of one round goes, as extra fields of ``storage.ReportRound`` ({} for the
    default name). As in Ray Train, the lowest rank's ``checkpoint_dir_name`` names the folder; a
    checkpoint already in the run folder is recorded where it is (all such ranks must agree)."""
    placed = sorted({e.dir_name for e in round_ if e.in_place and e.dir_name})
    if len(placed) > 1:
        raise ValueError(
            f"report(checkpoint, checkpoint_upload_mode=NO_UPLOAD): the ranks of step {round_[0].index} put "
            f"their checkpoints in different folders of the run ({', '.join(placed)}); every rank must "
            "write into the same folder, which becomes the one checkpoint of that step."
        )
    if placed:
        return {"dir_name": placed[0], "in_place": True}
    first = min(round_, key=lambda e: e.world_rank)
    return {"dir_name": first.dir_name} if first.dir_name else {}


@dataclasses.dataclass(frozen=True)
class FinishedEvent:
    """The worker's training function returned."""

    world_rank: int
    return_value: Any


@dataclasses.dataclass(frozen=True)
class FailedEvent:
    """A rank failed: its training function raised, its process or node went away, or the
    controller found it hung; or (``world_rank`` -1) the worker group did not start."""

    world_rank: int
    error: BaseException
    traceback: str
    #: "error" when the function raised, "died" when the worker process or its node went away,
    #: "preempted" when its node was drained for preemption, "hung" when it fell behind the others'
    #: report past ``FailureConfig.report_timeout_s``, "unreachable" when its host stopped answering
    #: while the others did (``FLOWTRAIN_UNREACHABLE_S``), "failed to start" for the group's start.
    kind: str = "error"
    #: The rank's memory when it ran out of it (``trainers._internal.health.memory_failure``), else None.
    memory: MemoryPeak | None = None
    #: Where its memory summary was left in the run's storage, when it ran out.
    memory_summary: str | None = None


@dataclasses.dataclass(frozen=True)
class SyncEvent:
    """Worker ``world_rank`` reached its ``index``-th ``barrier()`` or ``broadcast_from_rank_zero()``
    of this attempt; ``data`` is what rank 0 broadcasts (None from the other ranks)."""

    world_rank: int
    index: int
    data: Any = None


@dataclasses.dataclass(frozen=True)
class CheckpointsQuery:
    """Worker ``world_rank`` called ``get_all_reported_checkpoints()``: answer (query ``query_id``)
    once the first ``num_reports`` rounds of this attempt are committed and, with ``validated``,
    no validation is pending; with ``wait=False`` (its timeout passed) answer at once."""

    world_rank: int
    query_id: int
    num_reports: int
    validated: bool
    wait: bool = True


class TrainingInterrupted(BaseException):
    """Raised inside the training function when the controller stops the run (restart, Ctrl-C); a
    ``BaseException`` so that a user's ``except Exception`` does not swallow it."""


Event = ReportEvent | FinishedEvent | FailedEvent | SyncEvent | CheckpointsQuery

#: What a worker's ``activity_and_unacknowledged()`` says once its training function has ended
#: (raised or returned): every event it will send is then already queued, which the controller relies on.
NOT_TRAINING = "not training"


def take_events(events: queue.Queue[_T] | queue.SimpleQueue[_T], timeout_s: float) -> list[_T]:
    """Wait up to ``timeout_s`` for the next event in ``events``; return it with any queued behind it."""
    taken: list[_T] = []
    with contextlib.suppress(queue.Empty):
        taken.append(events.get(timeout=timeout_s))
        while True:
            taken.append(events.get_nowait())
    return taken
