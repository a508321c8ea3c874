"""The thread a worker runs the user's training function in, and the event that says how it ended.
Imported by the worker when it starts training, so what runs only in a worker stays out of the driver.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
import traceback
from collections.abc import Callable
from typing import Any

from trainers._internal.events.messages import Event, FailedEvent, FinishedEvent
from trainers._internal.health.memory_failure import is_out_of_memory, leave_memory_summary
from trainers._internal.session.worker_session import TrainingInterrupted, WorkerSession, set_session
from trainers.errors import WorkerError


def sendable(error: BaseException) -> BaseException:
    """The error itself when it pickles, else a WorkerError carrying its type and message."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - pickling fails in many ways; the stand-in says what the error was
        return WorkerError(f"{type(error).__module__}.{type(error).__qualname__}: {error}")


def _release_locals(error: BaseException) -> None:
    """Free the locals of every frame ``error`` (and the errors it came from) passed through: the
    failure event holds the error until acknowledged, and a model left in a frame would keep its
    process group's sockets open, so the peers in a collective with this rank would wait on."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)  # skips the frames still running, this one
        current = current.__cause__ or current.__context__


def run_training_function(
    train_fn: Callable[..., Any],
    config: Any,
    takes_config: bool,
    session: WorkerSession,
    emit: Callable[[Event], None],
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> None:
    """Run the user's function under ``session``, inside the backend's ``context``; emit how it ended."""
    rank = session.context.world_rank
    set_session(session)
    try:
        with context():
            value = train_fn(config) if takes_config else train_fn()
        session.flush()
    except TrainingInterrupted:
        return
    except BaseException as error:  # noqa: BLE001 - the user's code may raise anything; all of it goes back
        failure = FailedEvent(rank, sendable(error), traceback.format_exc())
        if is_out_of_memory(error):
            memory = session.health.now()
            summary = leave_memory_summary(
                session.layout,
                session.filesystem,
                rank=rank,
                attempt=session.attempt,
                reports=session.num_reports,
                error=error,
                memory=memory,
                framework=session.framework,
            )
            failure = dataclasses.replace(failure, memory=memory, memory_summary=summary)
        _release_locals(error)
        # A report() made before it raised may still be uploading (ASYNC): it must reach the
        # controller before the failure, or the round is lost.
        with contextlib.suppress(BaseException):  # the training function's own error is the one to report
            session.flush()
        emit(failure)
        return
    finally:
        set_session(None)
    try:
        pickle.dumps(value)
    except Exception as error:  # noqa: BLE001 - pickling fails in many ways; each is reported as the return value's failure
        unsendable = WorkerError(
            f"the training function returned {type(value).__name__}, which cannot be pickled: {error}"
        )
        emit(FailedEvent(rank, unsendable, traceback.format_exc()))
        return
    emit(FinishedEvent(rank, value))


def train_in_thread(*args: Any) -> None:
    # The controller may raise TrainingInterrupted in this thread at any instruction, also outside
    # run_training_function's own handler: it ends the thread quietly wherever it lands.
    try:
        run_training_function(*args)
    except TrainingInterrupted:
        pass
