"""Seams for testing flowtrain, and programs built on it, under faults, and for measuring what its
bookkeeping costs (flowtrain's own; Ray Train has no counterpart). Nothing here does anything until
a test installs it, and nothing of it reaches the workers.

The event road: every worker writes its reports and other events to one connection that the
driver reads (see ``docs/design.md``, "the report path"). To see what a broken or half-open
connection does to a run, install an ``EventTap`` around ``fit()``::

    import socket
    from trainers.testing import Fate, tap_event_road

    class DropRankOneOnce:
        def __init__(self):
            self.fired = False

        def frame_read(self, rank: int, number: int) -> Fate:
            if rank == 1 and not self.fired:
                self.fired = True
                return Fate.CLOSE  # the events rank 1 sent after this one are lost on the socket
            return Fate.READ

        def detached(self, rank: int, sock: socket.socket) -> None:
            sock.close()

    with tap_event_road(DropRankOneOnce(), ack_timeout_s=2.0):
        result = trainer.fit()  # every report still arrives once: rank 1 replays over Ray

The tap runs in the driver's process, on the thread that reads the connections: keep it quick.
``ack_timeout_s`` shortens how long a worker waits for an acknowledgement before it leaves a
connection that is never read (``Fate.DETACH``) for Ray (default 15 s).

The data position: each worker counts the rows its Ray Data shards hand to the loop, so that a
checkpoint resumes at the exact row (``DataConfig(checkpoint_data_position=True)``). A
``ShardCounter`` does that counting in this process, outside any run, to time it::

    counter = ShardCounter()
    shard = counter.track(dataset.iterator())
    for batch in shard.iter_torch_batches(batch_size=1024):
        ...
    counter.position()  # what a report() would carry: RankPosition(datasets={"train": ...})
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from storage.positions import RankPosition
from trainers._internal.events.event_channel import EventTap, Fate, tap_event_road
from trainers._internal.health.rank_health import RankHealth
from trainers._internal.ray_private import count_items
from trainers._internal.session.data_position import DataPositions, ShardPosition

__all__ = ["EventTap", "Fate", "RankHealthMeter", "RoundHealthJudge", "ShardCounter", "tap_event_road"]


class ShardCounter:
    """Counts what Ray Data shards hand out, as a worker's ``get_dataset_shard`` does."""

    def __init__(self) -> None:
        self._positions = DataPositions()
        #: What a rank's reports read the loop's waits for data from: ``health.data_wait_s``.
        self.health = RankHealth()

    def track(self, shard: Any, name: str = "train") -> Any:
        """``shard`` (a ``ray.data.DataIterator``) as one that counts every pass over it as ``name``."""
        return self._positions.track_shards({name: shard}, self.health)[name]

    def count(self, items: Iterable[Any], rows_each: int, name: str = "train") -> Iterable[Any]:
        """One pass over ``items`` (batches already in hand, ``rows_each`` rows apiece) counted as
        ``name``'s, and the wait for each timed: the bookkeeping alone, without Ray Data's
        iteration around it."""
        position = self._positions.shards.setdefault(name, ShardPosition())
        position.start_pass()
        return count_items(items, position, rows_each, self.health)

    def position(self) -> RankPosition | None:
        """Where every tracked shard stands: what each ``report()`` reads and carries."""
        return self._positions.record()


class RankHealthMeter:
    """What every ``report()`` measures of its rank (its step and its peak memory), outside a run:
    to time it. One ``report()`` is ``meter.report()``."""

    def __init__(self) -> None:
        self._health = RankHealth()

    def report(self) -> None:
        self._health.report_starts()
        self._health.report_ends()


class RoundHealthJudge:
    """What the controller does with the health of each committed round of ``ranks`` ranks (each
    rank's report count and memory kept, the steps read, the straggler judge, the timeline),
    outside a run: to time it. ``rounds(steps)`` builds the rounds from each rank's step, ``judge``
    takes them one by one and returns the ranks it named stragglers."""

    def __init__(self, ranks: int) -> None:
        from trainers._internal.health.goodput import GoodputClock
        from trainers._internal.health.health_settings import StragglerSettings
        from trainers._internal.health.stragglers import StragglerWatch
        from trainers._internal.health.timeline import TimelineBook
        from trainers._internal.run.attempt_book import AttemptBook

        self.ranks = ranks
        self._book = AttemptBook(time.monotonic)
        self._watch = StragglerWatch(StragglerSettings())
        self._timeline = TimelineBook()
        self._clock = GoodputClock(time.monotonic)
        self._clock.start(ranks)

    def rounds(self, steps: Sequence[Sequence[float]]) -> list[Any]:
        """One round per entry of ``steps`` (each rank's step in seconds), ready to ``judge``."""
        from trainers._internal.events.messages import ReportEvent

        return [
            {rank: ReportEvent(rank, index, {"step": index}, False, busy_s=busy) for rank, busy in enumerate(row)}
            for index, row in enumerate(steps)
        ]

    def judge(self, round_: Any) -> list[int]:
        from trainers._internal.run.round_commit import round_memory, round_steps

        book = self._book
        for rank, event in round_.items():  # what AttemptBook.add keeps of each report's health
            book.reports_made[rank] = event.index + 1
            if event.memory is not None:
                book.memory[rank] = event.memory
        index = next(iter(round_.values())).index
        round_memory(round_, self.ranks)
        steps = round_steps(round_, self.ranks)
        self._timeline.round(self._clock.elapsed(), 1, index, False, steps)
        return [named.rank for named in self._watch.observe(steps)]
