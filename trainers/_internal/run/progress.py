"""What the driver shows of a run itself: log lines, and in a terminal one live line (attempt,
reports, latest metrics)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

from storage import Checkpoint
from storage.health import StragglerRecord
from trainers._internal.worker_output import is_captured
from trainers.callback import TrainRunContext, UserCallback

logger = logging.getLogger(__name__)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class ProgressLine(UserCallback):
    """The driver's own listener: logs commits (debug), restarts and resizes, and rewrites one line
    of ``stream`` at most ten times a second; that line is silent when not a terminal, and when a
    caller shows the run itself (it captures the run's worker output, as the Prefect tasks do)."""

    def __init__(self, name: str, stream: TextIO | None = None, *, enabled: bool | None = None) -> None:
        self.name = name
        self.stream = stream or sys.stderr
        self.enabled = (self.stream.isatty() and not is_captured(name)) if enabled is None else enabled
        self._last = 0.0
        self._shown = False
        self._reports = 0

    def update(self, attempt: int, metrics: dict[str, Any]) -> None:
        self._reports += 1
        now = time.monotonic()
        if not self.enabled or now - self._last < 0.1:
            return
        self._last = now
        shown = " ".join(f"{k}={_short(v)}" for k, v in list(metrics.items())[:6] if not isinstance(v, dict))
        line = f"[{self.name}] attempt {attempt} | reports {self._reports} | {shown}"
        self.stream.write("\r" + line[:160].ljust(80))
        self.stream.flush()
        self._shown = True

    def note(self, message: str) -> None:
        if self.enabled:
            self.stream.write(("\n" if self._shown else "") + f"[{self.name}] {message}\n")
            self.stream.flush()
            self._shown = False

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None
    ) -> None:
        if checkpoint is not None:
            logger.debug("%s: committed %s (attempt %d)", self.name, checkpoint.path, run_context.attempt)
        self.update(run_context.attempt, metrics[0])

    def on_restart(self, run_context: TrainRunContext, failures: list[Any], resume_from: Checkpoint | None) -> None:
        where, causes = resume_from.path if resume_from else "the start", "; ".join(f.describe() for f in failures)
        how = run_context.restarts[-1].describe() if run_context.restarts else "restarting"
        logger.info(
            "%s: attempt %d failed (%s); %s; resuming from %s", self.name, run_context.attempt, causes, how, where
        )
        self.note(f"attempt {run_context.attempt} failed; {how}; resuming from {where}")

    def on_resize(self, run_context: TrainRunContext, old_size: int, new_size: int) -> None:
        attempt = run_context.attempt
        logger.info(
            "%s: more workers fit; restarting attempt %d's %d workers as %d", self.name, attempt, old_size, new_size
        )
        self.note(f"resizing from {old_size} to {new_size} workers; resuming from the latest checkpoint")

    def on_straggler(self, run_context: TrainRunContext, straggler: StragglerRecord) -> None:
        self.note(f"straggler: {straggler.describe()}")  # the controller logs it

    def close(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False
