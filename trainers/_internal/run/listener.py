"""What a feature attached to a run hears from its controller.

The controller keeps the run loop's state and tells its listeners what happens, in order. Every
feature that watches a run is one (its health, the terminal line, the Prefect reporter, trackers,
Tune, the user's callbacks). ``UserCallback`` (as Ray Train's) hears reports, failures, restarts,
resizes and stragglers; ``RunListener`` adds the life of the run and of each attempt, and every
committed round with its events. Adding a feature adds a listener, not a change to the controller.
"""

from __future__ import annotations

from typing import Any

from storage import Checkpoint
from trainers._internal.events.messages import ReportEvent
from trainers.callback import UserCallback
from trainers.errors import RankFailure


class RunListener(UserCallback):
    """A feature of the run. Each hook gets ``run``, the controller (its ``settings``, ``workers``,
    ``storage``, ``attempt``, ``run_context``, and ``tell`` to speak to every listener); the
    default of each does nothing."""

    def run_started(self, run: Any) -> None:
        """``fit()``'s controller starts, before the first attempt."""

    def attempt_launched(self, run: Any) -> None:
        """The attempt's workers are up and its training function runs on each."""

    def round_committed(
        self, run: Any, index: int, round_: dict[int, ReportEvent], checkpoint: Checkpoint | None, arrived_at: float
    ) -> None:
        """Every rank reported round ``index`` of this attempt (``round_``: their reports, which
        reached the driver at ``arrived_at``) and it is committed, with ``checkpoint`` when it had one."""

    def attempt_failing(self, run: Any) -> None:
        """Something failed or the group resizes: from here the attempt only ends."""

    def attempt_failed(self, run: Any, failures: list[RankFailure]) -> None:
        """The attempt failed: ``failures``, the root cause first."""

    def training_ended(self, run: Any) -> None:
        """No rank trains any more: the run finished, or failed for good."""

    def run_ended(self, run: Any) -> None:
        """The workers are shut down and the run's outcome is set."""
