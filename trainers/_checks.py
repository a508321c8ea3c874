"""Small checks shared by the config dataclasses, each raising a message that names the field."""

from __future__ import annotations

import math
from typing import Any


def is_count(value: Any) -> bool:
    """True for a real int (bool is an int to Python, never a count to us)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(field: str, value: Any, *, minimum: int, allowed: str) -> None:
    if not is_count(value) or value < minimum:
        raise ValueError(f"{field}={value!r}: must be {allowed}.")


def check_number(field: str, value: Any, *, minimum: float, allowed: str, strict: bool = False) -> None:
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > minimum if strict else value >= minimum)
    )
    if not ok:
        raise ValueError(f"{field}={value!r}: must be {allowed}.")


def check_bool(field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{field}={value!r}: must be True or False.")


def check_choice(field: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{field}={value!r}: must be one of {', '.join(repr(c) for c in choices)}.")


def check_resources(field: str, resources: Any) -> None:
    """A dict of Ray resource name to an amount >= 0 (``ScalingConfig.resources_per_worker``, a Tune
    trial's ``driver_resources``)."""
    if not isinstance(resources, dict):
        raise TypeError(f"{field}={resources!r}: must be a dict of resource name to amount, e.g. {{'CPU': 2}}.")
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{field}: resource name {name!r} must be a non-empty string.")
        check_number(f"{field}[{name!r}]", amount, minimum=0, allowed="a number >= 0")


def is_metric_choice(value: Any) -> bool:
    """Whether ``value`` picks metrics as the report callbacks take them: None (all of them), a name,
    a list of names, or a dict of reported name to the framework's name."""
    return (
        value is None
        or isinstance(value, str)
        or (isinstance(value, list) and all(isinstance(m, str) for m in value))
        or (isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()))
    )


def pickling_error(value: Any) -> Exception | None:
    """Why ``value`` cannot be pickled the way Ray sends it (None: it can)."""
    from ray import cloudpickle

    try:
        cloudpickle.dumps(value)
    except Exception as error:  # noqa: BLE001 - pickling raises TypeError, PicklingError, AttributeError, ...
        return error
    return None
