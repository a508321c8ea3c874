"""A run's health while it trains: stragglers, peak memory, the goodput account, the timeline
picture and the pre-flight check (flowtrain's own; Ray Train 2.60 has none of it). See
docs/health.md; what a run found is ``Result.health``.

Every report a rank makes carries how long its step took (from the end of its previous
``report()`` to this one) and its peak memory; nothing else is sent. The controller names a rank
whose steps are persistently slower than the median rank's, once per episode: in the log, the
terminal's progress line, ``UserCallback.on_straggler`` (the Prefect pipeline's reporter turns it
into a ``flowtrain.rank.straggling`` event) and run.json (``Result.health.stragglers``).

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
their own. The settings (``FLOWTRAIN_STRAGGLER_FACTOR``, ``FLOWTRAIN_STRAGGLER_STEPS``,
``FLOWTRAIN_PREFLIGHT``, ``FLOWTRAIN_PREFLIGHT_FACTOR``, ``FLOWTRAIN_TIMELINE``, read at each ``fit()``)
are in ``storage.settings`` and docs/settings.md. A worker more than ``FLOWTRAIN_PREFLIGHT_FACTOR``
times slower than the median one fails ``fit()`` with ``trainers.errors.PreflightError`` before
training; ``draw_timeline`` draws the timeline picture after a run too.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow.fs

from trainers._internal.health.health_settings import PreflightSettings, StragglerSettings

__all__ = ["PreflightSettings", "StragglerSettings", "draw_timeline", "draw_timeline_into", "waiting"]

if TYPE_CHECKING:
    from storage.health import Timeline
    from storage.run_storage import RunStorage
    from trainers.result import Result


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Inside a worker's training function: the time inside is spent waiting on other ranks (a
    collective), not on this rank's own step. Elsewhere it does nothing."""
    from trainers._internal.session.worker_session import current_session

    session = current_session()
    if session is None:
        yield
        return
    with session.health.waiting():
        yield


def draw_timeline(
    run: str | os.PathLike | Result, storage_filesystem: pyarrow.fs.FileSystem | None = None
) -> str | None:
    """Draw the timeline picture of the latest ``fit()`` call on ``run`` (its folder, as
    ``Result.path`` or a URI, or the ``Result`` itself) into its ``.health/`` folder; return where
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
    """Draw ``timeline`` as ``.health/timeline-attemptNNNN.png`` of ``storage``'s run; return its path."""
    from trainers._internal.health.timeline_picture import draw

    with tempfile.TemporaryDirectory(prefix="flowtrain-timeline-") as folder:
        local = os.path.join(folder, "timeline.png")
        draw(timeline, local)
        return storage.put_health_file(local, f"timeline-attempt{timeline.first_attempt:04d}.png")
