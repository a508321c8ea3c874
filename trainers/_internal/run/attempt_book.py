"""One attempt's bookkeeping: the report rounds and barriers under way, and the ranks that
finished or failed. It only records what the workers said and answers which round or barrier is
complete and which rank lags; the controller decides, and talks to workers and storage.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from storage.memory_peak import MemoryPeak
from trainers._internal.events.messages import LAUNCH, FailedEvent, FinishedEvent, ReportEvent, SyncEvent


class AttemptBook:
    """What the workers of one attempt have said so far; ``reset()`` starts the next attempt."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.reset()

    def reset(self) -> None:
        """Forget everything: a new attempt starts."""
        #: Reports of the rounds not committed yet: round index -> rank -> report.
        self.pending: dict[int, dict[int, ReportEvent]] = {}
        #: When the first rank reported each pending round (for the report timeout).
        self.first_seen: dict[int, float] = {}
        #: Ranks waiting at each barrier (``trainers.collective``), and when the first arrived.
        self.syncs: dict[int, dict[int, SyncEvent]] = {}
        self.sync_first_seen: dict[int, float] = {}
        self.finished: dict[int, Any] = {}
        self.failed: dict[int, FailedEvent] = {}
        #: Rounds committed so far (reports are committed in order).
        self.committed_rounds = 0
        #: Ranks whose reports the current preemption lets the others commit without.
        self.relaxed: set[int] = set()
        #: Reports each rank made in this attempt, and its memory at the latest that carried it:
        #: what a failure's message says of the rank.
        self.reports_made: dict[int, int] = {}
        self.memory: dict[int, MemoryPeak] = {}

    def add(self, event: Any) -> None:
        """Record a report, a barrier reached, a function returned or a failure; ignore the rest."""
        if isinstance(event, ReportEvent):
            if event.index < self.committed_rounds:
                return  # a relaxed rank's report of a round committed without it
            self.pending.setdefault(event.index, {})[event.world_rank] = event
            self.first_seen.setdefault(event.index, self.clock())
            self.reports_made[event.world_rank] = event.index + 1
            if event.memory is not None:
                self.memory[event.world_rank] = event.memory
        elif isinstance(event, FinishedEvent):
            self.finished[event.world_rank] = event.return_value
        elif isinstance(event, FailedEvent):
            self.failed.setdefault(event.world_rank, event)
        elif isinstance(event, SyncEvent):
            self.syncs.setdefault(event.index, {})[event.world_rank] = event
            self.sync_first_seen.setdefault(event.index, self.clock())

    def pop_complete_round(self, world_size: int) -> tuple[int, dict[int, ReportEvent]] | None:
        """The oldest round every rank (but the relaxed ones) reported, taken off the book; else None."""
        # Rounds commit in order, so the oldest pending one is the next to commit: no search of
        # the rounds pending (thousands of them while the driver catches up with a fast loop).
        index = self.committed_rounds
        round_ = self.pending.get(index)
        if round_ is None:
            return None
        # The length check first: a round is looked at after every event, and walking all
        # ranks each time would make a round's cost grow with the square of the world size.
        if len(round_) < world_size - len(self.relaxed) or any(
            rank not in round_ for rank in range(world_size) if rank not in self.relaxed
        ):
            return None
        del self.pending[index]
        self.first_seen.pop(index, None)
        self.committed_rounds = index + 1
        return index, round_

    def pop_complete_sync(self, world_size: int) -> tuple[int, Any] | None:
        """The oldest barrier every rank reached, taken off the book, with rank 0's data; None
        while it still waits (barriers are passed in order: a later one cannot be complete)."""
        if not self.syncs:
            return None
        index = min(self.syncs)
        if len(self.syncs[index]) < world_size:
            return None
        arrived = self.syncs.pop(index)
        self.sync_first_seen.pop(index, None)
        return index, arrived[0].data

    def returned_during_a_barrier(self) -> list[FailedEvent]:
        """Failures of the ranks whose function returned while the others wait at a barrier."""
        if not self.syncs or not self.finished or self.failed:
            return []
        index = min(self.syncs)
        waiting = ", ".join(map(str, sorted(self.syncs[index])))
        failed = []
        for rank in sorted(set(self.finished) - set(self.syncs[index])):
            error = RuntimeError(
                f"rank {rank}'s training function returned while rank(s) {waiting} wait at barrier {index} "
                "of this attempt: every worker must make the same barrier()/broadcast_from_rank_zero() calls."
            )
            failed.append(FailedEvent(rank, error, ""))
        return failed

    def laggards(self, world_size: int, timeout_s: float) -> list[FailedEvent]:
        """Hangs: the ranks that have not reported a step, or reached a barrier, ``timeout_s``
        after another rank did (a rank may be named twice: its barrier hang last)."""
        hung: list[FailedEvent] = []
        for waiting, first_seen, what in (
            (self.pending, self.first_seen, "reported step"),
            (self.syncs, self.sync_first_seen, "reached barrier"),
        ):
            if not waiting:
                continue
            index = min(waiting)
            waited = self.clock() - first_seen.get(index, self.clock())
            if waited <= timeout_s:
                continue
            arrived = ", ".join(map(str, sorted(waiting[index])))
            for rank in range(world_size):
                if rank not in waiting[index] and rank not in self.finished:
                    error = TimeoutError(
                        f"rank {rank} has not {what} {index} of this attempt {waited:.0f} s after rank(s) "
                        f"{arrived} did (FailureConfig.report_timeout_s={timeout_s:g})"
                    )
                    hung.append(FailedEvent(rank, error, "", kind="hung"))
        return hung

    def awaited_by_rounds_the_failed_ranks_finished(self, world_size: int) -> set[int]:
        """Ranks still able to report whose report alone a round every failed rank reported lacks."""
        if LAUNCH in self.failed:
            return set()
        failed = {rank for rank in self.failed if rank >= 0}
        missing: set[int] = set()
        for round_ in self.pending.values():
            if failed <= set(round_):
                missing.update(
                    rank
                    for rank in range(world_size)
                    if rank not in round_ and rank not in self.failed and rank not in self.finished
                )
        return missing

    def uneven_reports(self) -> str:
        """How many reports of the pending rounds each rank made, e.g. "rank 0: 1 extra"."""
        counts = collections.Counter(rank for round_ in self.pending.values() for rank in round_)
        return ", ".join(f"rank {r}: {c} extra" for r, c in sorted(counts.items()))
