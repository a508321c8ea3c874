"""The sweep flow: train one run per trial of a grid or random search, then rank the trials.

Each trial is a mapped task with its own run (named from what it trains) under
``{storage_path}/{sweep name}/``; at most as many train at once as the Ray cluster holds. Running
the same sweep again reuses the trials that finished and resumes the ones that did not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from prefect import flow, unmapped
from prefect.task_runners import ThreadPoolTaskRunner

from flows.pipeline import flow_run_name
from tasks.ingest import ingest
from tasks.params import Checkpointing, DatasetSource, Failures, RunSettings, Scaling
from tasks.retries import train_task_options
from tasks.sweep import (
    Search,
    SweepSettings,
    Trial,
    TrialOutcome,
    collect_outcomes,
    plan_sweep,
    rank_trials,
    train_trial,
)

DEFAULT_SWEEP_NAME = "sweep"


@flow(name="flowtrain-sweep-trials", flow_run_name="trials")
def sweep_trials(trials: list[Trial], settings: SweepSettings) -> list[TrialOutcome]:
    """Train every trial (a mapped task each) and return their outcomes, failed ones included.

    The caller sets this flow's task runner so that only as many trials train at once as fit.
    """
    futures = train_trial.with_options(**train_task_options(settings.failures)).map(trials, settings=unmapped(settings))
    return collect_outcomes(trials, list(futures))


@flow(name="flowtrain-sweep", flow_run_name=functools.partial(flow_run_name, DEFAULT_SWEEP_NAME))
def sweep(
    search: Search,
    train_loop: str | Callable[..., Any] = "tasks.loops:tabular_mlp_loop",
    train_loop_config: dict[str, Any] | None = None,
    datasets: dict[str, DatasetSource] | None = None,
    scaling: Scaling = Scaling(num_workers=1),
    checkpointing: Checkpointing = Checkpointing(),
    failures: Failures = Failures(),
    run: RunSettings = RunSettings(),
) -> dict[str, Any]:
    """Train ``train_loop`` once per trial of ``search`` (each trial's parameters added to
    ``train_loop_config``) and rank the trials by ``search.metric``. ``datasets`` are read and
    checked once, and every trial trains on them.

    ``run.name`` names the sweep (default ``sweep``); trials are stored under
    ``{run.storage_path}/{run.name}/``. Returns the ranking, best first, and the best trial.
    """
    name = run.name or DEFAULT_SWEEP_NAME
    completed = run.completed(default_name=name)
    settings = SweepSettings(
        search=search,
        train_loop=train_loop,
        train_loop_config=dict(train_loop_config or {}),
        datasets=[ingest(dataset, source) for dataset, source in (datasets or {}).items()],
        scaling=scaling,
        checkpointing=checkpointing,
        failures=failures,
        # Each trial's run sits in the sweep's folder.
        run=completed.model_copy(update={"storage_path": completed.run_path}),
    )
    plan = plan_sweep(name, settings)
    runner: ThreadPoolTaskRunner[Any] = ThreadPoolTaskRunner(max_workers=plan.max_concurrent_trials)
    trials = sweep_trials.with_options(task_runner=runner)  # type: ignore[arg-type]  # Prefect's TaskRunner is invariant in its future type, so no runner matches the parameter (Prefect casts its own)
    ranked = rank_trials(name, search, trials(plan.trials, settings))
    return {"sweep": name, "trials": [o.model_dump() for o in ranked], "best": ranked[0].model_dump()}
