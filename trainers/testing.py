"""Seams for testing flowtrain, and programs built on it, under faults (``tap_event_road``), and for
measuring what its bookkeeping costs (``ShardCounter``, ``RankHealthMeter``, ``RoundHealthJudge``);
flowtrain's own, Ray Train has none. Nothing here does anything until a test installs it, and
nothing of it reaches the workers. Examples: the API reference's ``trainers.testing`` section.
"""

from __future__ import annotations

import time
import types
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
    to time it. ``meter.measure()`` is what one ``report()`` measures."""

    def __init__(self) -> None:
        self._health = RankHealth()

    def measure(self) -> None:
        """One report's measures: the step that ends, the memory, the next step that begins."""
        self._health.report_starts()
        self._health.report_ends()


class RoundHealthJudge:
    """What the controller does with the health of each committed round of ``ranks`` ranks (the
    attempt's book keeps each report, the round is read for its commit, the run's health watch
    judges its steps and draws its timeline), outside a run: to time it. ``rounds(steps)`` builds
    the rounds from each rank's step; ``judge`` takes them one by one, as the controller's commit
    does, and returns the ranks it named stragglers."""

    def __init__(self, ranks: int) -> None:
        from trainers._internal.health.health_settings import StragglerSettings
        from trainers._internal.run.attempt_book import AttemptBook
        from trainers._internal.run.health_watch import RunHealthWatch

        self.ranks = ranks
        self._book = AttemptBook(time.monotonic)
        self.named: list[int] = []
        # The run as the watch sees it: the controller's clock, a group of ``ranks`` workers, a
        # record that keeps only which ranks were named.
        self._run = types.SimpleNamespace(
            settings=types.SimpleNamespace(clock=time.monotonic, run_context=types.SimpleNamespace(name="judged")),
            workers=types.SimpleNamespace(world_size=ranks, preflight=None, where=lambda rank: ("", "")),
            storage=types.SimpleNamespace(append=lambda name, record: self.named.append(record.rank)),
            attempt=1,
            tell=lambda hook, *args: None,
        )
        self._watch = RunHealthWatch(StragglerSettings())
        self._watch.run_started(self._run)
        self._watch.attempt_launched(self._run)

    def rounds(self, steps: Sequence[Sequence[float]]) -> list[Any]:
        """One round per entry of ``steps`` (each rank's step in seconds), ready to ``judge``."""
        from trainers._internal.events.messages import ReportEvent

        return [
            {rank: ReportEvent(rank, index, {"step": index}, False, busy_s=busy) for rank, busy in enumerate(row)}
            for index, row in enumerate(steps)
        ]

    def judge(self, round_: Any) -> list[int]:
        from trainers._internal.run.round_commit import report_round

        for event in round_.values():
            self._book.add(event)
        complete = self._book.pop_complete_round(self.ranks)
        assert complete is not None, "judge() takes the rounds in order, each whole"
        index, reports = complete
        report_round(reports, index=index, attempt=1, world_size=self.ranks)
        self.named = []
        self._watch.round_committed(self._run, index, reports, None, time.monotonic())
        return self.named
