"""A run's health while it trains: stragglers, peak memory, the goodput account, the timeline
picture and the pre-flight check (flowtrain's own; Ray Train 2.60 has none of it). What a run found
is ``Result.health``; how each is measured and judged, and the ``FLOWTRAIN_*`` settings: docs/health.md.

Mark the time a rank waits on the others (an all-reduce) with ``waiting()`` so that its step is
judged on its own work; ``trainers.collective``'s calls count as waiting on their own.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

from storage.filesystem import pafs
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
    with contextlib.nullcontext() if session is None else session.health.waiting():
        yield


def draw_timeline(run: str | os.PathLike | Result, storage_filesystem: pafs.FileSystem | None = None) -> str | None:
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
