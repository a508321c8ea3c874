"""Callbacks run in the driver process as a run progresses: what a run tells the outside."""

from __future__ import annotations

import dataclasses
from typing import Any

from storage import Checkpoint


@dataclasses.dataclass(frozen=True)
class TrainRunContext:
    """What a callback knows about the run it watches."""

    name: str
    #: The run folder, as a URI or absolute local path.
    run_path: str
    #: 1 for the first attempt, +1 after each restart (and each resume of the run).
    attempt: int
    run_config: Any
    scaling_config: Any
    train_loop_config: Any


class UserCallback:
    """Subclass and override the hooks you need; pass instances in ``RunConfig(callbacks=[...])``.

    Hooks run in the driver, between reports, so keep them quick. This is the one way a run tells
    the outside what happens: the terminal progress line, the Prefect pipeline's reporter and
    Ray Tune's ``TuneReportCallback`` are callbacks too.
    """

    def after_report(
        self,
        run_context: TrainRunContext,
        metrics: list[dict[str, Any]],
        checkpoint: Checkpoint | None,
    ) -> None:
        """Every worker reported a step: ``metrics[i]`` is rank i's, ``checkpoint`` the committed one (or None)."""

    def after_exception(self, run_context: TrainRunContext, worker_exceptions: dict[int, BaseException]) -> None:
        """One or more workers failed; ``worker_exceptions`` maps world rank to its exception."""

    def on_restart(self, run_context: TrainRunContext, failures: list[Any], resume_from: Checkpoint | None) -> None:
        """The worker group is being restarted after ``failures``, from ``resume_from``."""

    def on_resize(self, run_context: TrainRunContext, old_size: int, new_size: int) -> None:
        """An elastic run restarts its ``old_size`` workers as ``new_size`` from its latest
        checkpoint, since more now fit (nothing failed: ``on_restart`` is not called)."""
