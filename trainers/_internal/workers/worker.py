"""The body of one training worker (a Ray actor).

The user's training function runs in a thread of the actor, so the actor still answers the
controller while it trains (stop, barriers, hang reports). Its events go to the controller over
the event channel (``event_channel.Outbox``), kept until acknowledged; ``next_events``, the Ray
long poll the controller keeps open, carries them only when that connection fails, and its
failing tells the controller that the worker died.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ray

from trainers._internal.events.event_channel import ChannelAddress, Outbox
from trainers._internal.events.messages import NOT_TRAINING, Event
from trainers._internal.worker_output import announce, worker_label
from trainers._internal.workers.reuse import process_refusal
from trainers.backend import FrameworkProcess
from trainers.tuning import INTERRUPT_EVERY_S, INTERRUPT_GRACE_S

# What runs only in a worker (the session, the training thread, the process reset) is imported by
# the methods that use it: the driver imports this module for the actor class alone.
if TYPE_CHECKING:
    from trainers._internal.session.worker_session import WorkerSession


@dataclasses.dataclass(frozen=True)
class WorkerMetadata:
    """Where a worker landed."""

    node_id: str
    node_ip: str
    hostname: str
    pid: int
    gpu_ids: tuple[str, ...]


def describe_activity(thread: threading.Thread | None) -> str:
    """The innermost line of user code the training thread is running, and whether it waits in
    torch.distributed (a collective) below it."""
    if thread is None or not thread.is_alive() or thread.ident is None:
        return NOT_TRAINING
    frame = sys._current_frames().get(thread.ident)
    if frame is None:
        return NOT_TRAINING
    stack = traceback.extract_stack(frame)
    in_collective = any("torch/distributed" in f.filename for f in stack)
    ours = (os.sep + "trainers" + os.sep, os.sep + "storage" + os.sep, "site-packages", "threading.py")
    user = [f for f in stack if not any(part in f.filename for part in ours)]
    where = user[-1] if user else stack[-1]
    text = f"{os.path.basename(where.filename)}:{where.lineno} in {where.name}: {(where.line or '').strip()}"
    return ("waiting in a torch.distributed collective at " if in_collective else "running ") + text


@dataclasses.dataclass(frozen=True)
class StopAnswer:
    """How a worker's ``stop`` went: the actor's id when the process can serve again, else why not."""

    actor_id: str | None
    why_not: str = ""


def _raise_in(thread: threading.Thread, error: type[BaseException]) -> None:
    """Raise ``error`` in ``thread`` at its next Python instruction (a call blocked in C finishes
    first): how a training function busy in user code is stopped without ending the process."""
    import ctypes

    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(error))


class TrainWorker:
    """One training worker. Methods are called by the controller through Ray."""

    def __init__(self, omp_num_threads: int | None = None) -> None:
        #: This worker's events until the controller acknowledges them: sent over the event
        #: channel, or (without a working connection) left for ``next_events``.
        self._outbox = Outbox()
        self._session: WorkerSession | None = None
        self._thread: threading.Thread | None = None
        self._label = "TrainWorker"
        if omp_num_threads is not None:
            # A worker that may be kept holds no CPU of its own, so Ray set its OMP_NUM_THREADS to
            # 1: give it what its bundle reserves, as Ray does for a worker that holds it.
            os.environ["OMP_NUM_THREADS"] = str(omp_num_threads)
        # The worker's own code, loaded as the actor starts: the first attempt waits on ``start``.
        from trainers._internal.session import train_thread  # noqa: F401
        from trainers._internal.workers.fresh_process import ProcessBaseline

        #: The process before any attempt ran: ``stop`` puts it back before it serves again.
        self._baseline = ProcessBaseline.capture()
        #: What the framework of the latest attempt needs when it stops (its backend's).
        self._framework: type[FrameworkProcess] = FrameworkProcess

    def __repr__(self) -> str:
        # Ray shows this actor's lines under this name; trainers.worker_output routes them by it.
        return self._label

    def metadata(self) -> WorkerMetadata:
        return WorkerMetadata(
            node_id=ray.get_runtime_context().get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            gpu_ids=tuple(str(g) for g in ray.get_gpu_ids()),
        )

    def stop(self, wait_s: float = 0.0, failed: bool = False, lost_hosts: frozenset[str] = frozenset()) -> StopAnswer:
        """End this worker's attempt and reset the process as a fresh worker (``fresh_process``).
        Answers the actor's id, or why the process cannot serve again.

        A running training function is stopped: ``report()`` and barriers raise
        ``TrainingInterrupted``, ``FrameworkProcess.interrupt`` aborts its collectives (NCCL), and
        from ``INTERRUPT_GRACE_S`` on the same error is raised in the thread every
        ``INTERRUPT_EVERY_S``, up to ``wait_s``; a thread still running (stuck in C, or
        swallowing it) means no reuse. Then the framework's group is left, so waiting peers fail
        at once. ``failed``: interrupt even an ended function (its last collectives may wait on
        the GPU for a rank that is gone). ``lost_hosts``: nodes that left the cluster, whose
        connections are shut first (a partitioned host closes none itself).
        """
        from trainers._internal.session.worker_session import TrainingInterrupted
        from trainers._internal.workers.connections import cut_connections_to

        framework = self._framework
        if self._session is not None:
            self._session.stop_requested.set()
        thread = self._thread
        running = thread is not None and thread.is_alive()
        if running or failed:
            framework.interrupt()
        if thread is not None and running:
            cut_connections_to(lost_hosts)
            deadline = time.monotonic() + wait_s
            thread.join(min(INTERRUPT_GRACE_S, wait_s))
            while thread.is_alive() and time.monotonic() < deadline:
                _raise_in(thread, TrainingInterrupted)
                thread.join(min(INTERRUPT_EVERY_S, max(0.0, deadline - time.monotonic())))
            if thread.is_alive():
                return StopAnswer(
                    None, f"its training function did not stop within {wait_s:g} s ({describe_activity(thread)})"
                )
        framework.leave_group()
        why_not = process_refusal() or framework.unusable()
        if why_not:
            return StopAnswer(None, why_not)
        self._outbox.close()
        self._outbox = Outbox()
        self._session = None
        self._thread = None
        self._label = "TrainWorker"
        self._baseline.restore(framework)
        return StopAnswer(ray.get_runtime_context().get_actor_id())

    def set_env(self, env: dict[str, str]) -> None:
        os.environ.update(env)

    def execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` in this worker (backends use it to set up process groups)."""
        return fn(*args, **kwargs)

    def start(
        self,
        train_fn: Callable[..., Any],
        config: Any,
        takes_config: bool,
        session_args: dict[str, Any],
        context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
        channel: ChannelAddress | None = None,
    ) -> bool:
        """Start the training function in a thread; True when its events go over ``channel``."""
        from trainers._internal.session.train_thread import train_in_thread
        from trainers._internal.session.worker_session import WorkerSession

        run_context = session_args["context"]
        self._label = worker_label(run_context.experiment_name, run_context.world_rank)
        announce(self._label)
        if channel is not None:
            try:
                self._outbox.connect(channel, run_context.world_rank)
            except OSError as error:
                print(
                    f"flowtrain: cannot reach the controller at {channel.host}:{channel.port} ({error}); "
                    "reports go through Ray instead",
                    file=sys.stderr,
                )
        self._session = WorkerSession(emit=self._outbox.put, **session_args)
        self._framework = self._session.framework
        self._thread = threading.Thread(
            target=train_in_thread,
            args=(train_fn, config, takes_config, self._session, self._outbox.put, context),
            name="train_loop_per_worker",
            daemon=True,
        )
        self._thread.start()
        return self._outbox.connected

    def next_events(self, timeout_s: float, acked: int = 0) -> list[tuple[int, Event]]:
        """The controller's long poll: forget the events it holds (numbered up to ``acked``), then
        wait up to ``timeout_s`` for events the connection cannot carry; returns them, numbered."""
        return self._outbox.take(timeout_s, acked)

    def activity_and_unacknowledged(self) -> tuple[str, list[tuple[int, Event]]]:
        """Where the training function is (file:line and code, for hang reports), and every event
        not acknowledged yet: at an attempt's end the controller takes what a stalled connection
        holds instead of waiting ``ACK_TIMEOUT_S`` for this worker to give it up and replay it."""
        return describe_activity(self._thread), self._outbox.unacknowledged()

    def release_sync(self, index: int, data: Any) -> None:
        """Every rank reached barrier ``index``: let this one continue with rank 0's data."""
        if self._session is not None:
            self._session.release(index, data)

    def mark_preempted(self, info: Any) -> None:
        """A node of this run is being preempted: ``get_preemption_info()`` answers ``info`` from now on."""
        if self._session is not None:
            self._session.preemption_info = info

    def answer_checkpoints(self, query_id: int, answer: Any) -> None:
        """The controller's answer to this worker's ``get_all_reported_checkpoints()`` call."""
        if self._session is not None:
            self._session.answer_checkpoints(query_id, answer)
