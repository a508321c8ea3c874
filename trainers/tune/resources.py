"""What a Tune trial reserves: its own process plus one bundle per training worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainers._checks import check_number
from trainers.config import ScalingConfig

#: What the trial's own process (the trainer's controller) reserves by default.
DEFAULT_DRIVER_RESOURCES: dict[str, float] = {"CPU": 1}


def _check_driver(driver_resources: Any) -> dict[str, float]:
    if not isinstance(driver_resources, dict):
        raise TypeError(f"driver_resources={driver_resources!r}: must be a dict such as {{'CPU': 1}}.")
    for name, amount in driver_resources.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"driver_resources: resource name {name!r} must be a non-empty string.")
        check_number(f"driver_resources[{name!r}]", amount, minimum=0, allowed="a number >= 0")
    return {name: amount for name, amount in driver_resources.items() if amount}


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
    driver = _check_driver(DEFAULT_DRIVER_RESOURCES if driver_resources is None else driver_resources)
    return scaling_config.tune_bundles(driver)


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
