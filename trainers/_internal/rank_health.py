"""What a worker measures of itself for every report, at no extra round trip: how long its step
took (from the end of its previous ``report()`` to this one, less the time it marked as waiting on
other ranks) and the most memory it has held. The controller judges the steps
(``trainers._internal.stragglers``) and the run's record keeps the memory (``storage.health``)."""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import sys
import time
from collections.abc import Iterator

from storage.health import MemoryPeak


@dataclasses.dataclass(frozen=True)
class StepHealth:
    """One rank's step, as its report carries it."""

    #: Seconds from the end of its previous ``report()`` to this one; None for the first report of
    #: an attempt (that span holds the start-up, not a step).
    step_s: float | None
    #: Of those, the seconds it marked as waiting on other ranks (``trainers.health.waiting``, the
    #: barriers of ``trainers.collective``).
    waiting_s: float
    #: Its peak memory in this attempt, when it grew since its previous report (else None).
    memory: MemoryPeak | None

    @property
    def busy_s(self) -> float | None:
        """The step's time spent on this rank's own work: what stragglers are judged on."""
        return None if self.step_s is None else max(0.0, self.step_s - self.waiting_s)


class RankHealth:
    """One worker's measures for one attempt. Made when the attempt's training function starts:
    the process's peaks are reset then, so a kept process reports this attempt's peak, as a fresh
    one would."""

    def __init__(self) -> None:
        reset_peaks()
        self._step_started: float | None = None
        self._waiting_s = 0.0
        self._memory: MemoryPeak | None = None

    def report_starts(self) -> StepHealth:
        """A ``report()`` call begins: the step since the previous one ends."""
        now = time.monotonic()
        step_s = None if self._step_started is None else now - self._step_started
        waiting_s, self._waiting_s = self._waiting_s, 0.0
        memory = peak_memory()
        grown = memory if memory != self._memory else None
        self._memory = memory
        return StepHealth(step_s, waiting_s, grown)

    def report_ends(self) -> None:
        """A ``report()`` call returned: the next step begins (a checkpoint's upload is not a step's)."""
        self._step_started = time.monotonic()
        self._waiting_s = 0.0

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Time inside counts as waiting on other ranks, not as this rank's work."""
        started = time.monotonic()
        try:
            yield
        finally:
            self._waiting_s += time.monotonic() - started

    @property
    def last_memory(self) -> MemoryPeak | None:
        """The peak at this rank's latest report (for a failure's message)."""
        return self._memory


def peak_memory() -> MemoryPeak:
    """This process's peak resident set and, when it has used CUDA, PyTorch's peaks on its device.
    About a microsecond on CPU: ``getrusage``, no file read."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return MemoryPeak(rss)
    return MemoryPeak(rss, torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())


def reset_peaks() -> None:
    """Start the peaks over (a process kept from an earlier attempt or run behaves as a fresh one).

    Linux's ``clear_refs`` 5 resets the process's peak resident set, which ``getrusage`` reads;
    PyTorch resets its own CUDA peaks."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass  # not Linux, or not allowed: the peak covers the process's life
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()
