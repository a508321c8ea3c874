"""What one complete report round asks the run's storage to record: the one place that reads a
round's events (rank 0's metrics, the checkpoint's folder, the validation asked for, the ranks'
uploads, their data positions) into a ``storage.ReportRound``."""

from __future__ import annotations

from typing import Any

from storage.memory_peak import MemoryPeak
from storage.protocol import ReportRound
from storage.upload import UploadStats
from trainers._internal.events.messages import ReportEvent, checkpoint_placement
from trainers._internal.session.data_position import round_position
from trainers.validation import request_to_json


def report_round(round_: dict[int, ReportEvent], *, index: int, attempt: int, world_size: int) -> ReportRound:
    """The record of round ``index`` of attempt ``attempt``, from the events of its ranks
    (``round_``, by world rank). A checkpoint passed by any rank makes it a checkpoint round."""
    metrics = round_[0].metrics if 0 in round_ else {}
    memory = round_memory(round_, world_size)
    if not any(event.staged for event in round_.values()):
        return ReportRound(metrics, index, attempt, memory=memory)
    events = list(round_.values())
    # As in Ray Train, the validation asked by the first rank that passed a checkpoint.
    validation: Any = next((round_[r].validation for r in sorted(round_) if round_[r].staged), False)
    # Bytes summed over the ranks, the slowest rank's seconds; beside the metrics in run.json.
    upload = UploadStats.combine(event.upload for event in events)
    return ReportRound(
        metrics,
        index,
        attempt,
        staged=True,
        validation=request_to_json(validation) if validation else False,
        **checkpoint_placement(events),
        upload=upload,
        data_position=round_position([round_[r].data_position if r in round_ else None for r in range(world_size)]),
        memory=memory,
    )


def round_memory(round_: dict[int, ReportEvent], world_size: int) -> tuple[MemoryPeak | None, ...]:
    """The peaks the round's ranks sent (only grown ones), by world rank; () when none did (most rounds)."""
    peaks = tuple(round_[rank].memory if rank in round_ else None for rank in range(world_size))
    return peaks if any(peak is not None for peak in peaks) else ()


def round_steps(round_: dict[int, ReportEvent], world_size: int) -> list[float | None]:
    """Each rank's step in the round (``StepHealth.busy_s``), by world rank; None where not measured."""
    return [round_[rank].busy_s if rank in round_ else None for rank in range(world_size)]
