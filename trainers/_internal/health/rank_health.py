"""What a worker measures of itself for every report, at no extra round trip: its step (from its
previous ``report()`` to this one, less its waits on other ranks), how much of it the loop waited
for batches, and the most memory it has held. The controller judges the steps (``stragglers``)
and the run's record keeps the memory (``storage.health``)."""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import time
from collections.abc import Iterator

from storage.memory_peak import MemoryPeak
from trainers.backend import FrameworkProcess
from trainers.tuning import LIMIT_READ_EVERY_S

#: cgroup v1 writes "no limit" as the largest page-aligned int64; anything from 2**60 up is none.
UNLIMITED_CGROUP_BYTES = 2**60


@dataclasses.dataclass(frozen=True)
class StepHealth:
    """One rank's step, as its report carries it."""

    #: Seconds from the end of its previous ``report()`` to this one; None for the first report of
    #: an attempt (that span holds the start-up, not a step).
    step_s: float | None
    #: Of those, the seconds it marked as waiting on other ranks (``trainers.health.waiting``, the
    #: barriers of ``trainers.collective``).
    waiting_s: float
    #: Its peak memory in this attempt, when it grew past what it last sent by 1 MiB or 1% (else None).
    memory: MemoryPeak | None
    #: Seconds the loop waited for its next batch since the previous report (the first report's
    #: include its first epoch's start).
    data_wait_s: float = 0.0

    @property
    def busy_s(self) -> float | None:
        """The step's time spent on this rank's own work: what stragglers are judged on."""
        return None if self.step_s is None else max(0.0, self.step_s - self.waiting_s)


class RankHealth:
    """One worker's measures for one attempt. Made when the attempt's training function starts:
    the process's peaks are reset then, so a kept process reports this attempt's peak, as a fresh
    one would. ``framework`` measures the device's memory (the backend's ``FrameworkProcess``)."""

    def __init__(self, framework: type[FrameworkProcess] = FrameworkProcess) -> None:
        self.framework = framework
        reset_peaks(framework)
        self._step_started: float | None = None
        self._waiting_s = 0.0
        #: Seconds waited for batches since the last report: the data iterators add to it directly
        #: (an attribute, not a call: it is paid for every batch).
        self.data_wait_s = 0.0
        self._memory: MemoryPeak | None = None
        # ``memory_limit()`` and when it was read: at most once a second, or a peak that creeps
        # report after report would cost each report two file reads.
        self._limit: int | None = None
        self._limit_read_at = -float("inf")

    def report_starts(self) -> StepHealth:
        """A ``report()`` call begins: the step since the previous one ends."""
        now = time.monotonic()
        step_s = None if self._step_started is None else now - self._step_started
        waiting_s, self._waiting_s = self._waiting_s, 0.0
        data_wait_s, self.data_wait_s = self.data_wait_s, 0.0
        sent = self._memory
        device = self.framework.device_peaks()
        if sent is not None and device is None and _rss_bytes() <= sent.rss_bytes + _slack(sent.rss_bytes):
            return StepHealth(step_s, waiting_s, None, data_wait_s)  # the common case, kept to one getrusage
        if now - self._limit_read_at >= LIMIT_READ_EVERY_S:  # grown: worth its limit
            self._limit, self._limit_read_at = memory_limit(), now
        memory = _peak(self._limit, device)
        if sent is not None and not _grown(memory, sent):
            return StepHealth(step_s, waiting_s, None, data_wait_s)
        self._memory = memory
        return StepHealth(step_s, waiting_s, memory, data_wait_s)

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

    def now(self) -> MemoryPeak:
        """The peak now, with the limit read afresh (for a failure's message)."""
        return peak_memory(memory_limit(), self.framework)


def _slack(sent_bytes: int) -> int:
    """How much a figure may grow before its peak is sent again: 1 MiB or 1%, whichever is more.
    A peak that creeps by pages would otherwise ride on every report, and every such report costs
    the driver an object to unpickle per rank (about 2 us: 0.13 ms a round at 64 ranks)."""
    return max(2**20, sent_bytes // 100)


def _grown(memory: MemoryPeak, sent: MemoryPeak) -> bool:
    """Whether ``memory`` is worth sending after ``sent``: a figure grew past its slack, or the limit changed."""
    pairs = (
        (memory.rss_bytes, sent.rss_bytes),
        (memory.cuda_allocated_bytes, sent.cuda_allocated_bytes),
        (memory.cuda_reserved_bytes, sent.cuda_reserved_bytes),
    )
    if memory.limit_bytes != sent.limit_bytes:
        return True
    return any(new is not None and (old is None or new > old + _slack(old)) for new, old in pairs)


def peak_memory(limit_bytes: int | None = None, framework: type[FrameworkProcess] = FrameworkProcess) -> MemoryPeak:
    """This process's peak resident set and, when it has used a device, ``framework``'s peaks on
    it, with ``limit_bytes`` as its limit. About a microsecond on CPU: ``getrusage``, no file read."""
    return _peak(limit_bytes, framework.device_peaks())


def _peak(limit_bytes: int | None, device: tuple[int, int] | None) -> MemoryPeak:
    allocated, reserved = device or (None, None)
    return MemoryPeak(_rss_bytes(), allocated, reserved, limit_bytes)


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def memory_limit() -> int | None:
    """The tightest limit on this process's memory: its memory cgroup's (v1 ``memory.limit_in_bytes``
    or v2 ``memory.max``) or its ``RLIMIT_AS``; None when neither limits it."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    limits = [limit for limit in (_cgroup_limit(), soft) if limit not in (None, resource.RLIM_INFINITY)]
    return min(limits, default=None)


def _cgroup_limit() -> int | None:
    try:
        with open("/proc/self/cgroup") as lines:
            memberships = [line.rstrip("\n").split(":", 2) for line in lines]
    except OSError:
        return None
    candidates = []
    for _, controllers, path in (m for m in memberships if len(m) == 3):
        if "memory" in controllers.split(","):  # cgroup v1
            candidates.append(f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
        elif controllers == "":  # cgroup v2: one hierarchy
            candidates += [f"/sys/fs/cgroup{path}/memory.max", f"/sys/fs/cgroup/unified{path}/memory.max"]
    for candidate in candidates:
        try:
            with open(candidate) as limit:
                text = limit.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < UNLIMITED_CGROUP_BYTES:
            return int(text)
    return None


def reset_peaks(framework: type[FrameworkProcess] = FrameworkProcess) -> None:
    """Start the peaks over (a process kept from an earlier attempt behaves as a fresh one): Linux's
    ``clear_refs`` 5 resets the peak resident set ``getrusage`` reads; the framework its device's."""
    with contextlib.suppress(OSError):  # not Linux, or not allowed: the peak covers the process's life
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    framework.reset_device_peaks()
