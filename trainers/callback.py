"""Callbacks run in the driver process as a run progresses: what a run tells the outside."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from storage import Checkpoint
from storage.health import StragglerRecord
from storage.snapshot import RestartRecord

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
    #: The run's record (``RunStorage``) the properties below read; None outside a run.
    _run_record: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def num_reports(self) -> int:
        """How many reports the run's history holds as the hook runs (in ``after_report`` the step
        just reported is ``num_reports - 1``). A restart forgets the reports made after the latest
        checkpoint; the workers make them again with the same indices."""
        return self._run_record.num_reports if self._run_record is not None else 0

    @property
    def restarts(self) -> tuple[RestartRecord, ...]:
        """How the workers were restarted after each failed attempt, oldest first: which ranks kept
        their processes and which were replaced, or why all were (in ``on_restart``, the last one is
        the restart under way). flowtrain's own: Ray Train restarts every worker."""
        return tuple(self._run_record.snapshot.restarts) if self._run_record is not None else ()

    @property
    def tracking(self) -> Mapping[str, Any]:
        """What experiment trackers stored in the run's record with :meth:`save_tracking`, by
        tracker name; a resumed run (a restart, a rerun of ``fit()``, a Prefect retry) finds it here."""
        return types.MappingProxyType(self._run_record.snapshot.tracking) if self._run_record is not None else {}

    def save_tracking(self, tracker: str, state: dict[str, Any]) -> None:
        """Keep ``state`` (JSON values) under ``tracker`` in the run's record (run.json), written at
        once, e.g. the id of the MLflow run this run logs to."""
        if self._run_record is None:
            raise RuntimeError(f"save_tracking({tracker!r}, ...): this context is not attached to a run's record.")
        self._run_record.record_tracking(tracker, state)


class UserCallback:
    """Subclass and override the hooks you need; pass instances in ``RunConfig(callbacks=[...])``.

    Hooks run in the driver, between reports, so keep them quick. The terminal progress line, the
    Prefect pipeline's reporter and Ray Tune's ``TuneReportCallback`` are callbacks too.
    ``before_run``, ``after_run`` and ``on_resize`` are flowtrain's own: experiment trackers use
    the first two to open and close what they log to.
    """

    def before_run(self, run_context: TrainRunContext, history: Sequence[dict[str, Any]]) -> None:
        """The run starts or resumes, before any worker starts: ``history`` holds rank 0's metrics of
        every report the run already has (empty for a new run), read from storage as iterated."""

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

    def on_straggler(self, run_context: TrainRunContext, straggler: StragglerRecord) -> None:
        """A rank has trained persistently slower than the median rank (flowtrain's own hook; see
        ``trainers.health``): called once per episode, with the rank, its node and the figures."""

    def after_run(self, run_context: TrainRunContext, result: Result) -> None:
        """The run ended: ``result`` is what ``fit()`` returns or, when it failed, the run as it stands
        with the error ``fit()`` raises next in ``result.error``. Not called when this process is
        interrupted or killed; a rerun of the run starts with ``before_run`` again."""
