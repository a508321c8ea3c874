"""A trainer object as a Tune trainable: ``tune.Tuner(trainer, param_space={"train_loop_config": ...})``."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from trainers.tune.callback import require_tune_trial
from trainers.tune.resources import trial_resources
from trainers.tune.run_config import trial_run_config

#: The keys a trial's config may have when the trainable is a trainer object.
TRAINER_CONFIG_KEYS = ("train_loop_config",)


def trainer_trial_resources(trainer: Any) -> Any:
    """What one trial of ``trainer`` reserves: one bundle per worker of its ScalingConfig, and none
    for the trial's process (it only drives the workers), as Ray Train's trainers did."""
    workers = trainer.scaling_config.num_workers
    return trial_resources(trainer.scaling_config, driver_resources={} if workers else None)


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
