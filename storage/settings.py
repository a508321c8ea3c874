"""Every ``FLOWTRAIN_*`` environment variable flowtrain reads, in this one module: each one's type,
default and rule, as docs/settings.md lists them (``tests/test_settings.py`` holds the two together).

Read when used, never at import, so a test or a Ray ``runtime_env`` may change one between runs;
``fit()`` reads them all first (``check_all``): a bad value fails before any worker starts, naming
the variable, the value and what it must be. Workers read their own environment (the upload
settings, the CUDA memory snapshot). The module is in ``storage``, the bottom layer, since every
layer reads settings (storage the upload ones, tasks the storage path); it imports nothing else.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Setting(Generic[T]):
    """One variable: its name, its value when unset or empty, how its text is read and the rule a
    value must meet, in the words an error and docs/settings.md use."""

    name: str
    default: T
    #: Reads the variable's text (stripped, not empty); a ``ValueError`` for a text it cannot read.
    parse: Callable[[str], T]
    #: What a value must be: "a whole number >= 0".
    rule: str
    #: Whether a value read meets the rule.
    allows: Callable[[Any], bool] = lambda value: True
    #: The default in words, where it is None: "~/flowtrain_results".
    unset: str = ""

    def read(self, environ: Mapping[str, str] | None = None) -> T:
        """The value in ``environ`` (``os.environ`` when None) now, else the default."""
        text = (os.environ if environ is None else environ).get(self.name, "").strip()
        if not text:
            return self.default
        try:
            value = self.parse(text)
            if self.allows(value):
                return value
        except ValueError:
            pass
        raise self._error(text)

    def check(self, value: T) -> T:
        """``value``, given in code (``StragglerSettings(factor=...)``), when it meets the rule."""
        if not self.allows(value):
            raise self._error(value)
        return value

    def _error(self, value: Any) -> ValueError:
        return ValueError(f"{self.name}={value!r}: must be {self.rule} (unset: {self.default_text}).")

    @property
    def default_text(self) -> str:
        """The default as docs/settings.md writes it: ``1.5``, ``on``, ``auto``, or ``unset``'s words."""
        value: Any = self.default
        if isinstance(value, bool):
            return "on" if value else "off"
        return self.unset if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _on_off(text: str) -> bool:
    if text.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ValueError(text)
    return text.lower() in ("1", "true", "yes", "on")


def _switch(name: str, default: bool) -> Setting[bool]:
    return Setting(name, default, _on_off, "on or off (1/0, true/false, yes/no)")


def _choice(name: str, *choices: str) -> Setting[str]:
    """One of ``choices`` (in any case), the first by default."""
    return Setting(name, choices[0], str.lower, f"one of {', '.join(choices)}", lambda value: value in choices)


def _whole(name: str, default: int, least: int, what: str = "") -> Setting[int]:
    return Setting(name, default, int, f"a whole number{what} >= {least}", lambda value: value >= least)


def _seconds(name: str, default: float, note: str = "") -> Setting[float]:
    return Setting(name, default, float, f"seconds >= 0{note}", lambda value: value >= 0)


def _absolute(path: str) -> bool:
    from storage.filesystem import is_uri

    return is_uri(path) or os.path.isabs(os.path.expanduser(path))


#: Where the Prefect pipeline stores runs when its parameters do not say (a deployment's job variable).
STORAGE_PATH: Setting[str | None] = Setting(
    "FLOWTRAIN_STORAGE_PATH", None, str, "an absolute path or a URI (s3://bucket/x)", _absolute, "~/flowtrain_results"
)

#: Seconds a worker group may take to start (``trainers.tuning.worker_start_timeout_s``).
WORKER_START_TIMEOUT_S: Setting[float | None] = Setting(
    "FLOWTRAIN_WORKER_START_TIMEOUT_S", None, float, "seconds above 0", lambda v: v > 0, "120 s + 0.5 s per worker"
)
#: Seconds a clean run's CPU workers stay parked for the next ``fit()`` of the same shape.
KEEP_WORKERS_S = _seconds("FLOWTRAIN_KEEP_WORKERS_S", 30.0, " (0 keeps no workers)")
#: After a failure, replace only the failed ranks (on) or restart every worker (off).
REPLACE_RANKS = _switch("FLOWTRAIN_REPLACE_RANKS", True)
#: Spare workers per node the group uses, for a run that may restart (``trainers/_internal/workers/spares.py``).
SPARE_WORKERS = _whole("FLOWTRAIN_SPARE_WORKERS", 1, 0, " of workers per node")
#: Seconds a run trains (and then reports) before its spare workers start.
SPARE_AFTER_S = _seconds("FLOWTRAIN_SPARE_AFTER_S", 2.0)
#: Seconds a rank's host may stay silent on the event road, while the others are heard, before
#: the rank is replaced as lost (a cut link), without waiting for Ray to declare its node dead.
UNREACHABLE_S: Setting[float] = Setting(
    "FLOWTRAIN_UNREACHABLE_S", 5.0, float, "seconds above 1 (0: wait for Ray instead)", lambda v: v == 0 or v > 1
)

#: How many times the median rank's step a rank's must take to be slow (0: no detection).
STRAGGLER_FACTOR: Setting[float] = Setting(
    "FLOWTRAIN_STRAGGLER_FACTOR", 1.5, float, "a factor above 1 (e.g. 1.5), or 0 (off)", lambda v: v == 0 or v > 1
)
#: Slow reports in a row before a rank is named (and normal ones in a row that end its episode).
STRAGGLER_STEPS = _whole("FLOWTRAIN_STRAGGLER_STEPS", 5, 1, " of reports")
#: The pre-flight check before the first step: for GPU runs (auto), every run (on) or none (off).
PREFLIGHT = _choice("FLOWTRAIN_PREFLIGHT", "auto", "on", "off")
#: How many times slower than the median worker a worker fails the pre-flight check.
PREFLIGHT_FACTOR: Setting[float] = Setting(
    "FLOWTRAIN_PREFLIGHT_FACTOR", 2.5, float, "a factor above 1 (e.g. 2.5)", lambda v: v > 1
)
#: When ``fit()`` draws the timeline picture: after a restart, failure or straggler (auto), always or never.
TIMELINE = _choice("FLOWTRAIN_TIMELINE", "auto", "always", "never")
#: Record CUDA allocations and dump PyTorch's memory snapshot when a rank runs out of CUDA memory.
CUDA_MEMORY_SNAPSHOT = _switch("FLOWTRAIN_CUDA_MEMORY_SNAPSHOT", False)

#: Retries of a checkpoint upload after its first try.
UPLOAD_RETRIES = _whole("FLOWTRAIN_UPLOAD_RETRIES", 4, 0)
#: Seconds before an upload's first retry; doubled for each further one.
UPLOAD_BACKOFF_S = _seconds("FLOWTRAIN_UPLOAD_BACKOFF_S", 0.5)
#: The longest wait between two tries of an upload.
UPLOAD_BACKOFF_MAX_S = _seconds("FLOWTRAIN_UPLOAD_BACKOFF_MAX_S", 8.0)
#: Files copied at once into remote storage (local disk copies one at a time).
UPLOAD_THREADS = _whole("FLOWTRAIN_UPLOAD_THREADS", 8, 1)

#: Every setting, in the order above.
ALL: tuple[Setting[Any], ...] = tuple(value for value in list(globals().values()) if isinstance(value, Setting))


def check_all(environ: Mapping[str, str] | None = None) -> None:
    """Read every setting: the first bad value is a ``ValueError`` naming its variable."""
    for setting in ALL:
        setting.read(environ)
