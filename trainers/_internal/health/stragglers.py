"""Which rank is a straggler (docs/health.md, "Stragglers"), judged on every committed round's
steps. A rank slower than ``factor`` times the median rank and ``STRAGGLER_MIN_GAP_S`` more for
``steps`` rounds in a row is named once; as many rounds not slow end the episode. The median is the
lower one, so with two ranks the slower is judged against the faster.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from trainers._internal.health.health_settings import StragglerSettings
from trainers.tuning import STRAGGLER_MIN_GAP_S


@dataclasses.dataclass(frozen=True)
class Straggling:
    """A rank just named: its median step and the median rank's over the slow rounds."""

    rank: int
    steps: int
    ratio: float
    step_s: float
    median_step_s: float


class _RankWatch:
    def __init__(self) -> None:
        self.slow: list[tuple[float, float]] = []  # (its step, the median step) of the slow rounds in a row
        self.normal_rounds = 0
        self.named = False


class StragglerWatch:
    """Steps of one attempt's ranks, round after round; ``observe`` returns the ranks it names."""

    def __init__(self, settings: StragglerSettings) -> None:
        self.settings = settings
        self._ranks: dict[int, _RankWatch] = {}

    def observe(self, busy_s: Sequence[float | None]) -> list[Straggling]:
        """One committed round: ``busy_s[rank]`` is each rank's step (None: not measured)."""
        if not self.settings.enabled:
            return []
        measured = [value for value in busy_s if value is not None]
        if len(measured) < 2:
            return []
        median = statistics.median_low(measured)
        limit = max(median * self.settings.factor, median + STRAGGLER_MIN_GAP_S)
        named = []
        for rank, value in enumerate(busy_s):
            if value is None:
                continue
            watch = self._ranks.get(rank)
            if value > limit:
                if watch is None:
                    watch = self._ranks[rank] = _RankWatch()
                if not watch.named:  # an episode is judged on the rounds that named it
                    watch.slow.append((value, median))
                watch.normal_rounds = 0
                if len(watch.slow) >= self.settings.steps and not watch.named:
                    watch.named = True
                    step_s = statistics.median(step for step, _ in watch.slow)
                    median_s = statistics.median(median for _, median in watch.slow)
                    ratio = step_s / median_s if median_s > 0 else float("inf")
                    named.append(Straggling(rank, len(watch.slow), ratio, step_s, median_s))
            elif watch is not None:
                watch.normal_rounds += 1
                if not watch.named or watch.normal_rounds >= self.settings.steps:
                    del self._ranks[rank]  # a slow spell that never became an episode, or one that ended
        return named
