"""The RunConfig of a trainer inside a Tune trial: named after the trial, reporting to Tune."""

from __future__ import annotations

import dataclasses

from trainers.config import RunConfig
from trainers.tune.callback import TuneReportCallback, require_tune_trial


def trial_run_config(run_config: RunConfig | None = None) -> RunConfig:
    """``run_config`` for the trainer of the current Tune trial.

    The run is named after the trial (prefixed with ``run_config.name`` when set), so each trial
    has its own run folder under ``storage_path``, and a trial Tune restarts or restores resumes
    its run from the latest checkpoint. A ``TuneReportCallback`` is added to the callbacks.
    """
    from ray import tune

    require_tune_trial("trial_run_config()")
    run_config = run_config or RunConfig()
    if not isinstance(run_config, RunConfig):
        raise TypeError(f"run_config={run_config!r}: must be a trainers.RunConfig.")
    trial = tune.get_context().get_trial_name()
    name = f"{run_config.name}-{trial}" if run_config.name else trial
    callbacks = [c for c in (run_config.callbacks or []) if not isinstance(c, TuneReportCallback)]
    return dataclasses.replace(run_config, name=name, callbacks=[*callbacks, TuneReportCallback()])
