"""``get_all_reported_checkpoints()``: a worker asks, the controller answers when it can.

The worker pushes a ``CheckpointsQuery`` naming how many rounds it reported in this attempt; the
controller answers with the run's kept checkpoints once that many rounds are committed (and, in
VALIDATED mode, no validation is pending). When ``timeout_s`` passes first, the worker asks for
an answer at once and returns what the run has then, as Ray Train does.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from storage import Checkpoint
from trainers._internal.events.messages import CheckpointsQuery
from trainers.tuning import STOP_CHECK_S
from trainers.validation import CheckpointConsistencyMode, ReportedCheckpoint, ReportedCheckpointStatus

if TYPE_CHECKING:  # the driver's side only: a worker keeps the run's records out of its memory
    from storage import RunRecord


class QueryingSession(Protocol):
    """What ``read`` uses of the worker's session (``trainers._internal.session.worker_session.WorkerSession``)."""

    uploader: Any
    answers: Answers
    context: Any
    num_reports: int
    emit: Callable[[Any], None]

    @property
    def filesystem(self) -> Any: ...

    def check_stopped(self) -> None: ...


#: What the controller sends back: (path inside the run's filesystem, metrics, status) per kept
#: checkpoint, in report order.
Answer = list[tuple[str, dict[str, Any], str]]


class PendingQueries:
    """The controller's unanswered ``get_all_reported_checkpoints()`` calls of this attempt."""

    def __init__(self) -> None:
        self._waiting: dict[tuple[int, int], CheckpointsQuery] = {}

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def add(self, query: CheckpointsQuery) -> None:
        self._waiting[(query.world_rank, query.query_id)] = query

    def clear(self) -> None:
        self._waiting.clear()

    def answer(
        self,
        *,
        committed_rounds: int,
        validating: Callable[[], bool],
        storage: RunRecord,
        send: Callable[[int, int, Answer], None],
    ) -> None:
        """Answer every query whose wait is over: ``committed_rounds`` rounds of this attempt are
        committed; ``validating()`` tells whether a validation is pending."""
        answer: Answer | None = None
        for key, query in list(self._waiting.items()):
            ready = query.num_reports <= committed_rounds and not (query.validated and validating())
            if query.wait and not ready:
                continue
            del self._waiting[key]
            if answer is None:  # the run's kept checkpoints, oldest first
                answer = [
                    (storage.layout.path_of(c.dir_name), dict(c.metrics), c.status)
                    for c in storage.snapshot.checkpoints
                ]
            send(query.world_rank, query.query_id, answer)


class Answers:
    """A worker's inbox for the controller's answers."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._answers: dict[int, Answer] = {}
        self.next_id = 0

    def put(self, query_id: int, answer: Answer) -> None:
        with self._condition:
            self._answers[query_id] = answer
            self._condition.notify_all()

    def take(self, query_id: int, timeout_s: float) -> Answer | None:
        with self._condition:
            self._condition.wait_for(lambda: query_id in self._answers, timeout_s)
            for stale in [i for i in self._answers if i < query_id]:
                del self._answers[stale]  # a second answer to a query already answered
            return self._answers.pop(query_id, None)


def read(session: QueryingSession, consistency_mode: Any, timeout_s: float | None) -> list[ReportedCheckpoint]:
    """The body of ``get_all_reported_checkpoints()`` in a worker."""
    if not isinstance(consistency_mode, CheckpointConsistencyMode):
        raise ValueError(
            f"get_all_reported_checkpoints(consistency_mode={consistency_mode!r}): must be "
            "CheckpointConsistencyMode.COMMITTED or CheckpointConsistencyMode.VALIDATED."
        )
    if timeout_s is not None and (
        isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or math.isnan(timeout_s) or timeout_s < 0
    ):
        raise ValueError(
            f"get_all_reported_checkpoints(timeout_s={timeout_s!r}): must be None (wait as long as it takes) or seconds >= 0."
        )
    session.uploader.flush()  # reports still uploading in the background are sent first, so they count
    answers = session.answers
    query_id = answers.next_id
    answers.next_id += 1
    validated = consistency_mode is CheckpointConsistencyMode.VALIDATED
    query = CheckpointsQuery(session.context.world_rank, query_id, session.num_reports, validated)
    session.emit(query)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        session.check_stopped()
        left = STOP_CHECK_S if deadline is None else max(0.0, min(STOP_CHECK_S, deadline - time.monotonic()))
        answer = answers.take(query_id, left)
        if answer is not None:
            break
        if deadline is not None and time.monotonic() >= deadline:
            session.emit(CheckpointsQuery(query.world_rank, query_id, query.num_reports, query.validated, wait=False))
            deadline = None  # asked for an answer now: wait for it
    return [
        ReportedCheckpoint(Checkpoint(path, session.filesystem), metrics, ReportedCheckpointStatus(status))
        for path, metrics, status in answer
    ]
