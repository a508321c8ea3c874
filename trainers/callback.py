"""Callbacks run in the driver process as a run progresses."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Mapping

from storage import Checkpoint

if TYPE_CHECKING:
    from trainers.result import Result


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
    #: How many reports the run's history holds as the hook runs. In ``after_report`` the report
    #: just made is the last one, so its index in the history (its step) is ``num_reports - 1``.
    #: A restart forgets the reports made after the latest checkpoint; the workers make them again
    #: with the same indices.
    num_reports: int = 0
    #: What experiment trackers stored in the run's record with :meth:`save_tracking`, by tracker
    #: name; a resumed run (a restart, a rerun of ``fit()``, a Prefect retry) finds it here.
    tracking: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    _save_tracking: Callable[[str, dict[str, Any]], None] | None = dataclasses.field(default=None, repr=False, compare=False)

    def save_tracking(self, tracker: str, state: dict[str, Any]) -> None:
        """Keep ``state`` (JSON values) under ``tracker`` in the run's record (run.json), written at
        once, e.g. the id of the MLflow run this run logs to."""
        if self._save_tracking is None:
            raise RuntimeError(f"save_tracking({tracker!r}, ...): this context is not attached to a run's record.")
        self._save_tracking(tracker, state)


class UserCallback:
    """Subclass and override the hooks you need; pass instances in ``RunConfig(callbacks=[...])``.

    Hooks run in the driver, between reports, so keep them quick. ``before_run`` and
    ``after_run`` are flowtrain's (Ray Train's ``UserCallback`` has neither): experiment
    trackers use them to open and close what they log to.
    """

    def before_run(self, run_context: TrainRunContext, history: list[dict[str, Any]]) -> None:
        """The run starts or resumes, before any worker starts: ``history`` holds rank 0's metrics of
        every report the run already has, in order (empty for a new run)."""

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

    def after_run(self, run_context: TrainRunContext, result: "Result") -> None:
        """The run ended: ``result`` is what ``fit()`` returns, or, when it failed, the run as it
        stands with the error ``fit()`` raises next in ``result.error``. Not called when this process
        is interrupted or killed. A failed or killed run resumes with the same name, and the rerun
        starts with ``before_run`` again."""
