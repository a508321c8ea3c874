"""The sweep stages: plan the trials of a search, train each one (skipping completed ones), rank them.

A trial's run name is a digest of what it trains (the loop, its config, the scaling), so the same
search over the same storage names the same runs again: a trial whose run finished is read back
from storage instead of trained again, and a trial that was cut off resumes from its checkpoint.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from collections.abc import Callable
from typing import Any, Literal

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import Field, model_validator

from storage.retention import flatten
from tasks.charts import as_number, charts_markdown, json_safe, trials_chart
from tasks.console import run_output
from tasks.params import Checkpointing, DatasetSpec, Failures, ParamsModel, RunSettings, Scaling, TorchTraining
from tasks.reporting import artifact_key, brief
from tasks.train import train


class SweepError(RuntimeError):
    """The sweep could not produce a ranking: every trial failed, or none reported the metric."""


class Distribution(ParamsModel):
    """Where a random search draws one parameter from."""

    kind: Literal["uniform", "loguniform", "randint", "choice"] = Field(
        description="uniform/loguniform: a float in [low, high); randint: an int in [low, high); choice: one of values."
    )
    low: float | None = None
    high: float | None = None
    values: list[Any] | None = None

    @model_validator(mode="after")
    def _bounds(self) -> Distribution:
        if self.kind == "choice":
            if not self.values or self.low is not None or self.high is not None:
                raise ValueError(
                    f"kind='choice' needs a non-empty 'values' list and no low/high; got values={self.values!r}."
                )
            return self
        if self.values is not None:
            raise ValueError(
                f"kind={self.kind!r} takes low and high, not values={self.values!r}; use kind='choice' for a list."
            )
        if self.low is None or self.high is None or not self.low < self.high:
            raise ValueError(f"kind={self.kind!r} needs low < high; got low={self.low!r}, high={self.high!r}.")
        if self.kind == "loguniform" and self.low <= 0:
            raise ValueError(f"kind='loguniform' needs low > 0; got low={self.low!r}.")
        if self.kind == "randint" and not (self.low.is_integer() and self.high.is_integer()):
            raise ValueError(f"kind='randint' needs whole numbers; got low={self.low!r}, high={self.high!r}.")
        return self

    def sample(self, rng: random.Random) -> Any:
        """One draw from this distribution."""
        if self.kind == "choice":
            assert self.values is not None  # checked when the model was built
            return rng.choice(self.values)
        assert self.low is not None and self.high is not None  # checked when the model was built
        if self.kind == "randint":
            return rng.randrange(int(self.low), int(self.high))
        if self.kind == "loguniform":
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return rng.uniform(self.low, self.high)


class Search(ParamsModel):
    """What the sweep tries and how it ranks the trials: one trial per combination of ``grid`` and
    each of its ``num_samples`` draws from ``random``, drawn from ``seed`` (a rerun proposes the same)."""

    metric: str = Field(description='The reported metric that ranks trials (its last value), "outer/inner" for nested.')
    mode: Literal["min", "max"] = Field("min", description="Whether a lower or a higher metric is better.")
    grid: dict[str, list[Any]] = Field(default_factory=dict, description='Values to try, e.g. {"lr": [0.1, 0.01]}.')
    random: dict[str, Distribution] = Field(default_factory=dict, description="Parameters drawn at random.")
    num_samples: int = Field(1, ge=1, description="Random draws per grid point (1 for a plain grid).")
    seed: int = Field(0, description="Seed of the random draws.")
    max_concurrent_trials: int | None = Field(
        None, ge=1, description="Trials training at once; None: as many as the Ray cluster holds."
    )

    @model_validator(mode="after")
    def _something_to_try(self) -> Search:
        if not self.grid and not self.random:
            raise ValueError('search: give a grid (e.g. {"lr": [0.1, 0.01]}) or random distributions; both are empty.')
        empty = sorted(name for name, values in self.grid.items() if not values)
        if empty:
            raise ValueError(f"search.grid: {empty} have no values; give each at least one.")
        both = sorted(set(self.grid) & set(self.random))
        if both:
            raise ValueError(f"search: {both} are in both grid and random; keep each parameter in one of them.")
        if self.num_samples > 1 and not self.random:
            raise ValueError(
                f"search.num_samples={self.num_samples}: a grid without random parameters gives the same trials each "
                "time; set num_samples=1, or add random distributions."
            )
        return self

    def configs(self) -> list[dict[str, Any]]:
        """The parameters of every trial, in a fixed order."""
        rng = random.Random(self.seed)
        names = sorted(self.grid)
        return [
            {**dict(zip(names, point, strict=True)), **{n: self.random[n].sample(rng) for n in sorted(self.random)}}
            for point in itertools.product(*(self.grid[name] for name in names))
            for _ in range(self.num_samples)
        ]


class SweepSettings(ParamsModel):
    """Everything a sweep trains with, built once by the flow for every stage: the search, the loop
    and its base config, the checked datasets, and each trial's run settings (storage: the sweep's folder)."""

    search: Search
    train_loop: str | Callable[..., Any]
    train_loop_config: dict[str, Any] = Field(default_factory=dict)
    datasets: list[DatasetSpec] = Field(default_factory=list)
    scaling: Scaling
    checkpointing: Checkpointing
    failures: Failures
    run: RunSettings

    def trial_config(self, params: dict[str, Any]) -> dict[str, Any]:
        """The ``train_loop_config`` of a trial: the base config with the trial's ``params``."""
        return {**self.train_loop_config, **params}


class Trial(ParamsModel):
    """One trial: its run's name and the parameters it adds to ``train_loop_config``."""

    name: str
    params: dict[str, Any]


class SweepPlan(ParamsModel):
    """The trials to run and how many may train at once."""

    trials: list[Trial]
    max_concurrent_trials: int


class TrialOutcome(ParamsModel):
    """How one trial ended: ``trained`` now, ``reused`` (finished in an earlier run) or ``failed``."""

    name: str
    params: dict[str, Any]
    status: Literal["trained", "reused", "failed"]
    score: float | None = None
    metrics: dict[str, Any] | None = None
    run_path: str | None = None
    checkpoint_path: str | None = None
    error: str | None = None


def trial_name(
    sweep_name: str,
    train_loop: str | Callable[..., Any],
    config: dict[str, Any],
    scaling: Scaling,
    data: dict[str, str] | None = None,
) -> str:
    """``<sweep>-<digest>``: the same loop, config, scaling and data (name to URI) get the same name."""
    if not isinstance(train_loop, str):  # a function: named as its import path would name it
        train_loop = f"{getattr(train_loop, '__module__', '?')}:{getattr(train_loop, '__qualname__', repr(train_loop))}"
    what = {"train_loop": train_loop, "config": config, "scaling": scaling.identity()}
    if data:
        what["data"] = data
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=repr).encode()).hexdigest()[:12]
    return f"{sweep_name}-{digest}"


def trials_the_cluster_holds(scaling: Scaling, *, with_data: bool = False) -> int:
    """How many trials of ``scaling`` the Ray cluster trains at once (``InsufficientResourcesError``
    when none fits); ``with_data`` keeps one CPU free for the trials' Ray Data pipelines."""
    from trainers.cluster import bundles_that_fit, check_feasible, cluster_nodes, ensure_ray

    config = scaling.to_config()
    if config.num_workers == 0:
        return 1  # the loop runs in the task's own process
    ensure_ray()
    nodes = cluster_nodes()
    check_feasible(config, nodes)
    if config.placement_strategy == "STRICT_PACK":
        holds = sum(bundles_that_fit(node, config.total_resources) for node in nodes)
    else:
        holds = sum(bundles_that_fit(node, config.worker_resources) for node in nodes) // config.max_workers
    trial_cpus = config.total_resources.get("CPU", 0)
    if with_data and trial_cpus:
        holds = min(holds, math.floor((sum(node.get("CPU", 0.0) for node in nodes) - 1) / trial_cpus + 1e-9))
    return max(1, holds)


@task(name="plan-sweep", task_run_name="plan {sweep_name}", persist_result=True)
def plan_sweep(sweep_name: str, settings: SweepSettings) -> SweepPlan:
    """Expand the search into named trials and decide how many train at once, before any worker starts."""
    search, scaling, datasets = settings.search, settings.scaling, settings.datasets
    with run_output():  # Ray's start-up lines, when it starts here, into this task run's logs
        holds = trials_the_cluster_holds(scaling, with_data=bool(datasets))
    data = {spec.name: spec.uri for spec in datasets}
    wanted = search.max_concurrent_trials
    if wanted is not None and wanted > holds:
        raise ValueError(
            f"search.max_concurrent_trials={wanted}: the Ray cluster holds only {holds} trial(s) of "
            f"{scaling.num_workers} worker(s) x {scaling.to_config().worker_resources} at once"
            f"{' (one CPU is kept for Ray Data)' if datasets else ''}; "
            f"lower it to {holds} or less, or leave it unset."
        )
    trials = []
    for params in search.configs():
        name = trial_name(sweep_name, settings.train_loop, settings.trial_config(params), scaling, data)
        trials.append(Trial(name=name, params=params))
    if len({t.name for t in trials}) != len(trials):
        raise ValueError("search: some trials have the same parameters; make the grid values distinct.")
    at_once = min(wanted or holds, len(trials))  # at least 1: a search has a trial, a cluster holds one
    get_run_logger().info("sweep %r: %d trial(s), %d at a time", sweep_name, len(trials), at_once)
    return SweepPlan(trials=trials, max_concurrent_trials=at_once)


def _finished_run(run: RunSettings) -> Any:
    """The ``Result`` of ``run`` when its storage says it finished, else None."""
    from storage import StorageError, load_run
    from trainers import Result

    try:
        stored = load_run(run.run_path)
    except StorageError:
        return None
    return Result._from_run(stored, return_value=None, error=None) if stored.snapshot.finished else None


@task(name="trial", task_run_name="trial {trial.name}", persist_result=True)
def train_trial(trial: Trial, settings: SweepSettings) -> TrialOutcome:
    """Train one trial to the end in its own run (``settings.run.storage_path``/``trial.name``), or
    read it back when an earlier sweep already finished it."""
    logger = get_run_logger()
    trial_run = settings.run.model_copy(update={"name": trial.name})
    found = _finished_run(trial_run)
    status = "reused"
    if found is None:
        training = TorchTraining(train_loop=settings.train_loop, train_loop_config=settings.trial_config(trial.params))
        # The pipeline's train stage, run inside this task run: same reporting, same resume.
        train.fn(
            training,
            datasets=settings.datasets,
            scaling=settings.scaling,
            checkpointing=settings.checkpointing,
            failures=settings.failures,
            run=trial_run,
        )
        found, status = _finished_run(trial_run), "trained"
    else:
        logger.info("trial %r finished in an earlier sweep (%s); not training it again", trial.name, found.uri)
    metric = settings.search.metric
    score = as_number(flatten(found.metrics or {}).get(metric))
    logger.info("trial %r %s: %s=%s", trial.name, status, metric, score)
    return TrialOutcome(
        name=trial.name,
        params=trial.params,
        status=status,
        score=score,
        metrics={k: json_safe(v) for k, v in (found.metrics or {}).items()},
        run_path=found.uri,
        checkpoint_path=found.checkpoint.path if found.checkpoint else None,
    )


def collect_outcomes(trials: list[Trial], futures: list[Any]) -> list[TrialOutcome]:
    """Every trial's outcome from its task future; a trial that failed (after its retries) is kept
    as ``failed`` with its error, so one bad trial does not hide the others."""
    outcomes = []
    for trial, future in zip(trials, futures, strict=True):
        future.wait()
        if future.state.is_completed():
            outcomes.append(future.result())
            continue
        error = future.result(raise_on_failure=False)
        why = f"{type(error).__name__}: {error}"
        outcomes.append(TrialOutcome(name=trial.name, params=trial.params, status="failed", error=why))
    return outcomes


@task(name="rank-trials", task_run_name="rank {sweep_name}", persist_result=True)
def rank_trials(sweep_name: str, search: Search, outcomes: list[TrialOutcome]) -> list[TrialOutcome]:
    """Rank the trials by ``search.metric`` (best first; failed trials and trials without the metric
    last) and publish the ranking as a table artifact and a chart of the metric per trial."""
    scored = [(o.score, o) for o in outcomes if o.score is not None]
    scored.sort(key=lambda pair: pair[0], reverse=search.mode == "max")
    ranked = [o for _, o in scored] + [o for o in outcomes if o.score is None]
    rows = [
        {
            "rank": i + 1 if outcome.score is not None else None,
            "trial": outcome.name,
            **{f"param/{k}": json_safe(v) for k, v in outcome.params.items()},
            search.metric: outcome.score,
            "status": outcome.status,
            "run_path": outcome.run_path,
            "error": outcome.error,
        }
        for i, outcome in enumerate(ranked)
    ]
    create_table_artifact(
        table=rows,
        key=artifact_key(sweep_name, "trials"),
        description=f"Trials of sweep {sweep_name!r} ranked by {search.metric} ({search.mode}), best first.",
    )
    publish_sweep_chart(sweep_name, search, ranked)
    finished = [o for o in outcomes if o.status != "failed"]
    if not finished:
        raise SweepError(f"sweep {sweep_name!r}: all {len(outcomes)} trial(s) failed; the first: {outcomes[0].error}")
    if not scored:
        keys = sorted({k for o in finished for k in (o.metrics or {})})
        raise SweepError(
            f"search.metric={search.metric!r}: no trial reported it; they reported {keys}. Rank by one of those."
        )
    return ranked


#: Trials drawn in a sweep's chart (the best ones): more lines than this are not read at a glance.
MAX_CHARTED_TRIALS = 10


def trial_label(place: int, outcome: TrialOutcome) -> str:
    """``#1 lr=0.1, layers=2``: a trial's place in the ranking and its parameters, for a legend."""
    return f"#{place} {brief(outcome.params) or outcome.name}"


def publish_sweep_chart(sweep_name: str, search: Search, ranked: list[TrialOutcome]) -> None:
    """A markdown artifact charting ``search.metric`` per report of the best trials, one line each."""
    from storage import load_run

    stored = [(place, o, path) for place, o in enumerate(ranked, start=1) if (path := o.run_path) is not None]
    stored = stored[:MAX_CHARTED_TRIALS]
    chart = trials_chart(
        search.metric,
        [(trial_label(place, o), load_run(path).metrics_history) for place, o, path in stored],
        best=search.mode,
    )
    shown = f"the best {len(stored)} of {len(ranked)}" if len(stored) < len(ranked) else f"all {len(ranked)}"
    intro = f"{search.metric} ({search.mode}) of {shown} trials, ranked as in the `{artifact_key(sweep_name, 'trials')}` table."
    create_markdown_artifact(
        markdown=charts_markdown(f"Trials of sweep {sweep_name}", [chart] if chart.series else [], intro=intro),
        key=artifact_key(sweep_name, "metric-chart"),
        description=f"{search.metric} per report of each trial of sweep {sweep_name!r}.",
    )
