"""Spare workers: processes started and warmed up ahead of a failure, so that replacing a failed
rank does not wait for a new process to start and import its framework (docs/fault-tolerance.md,
"Spare workers"). A spare starts beside the group on a node it uses, holding no resources, and
imports what rank 0 had imported; ``RayWorkerGroup.refill`` gives it a failed rank's bundle, and
the next spare starts once the re-formed group reports, not to compete with the recovery for CPU.
Only workers started beside their group have spares: a GPU worker must start in its bundle to be
given its GPU, which the failed worker holds until it is gone.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Any


def installed_modules() -> list[str]:
    """Run in a worker: the names of the installed modules this process has imported (what a
    spare imports to be as warm as this worker)."""
    from trainers._internal.workers.fresh_process import installed_roots, is_user_module

    roots = installed_roots()
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if module is not None and name != "__main__" and not is_user_module(name, module, roots)
    )


def import_quietly(names: list[str]) -> int:
    """Run in a spare: import each of ``names``, skipping those that fail; returns how many loaded.

    The imports run in a thread of their own under Linux's ``SCHED_IDLE`` policy (a thread's
    scheduling is its own), so a spare warms up on the CPU the training leaves idle; the
    process's other threads, which later train, keep their priority."""
    loaded = 0

    def import_all() -> None:
        nonlocal loaded
        with contextlib.suppress(OSError):  # not Linux, or not allowed: import at the usual priority
            os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
        for name in names:
            # A module that imports only in its own context: the worker imports it if needed.
            with contextlib.suppress(Exception):
                importlib.import_module(name)
                loaded += 1

    thread = threading.Thread(target=import_all, name="spare-warm-up")
    thread.start()
    thread.join()
    return loaded


class SparePool:
    """One group's spare workers, by node. ``new_worker(node_id)`` starts a worker on that node."""

    def __init__(self, new_worker: Callable[[str], Any]) -> None:
        self._new_worker = new_worker
        #: (actor, node id, its warm-up's ObjectRef) of each spare.
        self._spares: list[tuple[Any, str, Any]] = []
        #: What spares import when they start.
        self.modules: list[str] = []

    def fill(self, nodes: list[str], per_node: int) -> list[Any]:
        """Have ``per_node`` spares on each of ``nodes``: start those missing, each importing
        ``modules``; returns the spares on other nodes (no longer wanted), to be killed."""
        unwanted = [actor for actor, node, _ in self._spares if node not in nodes]
        self._spares = [spare for spare in self._spares if spare[1] in nodes]
        for node in nodes:
            for _ in range(per_node - sum(1 for _, where, _ in self._spares if where == node)):
                actor = self._new_worker(node)
                self._spares.append((actor, node, actor.execute.remote(import_quietly, self.modules)))
        return unwanted

    def take(self, node: str) -> tuple[Any, Any] | None:
        """A spare on ``node`` (removed from the pool) and the ObjectRef of its warm-up, which must
        be done before the spare is given any work (importing a framework from two threads at once
        can abort the process: torch.distributed's C init), or None."""
        for i, (actor, where, warm_up) in enumerate(self._spares):
            if where == node:
                del self._spares[i]
                return actor, warm_up
        return None

    def clear(self) -> list[Any]:
        """Forget every spare; returns their actors (to be killed)."""
        actors = [actor for actor, _, _ in self._spares]
        self._spares = []
        return actors
