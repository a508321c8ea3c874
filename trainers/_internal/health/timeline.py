"""The timeline of one ``fit()`` call, gathered by the controller as the run goes: every committed
round (with each rank's step), failures and stragglers; the phases come from the goodput clock.
Kept in the run folder (``.health/timeline-attemptNNNN.json``) and drawn from there
(``trainers.health.draw_timeline``)."""

from __future__ import annotations

from collections.abc import Sequence

from storage.health import Timeline, TimelineMark, TimelineRound
from trainers._internal.health.goodput import GoodputClock

#: Rounds kept in memory: past this, every other one is dropped (a picture shows no more anyway).
MOST_ROUNDS = 8192


class TimelineBook:
    """What the timeline is drawn from, as it happens."""

    def __init__(self) -> None:
        self.rounds: list[TimelineRound] = []
        self.marks: list[TimelineMark] = []
        self._every = 1  # keep one round in this many
        self._seen = 0

    def round(self, t: float, attempt: int, index: int, checkpoint: bool, steps: Sequence[float | None]) -> None:
        self._seen += 1
        if not checkpoint and self._seen % self._every:
            return
        self.rounds.append(TimelineRound(round(t, 4), attempt, index, checkpoint, tuple(steps)))
        if len(self.rounds) > MOST_ROUNDS:
            self._every *= 2
            self.rounds = [r for i, r in enumerate(self.rounds) if r.checkpoint or i % 2 == 0]

    def mark(self, t: float, attempt: int, rank: int, what: str) -> None:
        self.marks.append(TimelineMark(round(t, 4), attempt, rank, what))

    def close(self, run_name: str, world_size: int, clock: GoodputClock) -> Timeline:
        """The timeline so far, with the clock's phases (call after its account)."""
        return Timeline(
            run_name,
            world_size,
            tuple((phase.value, round(start, 4), round(end, 4)) for phase, start, end in clock.spans),
            tuple((round(start, 4), round(end, 4)) for start, end in clock.thrown_away_spans),
            tuple(self.rounds),
            tuple(self.marks),
        )
