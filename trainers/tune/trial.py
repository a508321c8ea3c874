"""A trainer inside a Ray Tune trial: what the trial reserves (its own process plus one bundle per
training worker), the trainer's RunConfig there (named after the trial, reporting to Tune), and a
trainer object as a trainable (``tune.Tuner(trainer, param_space={"train_loop_config": ...})``)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

from trainers._checks import check_resources
from trainers.config import RunConfig, ScalingConfig
from trainers.tune.callback import TuneReportCallback, require_tune_trial

#: What the trial's own process (the trainer's controller) reserves by default.
DEFAULT_DRIVER_RESOURCES: dict[str, float] = {"CPU": 1}


def trial_resources(scaling_config: ScalingConfig, *, driver_resources: dict[str, float] | None = None) -> Any:
    """The ``tune.PlacementGroupFactory`` of one trial that trains with ``scaling_config``.

    Its first bundle is the trial's own process (``driver_resources``, default one CPU; ``{}``
    reserves nothing for it); then one bundle per worker, placed by
    ``scaling_config.placement_strategy``. Tune starts a trial only when all of it fits, so
    concurrent trials never outgrow the cluster, and the trainer starts its workers in these
    bundles instead of reserving a group of its own.
    """
    if not isinstance(scaling_config, ScalingConfig):
        raise TypeError(
            f"scaling_config={scaling_config!r}: must be the trainers.ScalingConfig your trainer uses, "
            "e.g. ScalingConfig(num_workers=2)."
        )
    driver = DEFAULT_DRIVER_RESOURCES if driver_resources is None else driver_resources
    check_resources("driver_resources", driver)
    return scaling_config.tune_bundles({name: amount for name, amount in driver.items() if amount})


def with_resources(
    trainable: Callable[[dict[str, Any]], Any],
    scaling_config: ScalingConfig,
    *,
    driver_resources: dict[str, float] | None = None,
) -> Any:
    """``tune.with_resources(trainable, trial_resources(scaling_config))``: give it to ``tune.Tuner``."""
    from ray import tune

    if not callable(trainable):
        raise TypeError(f"trainable={trainable!r}: must be the function each trial runs, taking the trial's config.")
    return tune.with_resources(trainable, trial_resources(scaling_config, driver_resources=driver_resources))


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


#: The keys a trial's config may have when the trainable is a trainer object.
TRAINER_CONFIG_KEYS = ("train_loop_config",)


def trainer_trial_resources(trainer: Any) -> Any:
    """What one trial of ``trainer`` reserves: one bundle per worker of its ScalingConfig, and none
    for the trial's process (it only drives the workers), as Ray Train's trainers did."""
    return trial_resources(trainer.scaling_config, driver_resources={} if trainer.scaling_config.num_workers else None)


def _check_trial_config(trainer: Any, config: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(config) - set(TRAINER_CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"param_space has {', '.join(repr(k) for k in unknown)}: with a trainer object as the trainable, "
            'param_space may only hold "train_loop_config" (the dict merged into the trainer\'s train_loop_config), '
            'e.g. param_space={"train_loop_config": {"lr": tune.loguniform(1e-4, 1e-1)}}.'
        )
    loop_config = config.get("train_loop_config", {})
    if not isinstance(loop_config, dict):
        raise TypeError(f'param_space["train_loop_config"]={loop_config!r}: must be a dict of the values to search.')
    if loop_config and not trainer._takes_config:
        raise ValueError(
            'param_space["train_loop_config"] was given, but the trainer\'s train_loop_per_worker takes no argument; '
            "add a `config` parameter to receive it."
        )
    return loop_config


def run_trainer_trial(trainer: Any, config: dict[str, Any]) -> None:
    """One Tune trial of ``trainer``: its ``train_loop_config`` updated with the trial's
    ``config["train_loop_config"]``, its run named after the trial and reporting to Tune."""
    require_tune_trial(f"{type(trainer).__name__}(config)")
    loop_config = _check_trial_config(trainer, config)
    trial = copy.copy(trainer)
    trial.train_loop_config = {**(trainer.train_loop_config or {}), **loop_config}
    trial.run_config = trial_run_config(trainer.run_config)
    trial.fit()


def trainer_as_trainable(trainer: Any) -> Callable[[dict[str, Any]], None]:
    """A function trainable running ``trainer`` once per trial, with the resources its ScalingConfig needs."""
    from ray import tune

    def train_trial(config: dict[str, Any]) -> None:
        run_trainer_trial(trainer, config)

    train_trial.__name__ = type(trainer).__name__
    return tune.with_resources(train_trial, trainer_trial_resources(trainer))
