"""A one-line live view of the run in a terminal: attempt, reports, latest metrics."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from trainers.worker_output import is_captured


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class ProgressLine:
    """Rewrites one line of ``stream`` at most ten times a second; silent when not a terminal, and
    when a caller shows the run itself (it captures the run's worker output, as the Prefect tasks do)."""

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

    def close(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False
