"""A run's health while it trains: straggler detection and peak memory (flowtrain's own; Ray
Train 2.60 has none of it). See docs/health.md.

Every report a rank makes carries how long its step took (from the end of its previous
``report()`` to this one) and its peak memory; nothing else is sent. The controller names a rank
whose steps are persistently slower than the median rank's, once per episode: in the log, the
terminal's progress line, ``UserCallback.on_straggler`` (the Prefect pipeline's reporter turns it
into a ``flowtrain.rank.straggling`` event) and run.json (``Result.stragglers``).

When the ranks wait for each other every step (an all-reduce, DDP's gradient sync), they all
report at the same pace, and the wait hides which one the others waited for. Mark the wait with
``waiting()`` so the step a rank is judged on is its own work::

    from trainers.health import waiting

    for batch in loader:
        loss = step(batch)
        with waiting():
            torch.distributed.all_reduce(loss)
        trainers.report({"loss": loss.item()})

``trainers.collective``'s ``barrier()`` and ``broadcast_from_rank_zero()`` count as waiting on
their own. Settings (read at each ``fit()``):

- ``FLOWTRAIN_STRAGGLER_FACTOR`` (default 1.5): how many times the median rank's step a rank's must
  take to be slow; ``0`` turns detection off.
- ``FLOWTRAIN_STRAGGLER_STEPS`` (default 5): slow reports in a row before a rank is named (and normal
  ones in a row that end its episode).
- ``FLOWTRAIN_PREFLIGHT`` (default ``auto``): the pre-flight check before the first step (a compute
  probe per worker and an all-reduce); ``auto`` runs it for GPU runs, ``on`` for every run, ``off``
  never. A worker more than ``FLOWTRAIN_PREFLIGHT_FACTOR`` (default 2.5) times slower than the
  median worker fails ``fit()`` with ``trainers.errors.PreflightError`` before training.
- ``FLOWTRAIN_TIMELINE`` (default ``auto``): when ``fit()`` draws the timeline picture
  (``health/timeline-attemptNNNN.png`` in the run folder): ``auto`` when the run had a restart, a
  failure or a straggler, ``always``, or ``never``. ``draw_timeline`` draws it afterwards too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow.fs

if TYPE_CHECKING:
    from storage.health import Timeline
    from storage.run_storage import RunStorage
    from trainers.result import Result

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


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Inside a worker's training function: the time inside is spent waiting on other ranks (a
    collective), not on this rank's own step. Elsewhere it does nothing."""
    from trainers._internal.session import current_session

    session = current_session()
    if session is None:
        yield
        return
    with session.health.waiting():
        yield


def timeline_setting() -> str:
    """``FLOWTRAIN_TIMELINE``: "auto" (the default), "always" or "never"."""
    value = os.environ.get(TIMELINE_ENV, "auto").strip().lower()
    if value not in TIMELINE_CHOICES:
        raise ValueError(f"{TIMELINE_ENV}={value!r}: choose one of {', '.join(TIMELINE_CHOICES)}.")
    return value


def draw_timeline(
    run: str | os.PathLike | Result, storage_filesystem: pyarrow.fs.FileSystem | None = None
) -> str | None:
    """Draw the timeline picture of the latest ``fit()`` call on ``run`` (its folder, as
    ``Result.path`` or a URI, or the ``Result`` itself) into its ``health/`` folder; return where
    the PNG is, or None when the run has no timeline (it ended before flowtrain kept one). Needs
    matplotlib."""
    from storage.run_storage import RunStorage

    if isinstance(run, (str, os.PathLike)):
        path = os.fspath(run)
    else:
        path, storage_filesystem = run.path, run.filesystem
    storage = RunStorage.at(path, storage_filesystem)
    timeline = storage.latest_timeline()
    return None if timeline is None else draw_timeline_into(storage, timeline)


def draw_timeline_into(storage: RunStorage, timeline: Timeline) -> str:
    """Draw ``timeline`` as ``health/timeline-attemptNNNN.png`` of ``storage``'s run; return its path."""
    from trainers._internal.timeline_picture import draw

    with tempfile.TemporaryDirectory(prefix="flowtrain-timeline-") as folder:
        local = os.path.join(folder, "timeline.png")
        draw(timeline, local)
        return storage.put_health_file(local, f"timeline-attempt{timeline.first_attempt:04d}.png")
