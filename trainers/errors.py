"""Errors ``fit()`` raises. Each is a type you can catch, and each survives pickling."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING

from storage.memory_peak import MemoryPeak
from storage.upload import CheckpointUploadError

if TYPE_CHECKING:
    from storage.health import PreflightRecord
    from trainers.preemption import PreemptionInfo


class TrainingFailedError(RuntimeError):
    """Training stopped for good: the failure budget ran out, or the run could not go on."""


@dataclasses.dataclass(frozen=True)
class RankFailure:
    """What went wrong on one worker: its rank, where it ran, and the original traceback."""

    world_rank: int
    node_id: str
    node_ip: str
    #: ``"error"`` (the loop raised), ``"died"`` (the process or its node went away), ``"hung"``,
    #: ``"preempted"`` (its node went away after a drain for preemption), ``"unreachable"`` (its
    #: host stopped answering while the other ranks' did: a cut link or a lost host).
    kind: str
    error_type: str
    message: str
    traceback: str
    #: Reports the rank had made in the failed attempt (the step it was in), when known.
    reports: int | None = None
    #: Its memory: when it ran out, then; else at its latest report that carried it.
    memory: MemoryPeak | None = None
    #: It failed for want of memory: an out-of-memory error, Ray's memory monitor, or killed
    #: while its memory was at its limit (the kernel's OOM killer).
    out_of_memory: bool = False
    #: Where the rank's memory summary was left in the run's storage, when it ran out.
    memory_summary: str | None = None

    def describe(self) -> str:
        """One line: rank, node, cause, and for a rank that ran out of memory, the step and the memory."""
        if self.world_rank < 0:
            return f"the worker group {self.kind}: {self.error_type}: {self.message}"
        where = f"node {self.node_ip or '?'} ({self.node_id[:12] or '?'})"
        line = f"rank {self.world_rank} on {where} {self.kind}: {self.error_type}: {self.message}"
        if not self.out_of_memory and (self.kind != "died" or self.memory is None):
            return line  # an error of its own says what happened; a bare death is helped by its memory
        notes = [] if self.reports is None else [f"after {self.reports} report(s) in this attempt"]
        if self.out_of_memory:
            notes.append("out of memory" + (f" ({self.memory.describe()})" if self.memory else ""))
            notes.append("lower the batch size or the model's footprint, or give the worker more memory")
        elif self.memory is not None:
            notes.append(f"memory at its last report: {self.memory.describe()}")
        if self.memory_summary:
            notes.append(f"memory summary in {self.memory_summary}")
        return f"{line} [{'; '.join(notes)}]"


class WorkerGroupError(TrainingFailedError):
    """One or more workers failed.

    ``worker_failures`` maps each failed world rank to the exception it raised (or a stand-in
    when the original could not be sent back); ``failures`` holds the rank, node and original
    traceback of each.
    """

    def __init__(
        self,
        error_message: str,
        worker_failures: dict[int, BaseException],
        failures: dict[int, RankFailure] | None = None,
        *,
        attempt: int = 0,
        budget_exhausted: bool = False,
    ) -> None:
        super().__init__(error_message)
        self.worker_failures = worker_failures
        self.failures = failures or {}
        self.attempt = attempt
        self.budget_exhausted = budget_exhausted

    def __reduce__(self):
        rebuild = functools.partial(type(self), attempt=self.attempt, budget_exhausted=self.budget_exhausted)
        return (rebuild, (str(self), self.worker_failures, self.failures))


class NCCLHangError(WorkerGroupError):
    """Workers hung in an NCCL collective (GPU training): a rank stopped reporting while the others
    waited for it. Raised instead of a plain ``WorkerGroupError`` when ``FailureConfig.report_timeout_s``
    finds a hung rank in an NCCL run, so GPU users can catch hangs on their own."""


def worker_group_error_type(failures: list[RankFailure], collective_backend: str | None) -> type[WorkerGroupError]:
    """``NCCLHangError`` when a rank hung in a run whose collectives use NCCL, else ``WorkerGroupError``:
    a hang on NCCL needs a GPU-specific fix (NCCL_DEBUG, timeouts, a bad link); on gloo it is an
    ordinary worker failure."""
    if collective_backend == "nccl" and any(f.kind == "hung" for f in failures):
        return NCCLHangError
    return WorkerGroupError


class CheckpointUploadFailedError(WorkerGroupError, CheckpointUploadError):
    """``fit()`` ended because a checkpoint could not be uploaded into the run's storage.

    Both a ``WorkerGroupError`` and a ``storage.upload.CheckpointUploadError``: catch either.
    ``path``, ``attempts`` and ``last_error`` are those of the first failed upload;
    ``worker_failures`` holds each rank's own error.
    """

    def _first_upload_error(self) -> CheckpointUploadError:
        """The lowest rank's upload error (an empty one, with no path and 0 attempts, when none)."""
        errors = (e for _, e in sorted(self.worker_failures.items()) if isinstance(e, CheckpointUploadError))
        return next(errors, CheckpointUploadError(""))

    @property
    def path(self) -> str | None:
        """Where the first failed upload was copying the checkpoint to."""
        return self._first_upload_error().path

    @property
    def attempts(self) -> int:
        """How many times the first failed upload was tried."""
        return self._first_upload_error().attempts

    @property
    def last_error(self) -> str | None:
        """The last underlying error of the first failed upload."""
        return self._first_upload_error().last_error


def run_error_type(
    error_type: type[WorkerGroupError], worker_errors: Iterable[BaseException]
) -> type[WorkerGroupError]:
    """``CheckpointUploadFailedError`` when a rank failed to upload its checkpoint (so ``except
    CheckpointUploadError`` around ``fit()`` catches it), else ``error_type`` (an ``NCCLHangError`` stays one)."""
    if error_type is WorkerGroupError and any(isinstance(e, CheckpointUploadError) for e in worker_errors):
        return CheckpointUploadFailedError
    return error_type


class PreemptionError(TrainingFailedError):
    """Nodes of the run were preempted (drained with a deadline) once more than
    ``FailureConfig.max_preemption_failures`` allows (a budget apart from ``max_failures``).

    ``preemption_info`` names the preempted nodes, their ranks and the deadline;
    ``drain_timed_out`` is True when workers were still running at the deadline (plus
    ``FailureConfig.preemption_grace_s``) and were stopped.
    """

    def __init__(self, preemption_info: PreemptionInfo, drain_timed_out: bool = False) -> None:
        self.preemption_info = preemption_info
        self.drain_timed_out = drain_timed_out
        ended = "workers still running at the deadline were stopped" if drain_timed_out else "every worker had ended"
        super().__init__(
            f"Training was interrupted by node preemption: rank(s) {preemption_info.preempted_ranks} on node(s) "
            f"{[node[:12] for node in preemption_info.preempted_node_ids]} (deadline_ms={preemption_info.deadline_ms}; "
            f"{ended}), and the preemption budget is spent. Raise FailureConfig.max_preemption_failures "
            "(-1 restarts after every preemption) to resume from the latest checkpoint on the nodes left."
        )

    def __reduce__(self):
        return (type(self), (self.preemption_info, self.drain_timed_out))


class ControllerError(TrainingFailedError):
    """The driver-side controller failed (not the user's code): storage, scheduling or Ray."""

    def __init__(self, controller_failure: BaseException) -> None:
        super().__init__(f"{type(controller_failure).__name__}: {controller_failure}")
        self.controller_failure = controller_failure

    def __reduce__(self):
        return (ControllerError, (self.controller_failure,))


class InsufficientResourcesError(ValueError):
    """The cluster can never give the run what its ScalingConfig asks for."""


class WorkerError(RuntimeError):
    """Stand-in for an exception from a worker that could not be sent back as itself."""


class PreflightError(TrainingFailedError):
    """The pre-flight check found a worker far slower than the others before training began (see
    ``trainers.health``): ``slow_ranks`` names them, ``record`` holds every worker's figures. Nothing
    was trained or lost: fix or leave out the node, then run ``fit()`` again."""

    def __init__(self, message: str, *, record: PreflightRecord, slow_ranks: tuple[int, ...]) -> None:
        super().__init__(message)
        self.record = record
        self.slow_ranks = slow_ranks

    def __reduce__(self):
        return (functools.partial(PreflightError, record=self.record, slow_ranks=self.slow_ranks), (str(self),))
