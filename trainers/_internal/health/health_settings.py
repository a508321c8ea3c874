"""The settings of a run's health checks as the controller takes them, read from their variables
(``storage.settings``) at each ``fit()``. Documented with the checks in ``trainers.health``."""

from __future__ import annotations

import dataclasses

from storage import settings


@dataclasses.dataclass(frozen=True)
class StragglerSettings:
    """A rank is a straggler at ``factor`` times the median rank's step for ``steps`` reports in a row."""

    factor: float = settings.STRAGGLER_FACTOR.default
    steps: int = settings.STRAGGLER_STEPS.default

    def __post_init__(self) -> None:
        settings.STRAGGLER_FACTOR.check(self.factor)
        settings.STRAGGLER_STEPS.check(self.steps)

    @property
    def enabled(self) -> bool:
        return self.factor > 0

    @classmethod
    def from_env(cls) -> StragglerSettings:
        """``FLOWTRAIN_STRAGGLER_FACTOR`` and ``FLOWTRAIN_STRAGGLER_STEPS``, else the defaults."""
        return cls(settings.STRAGGLER_FACTOR.read(), settings.STRAGGLER_STEPS.read())


@dataclasses.dataclass(frozen=True)
class PreflightSettings:
    """Whether the pre-flight check runs (``mode``: "auto", "on", "off") and how far below the
    median worker's compute rate a worker fails it (``factor``)."""

    mode: str = settings.PREFLIGHT.default
    factor: float = settings.PREFLIGHT_FACTOR.default

    def __post_init__(self) -> None:
        settings.PREFLIGHT.check(self.mode)
        settings.PREFLIGHT_FACTOR.check(self.factor)

    def runs(self, use_gpu: bool) -> bool:
        """Whether a run on GPUs (``use_gpu``) or CPUs gets the check."""
        return self.mode == "on" or (self.mode == "auto" and use_gpu)

    @classmethod
    def from_env(cls) -> PreflightSettings:
        """``FLOWTRAIN_PREFLIGHT`` and ``FLOWTRAIN_PREFLIGHT_FACTOR``, else the defaults."""
        return cls(settings.PREFLIGHT.read(), settings.PREFLIGHT_FACTOR.read())
