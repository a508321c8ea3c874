"""The worker processes of the last clean run, kept for the next ``fit()`` in this process.

A clean run's workers are reset (``fresh_process``) and parked here, holding no resources: the
next group of the same shape on the same nodes takes them instead of starting new processes (Ray's
worker start and the framework's imports: seconds of CPU each). They are killed after
``FLOWTRAIN_KEEP_WORKERS_S`` (0: not kept), when another shape parks, and with the driver.
Which workers may be parked is ``reuse``'s rule.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
from collections.abc import Iterable
from typing import Any

import ray

from storage import settings

logger = logging.getLogger(__name__)


def shape_key(resources: dict[str, float], runtime_env: dict | None) -> tuple:
    """What parked workers must share with a new group to be reused: the Ray session they live in,
    each worker's resources and the runtime environment their processes started with."""
    context = ray.get_runtime_context()
    return (
        context.gcs_address,
        context.get_job_id(),
        tuple(sorted(resources.items())),
        json.dumps(runtime_env or {}, sort_keys=True, default=repr),
    )


@dataclasses.dataclass
class _Parked:
    key: tuple
    #: (actor handle, node id, actor id) of each parked worker.
    workers: list[tuple[Any, str, str]]
    timer: threading.Timer


_lock = threading.Lock()
_parked: _Parked | None = None


def kill_actors(actors: Iterable[Any]) -> None:
    """Kill each of ``actors`` for good; one already dead is no error."""
    for actor in actors:
        with contextlib.suppress(Exception):  # already dead, or Ray shut down: the process is gone either way
            ray.kill(actor, no_restart=True)


def _kill(workers: list[tuple[Any, str, str]]) -> None:
    kill_actors(actor for actor, _, _ in workers)


def _expire(parked: _Parked) -> None:
    global _parked
    with _lock:
        if _parked is not parked:
            return
        _parked = None
    if ray.is_initialized():
        _kill(parked.workers)


def park(key: tuple, workers: list[tuple[Any, str, str]]) -> str | None:
    """Keep ``workers`` (reset, holding no resources) for a group of shape ``key``; whatever was
    parked before is killed. Returns why they were killed instead, or None when they were parked."""
    global _parked
    seconds = settings.KEEP_WORKERS_S.read()
    if seconds <= 0 or not workers:
        _kill(workers)
        return f"{settings.KEEP_WORKERS_S.name}=0" if workers else None
    parked = _Parked(key, list(workers), threading.Timer(seconds, lambda: _expire(parked)))
    parked.timer.daemon = True
    with _lock:
        previous, _parked = _parked, parked
    if previous is not None:
        previous.timer.cancel()
        _kill(previous.workers)
    parked.timer.start()
    return None


def take(key: tuple, nodes: list[str]) -> list[Any | None]:
    """For each node in ``nodes`` (one entry per wanted worker), a parked worker on that node, or
    None where there is none. Parked workers not taken are killed: nothing stays parked after."""
    global _parked
    with _lock:
        parked, _parked = _parked, None
    if parked is None:
        return [None] * len(nodes)
    parked.timer.cancel()
    if parked.key != key:
        if parked.key[:2] == key[:2]:  # same Ray session: the handles still work
            _kill(parked.workers)
        return [None] * len(nodes)
    free = list(parked.workers)
    chosen: list[Any | None] = []
    for node in nodes:
        match = next((i for i, (_, where, _) in enumerate(free) if where == node), None)
        chosen.append(free.pop(match)[0] if match is not None else None)
    _kill(free)
    return chosen


def release() -> None:
    """Kill every parked worker now (they would die after ``FLOWTRAIN_KEEP_WORKERS_S`` anyway)."""
    global _parked
    with _lock:
        parked, _parked = _parked, None
    if parked is not None:
        parked.timer.cancel()
        if ray.is_initialized():
            _kill(parked.workers)


def parked_actor_ids() -> set[str]:
    """The Ray actor ids of the parked workers (hex)."""
    with _lock:
        workers = list(_parked.workers) if _parked is not None else []
    return {actor_id for _, _, actor_id in workers}
