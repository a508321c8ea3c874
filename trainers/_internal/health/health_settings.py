"""The settings of a run's health checks (``FLOWTRAIN_STRAGGLER_*``, ``FLOWTRAIN_PREFLIGHT*``,
``FLOWTRAIN_TIMELINE``), read at each ``fit()`` so a bad value fails before any worker starts.
Documented with the checks in ``trainers.health``, which hands these names on."""

from __future__ import annotations

import dataclasses
import os

FACTOR_ENV = "FLOWTRAIN_STRAGGLER_FACTOR"
STEPS_ENV = "FLOWTRAIN_STRAGGLER_STEPS"
TIMELINE_ENV = "FLOWTRAIN_TIMELINE"
PREFLIGHT_ENV = "FLOWTRAIN_PREFLIGHT"
PREFLIGHT_FACTOR_ENV = "FLOWTRAIN_PREFLIGHT_FACTOR"
TIMELINE_CHOICES = ("auto", "always", "never")


@dataclasses.dataclass(frozen=True)
class StragglerSettings:
    """When a rank counts as a straggler: ``factor`` times the median rank's step for ``steps``
    reports in a row."""

    factor: float = 1.5
    steps: int = 5

    def __post_init__(self) -> None:
        if self.factor != 0 and self.factor <= 1:
            raise ValueError(
                f"{FACTOR_ENV}={self.factor}: a straggler is a rank slower than the median by a factor above 1 "
                "(e.g. 1.5), or 0 to turn detection off."
            )
        if self.steps < 1:
            raise ValueError(f"{STEPS_ENV}={self.steps}: give the number of reports in a row, at least 1 (e.g. 5).")

    @property
    def enabled(self) -> bool:
        return self.factor > 0

    @classmethod
    def from_env(cls) -> StragglerSettings:
        """The settings in ``FLOWTRAIN_STRAGGLER_FACTOR`` and ``FLOWTRAIN_STRAGGLER_STEPS``, else the defaults."""
        try:
            factor = float(os.environ.get(FACTOR_ENV, cls.factor))
            steps = int(os.environ.get(STEPS_ENV, cls.steps))
        except ValueError as error:
            raise ValueError(
                f"{FACTOR_ENV}/{STEPS_ENV}: {error}; set a number (e.g. {FACTOR_ENV}=1.5, {STEPS_ENV}=5)."
            ) from None
        return cls(factor, steps)


@dataclasses.dataclass(frozen=True)
class PreflightSettings:
    """Whether the pre-flight check runs (``mode``: "auto", "on", "off") and how far below the
    median worker's compute rate a worker fails it (``factor``)."""

    mode: str = "auto"
    factor: float = 2.5

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "on", "off"):
            raise ValueError(f"{PREFLIGHT_ENV}={self.mode!r}: choose one of auto, on, off.")
        if not self.factor > 1:
            raise ValueError(
                f"{PREFLIGHT_FACTOR_ENV}={self.factor}: a worker fails when it is this many times slower than the "
                "median one; give a number above 1 (e.g. 2.5)."
            )

    def runs(self, use_gpu: bool) -> bool:
        """Whether a run on GPUs (``use_gpu``) or CPUs gets the check."""
        return self.mode == "on" or (self.mode == "auto" and use_gpu)

    @classmethod
    def from_env(cls) -> PreflightSettings:
        """``FLOWTRAIN_PREFLIGHT`` and ``FLOWTRAIN_PREFLIGHT_FACTOR``, else the defaults."""
        mode = os.environ.get(PREFLIGHT_ENV, cls.mode).strip().lower()
        try:
            factor = float(os.environ.get(PREFLIGHT_FACTOR_ENV, cls.factor))
        except ValueError:
            raise ValueError(
                f"{PREFLIGHT_FACTOR_ENV}={os.environ[PREFLIGHT_FACTOR_ENV]!r}: give a number above 1 (e.g. 2.5)."
            ) from None
        return cls(mode, factor)


def timeline_setting() -> str:
    """``FLOWTRAIN_TIMELINE``: "auto" (the default), "always" or "never"."""
    value = os.environ.get(TIMELINE_ENV, "auto").strip().lower()
    if value not in TIMELINE_CHOICES:
        raise ValueError(f"{TIMELINE_ENV}={value!r}: choose one of {', '.join(TIMELINE_CHOICES)}.")
    return value
