"""Messages a worker pushes to the controller. Small, picklable, one per event."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ReportEvent:
    """Worker ``world_rank`` called ``report()`` for the ``index``-th time in this attempt."""

    world_rank: int
    index: int
    metrics: dict[str, Any]
    #: True when this rank uploaded checkpoint files into the staging folder of ``index``.
    staged: bool
    #: ``report(validation=...)``: False, True or a ``trainers.ValidationTaskConfig``.
    validation: Any = False


@dataclasses.dataclass(frozen=True)
class FinishedEvent:
    """The worker's training function returned."""

    world_rank: int
    return_value: Any


@dataclasses.dataclass(frozen=True)
class FailedEvent:
    """The worker's training function raised, or the worker died."""

    world_rank: int
    error: BaseException
    traceback: str
    #: "error" when the function raised, "died" when the worker process or its node went away.
    kind: str = "error"


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


Event = ReportEvent | FinishedEvent | FailedEvent | SyncEvent | CheckpointsQuery

#: What a worker's ``activity()`` answers once its training function has ended (raised or
#: returned): every event it will send is then already queued, which the controller relies on.
NOT_TRAINING = "not training"
