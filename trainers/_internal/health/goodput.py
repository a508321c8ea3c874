"""The goodput account of one ``fit()`` call: where its wall time went (docs/health.md, "The
goodput account"), kept by the controller as it moves from phase to phase. Every moment belongs to
one phase; then the waits for data (each committed round's slowest rank's), the synchronous
checkpoint uploads and the training a failure or resize threw away are moved out of training.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable

from storage.health import GoodputAccount
from trainers._internal.events.messages import ReportEvent


class Phase(enum.Enum):
    STARTING = "starting"
    TRAINING = "training"
    RESTARTING = "restarting"
    WAITING = "waiting"


class GoodputClock:
    """Time per phase, and the parts moved out of training (not thread-safe: the controller's own)."""

    def __init__(self, clock: Callable[[], float], gpus_per_worker: float = 0.0) -> None:
        self._clock = clock
        self.gpus_per_worker = gpus_per_worker
        self._phase: Phase | None = None
        self._since = 0.0
        self._started = 0.0
        self._workers = 0
        self.seconds = {phase: 0.0 for phase in Phase}
        self._worker_s = 0.0
        self.checkpoint_s = 0.0
        self.rolled_back_s = 0.0
        #: Waits for data of rounds a checkpoint kept, and of rounds since then (which a failure
        #: throws away with the rest of their training).
        self.data_wait_s = 0.0
        self._data_wait_since_kept_s = 0.0
        #: When this attempt's training began or its latest checkpoint was committed: what a
        #: failure now would throw away is the training since then.
        self._kept_until: float | None = None
        #: The phases as spans of seconds since the start, and the training thrown away (the timeline).
        self.spans: list[tuple[Phase, float, float]] = []
        self.thrown_away_spans: list[tuple[float, float]] = []

    def start(self, workers: int) -> None:
        self._started = self._since = self._clock()
        self._phase, self._workers = Phase.STARTING, workers

    def switch(self, phase: Phase, workers: int | None = None) -> None:
        """The controller moves to ``phase`` now (holding ``workers`` workers from now on)."""
        now = self._clock()
        self._close(now)
        if phase is Phase.TRAINING and self._phase is not Phase.TRAINING:
            self._kept_until = now
        self._phase = phase
        if workers is not None:
            self._workers = workers

    def _close(self, now: float) -> None:
        if self._phase is not None and now > self._since:
            elapsed = now - self._since
            self.seconds[self._phase] += elapsed
            self._worker_s += elapsed * self._workers
            start, end = self._since - self._started, now - self._started
            if self.spans and self.spans[-1][0] is self._phase and self.spans[-1][2] == start:
                start = self.spans.pop()[1]  # the same phase goes on
            self.spans.append((self._phase, start, end))
        self._since = now

    def elapsed(self) -> float:
        """Seconds since the start: when things happen, on the timeline."""
        return self._clock() - self._started

    def waited_for_data(self, seconds: float) -> None:
        """A round was committed whose slowest rank waited ``seconds`` for its batches."""
        self._data_wait_since_kept_s += seconds

    def committed(self, blocked_s: float, reported_at: float | None = None) -> None:
        """A checkpoint was committed; its ranks were blocked uploading it for ``blocked_s``. The
        training kept is that up to ``reported_at`` (when the round's reports arrived; the commit's
        own work on the driver is not the ranks'), or now."""
        self.checkpoint_s += blocked_s
        self.data_wait_s, self._data_wait_since_kept_s = self.data_wait_s + self._data_wait_since_kept_s, 0.0
        if self._phase is Phase.TRAINING:
            kept = self._clock() if reported_at is None else reported_at
            self._kept_until = kept if self._kept_until is None else max(self._kept_until, kept)

    def thrown_away(self, next_phase: Phase, workers: int | None = None) -> None:
        """The attempt ends without its work since the latest checkpoint (a failure, a resize):
        that training is rolled back, and the controller moves to ``next_phase``."""
        if self._phase is Phase.TRAINING and self._kept_until is not None:
            now = self._clock()
            self.rolled_back_s += now - self._kept_until
            self.thrown_away_spans.append((self._kept_until - self._started, now - self._started))
        self._kept_until = None
        self._data_wait_since_kept_s = 0.0  # inside the rolled-back span
        self.switch(next_phase, workers)

    def account(self) -> GoodputAccount:
        """The account so far (closing the current phase's time at now)."""
        now = self._clock()
        self._close(now)
        training = self.seconds[Phase.TRAINING]
        # What was moved out cannot exceed the training it came from (clocks of other processes).
        checkpoint = min(self.checkpoint_s, training)
        rolled_back = min(self.rolled_back_s, training - checkpoint)
        data_wait = min(self.data_wait_s + self._data_wait_since_kept_s, training - checkpoint - rolled_back)
        worker_hours = self._worker_s / 3600
        return GoodputAccount(
            wall_s=now - self._started,
            starting_s=self.seconds[Phase.STARTING],
            training_s=training - checkpoint - rolled_back - data_wait,
            data_wait_s=data_wait,
            checkpoint_s=checkpoint,
            restarting_s=self.seconds[Phase.RESTARTING],
            rolled_back_s=rolled_back,
            waiting_s=self.seconds[Phase.WAITING],
            worker_hours=worker_hours,
            gpu_hours=worker_hours * self.gpus_per_worker,
        )


def waited_for_data_s(round_: Iterable[ReportEvent]) -> float:
    """How long a committed round waited for data: its slowest rank's wait for batches."""
    return max((e.data_wait_s for e in round_), default=0.0)


def blocked_on_upload_s(round_: Iterable[ReportEvent]) -> float:
    """How long a committed round's checkpoint kept its ranks from training: the slowest rank's
    synchronous upload (an ASYNC upload runs beside the training and blocks nothing)."""
    return max((e.upload.seconds for e in round_ if e.upload is not None and not e.uploaded_in_background), default=0.0)
