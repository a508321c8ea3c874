"""TuneReportCallback: every committed report of a trial's run becomes a ``ray.tune.report``."""

from __future__ import annotations

from typing import Any

from storage import Checkpoint
from trainers.callback import TrainRunContext, UserCallback

#: The metric key under which Tune sees the path of the checkpoint committed with a report.
CHECKPOINT_PATH_KEY = "checkpoint_path"
#: The metric key under which Tune sees the run's folder (``trainers.Result.from_path`` opens it).
RUN_PATH_KEY = "run_path"


class NotInTuneTrialError(RuntimeError):
    """A Tune-only helper was used outside a Ray Tune trial."""


def require_tune_trial(what: str) -> None:
    """Raise ``NotInTuneTrialError`` naming ``what`` unless this runs inside a Tune trial's function."""
    from trainers._internal.ray_private import in_tune_function_session

    if not in_tune_function_session():
        raise NotInTuneTrialError(
            f"{what} works only inside a Ray Tune trial (the function you give tune.Tuner); "
            "outside Tune, call fit() without it."
        )


class TuneReportCallback(UserCallback):
    """Forwards each report of the run to Ray Tune, so schedulers (ASHA) and
    ``ResultGrid.get_best_result(metric, mode)`` see it.

    Tune receives rank 0's metrics, plus ``checkpoint_path`` (the checkpoint committed with the
    report, or None) and ``run_path`` (the run's folder). The checkpoint stays where the run
    committed it: Tune is given its path, not a second copy. Put it in ``RunConfig(callbacks=[...])``
    of a trainer built inside a Tune trial; elsewhere creating it raises ``NotInTuneTrialError``.

    When Tune's scheduler stops the trial, the next report ends ``fit()``: the workers and their
    placement group are released before the trial's process exits.
    """

    def __init__(self) -> None:
        require_tune_trial("TuneReportCallback()")

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None
    ) -> None:
        from ray import tune

        path = checkpoint.path if checkpoint is not None else None
        reported = {**metrics[0], CHECKPOINT_PATH_KEY: path, RUN_PATH_KEY: run_context.run_path}
        # Once Tune has decided to stop this trial, report() raises SystemExit(0) here; it unwinds
        # fit(), whose controller shuts the workers down on the way out.
        tune.report(reported)
