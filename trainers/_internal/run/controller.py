"""The controller: drives one run's attempts, commits its reports, applies the failure policy.

A plain object in the driver with an explicit state and a ``step()``, so tests drive it with a
scripted worker group and no Ray. It talks to the workers through ``Workers``, to storage through
``storage.RunRecord``; an ``AttemptBook`` keeps what an attempt's workers said, ``FailurePolicy``
says who pays for a failure, and ``UserCallback`` listeners are told what happened.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from storage import Checkpoint, RunRecord
from storage.health import PreflightRecord
from storage.positions import DataResume, RoundPosition
from storage.snapshot import RestartRecord
from trainers._internal.events.messages import LAUNCH, NOT_TRAINING, CheckpointsQuery, Event, FailedEvent
from trainers._internal.health.health_settings import StragglerSettings
from trainers._internal.health.memory_failure import is_out_of_memory
from trainers._internal.run.attempt_book import AttemptBook
from trainers._internal.run.failure_policy import Charge, FailurePolicy
from trainers._internal.run.health_watch import RunHealthWatch
from trainers._internal.run.listener import RunListener
from trainers._internal.run.round_commit import report_round
from trainers._internal.session.reported_checkpoints import PendingQueries
from trainers._internal.workers.preemption_watch import PreemptionNotice, deadline_passed
from trainers._internal.workers.preemption_watch import merge as merge_preemptions
from trainers.callback import TrainRunContext, UserCallback
from trainers.errors import (
    PreemptionError,
    PreflightError,
    RankFailure,
    TrainingFailedError,
    WorkerGroupError,
    run_error_type,
    worker_group_error_type,
)
from trainers.preemption import PreemptionInfo
from trainers.tuning import DRAIN_POLL_S, ENDED_DRAIN_S, VALIDATION_POLL_S

if TYPE_CHECKING:
    from trainers._internal.run.validation_runner import ValidationRunner

logger = logging.getLogger(__name__)


class Workers(Protocol):
    """What the controller needs from one attempt's workers."""

    world_size: int
    #: The first attempt's pre-flight check, once it ran (None: not run).
    preflight: PreflightRecord | None
    #: After a clean end: whether the workers were parked for the next ``fit()``, and why not.
    workers_parked: str | None

    def launch(
        self, attempt: int, checkpoint: Checkpoint | None, data_position: RoundPosition | None = None
    ) -> DataResume | None:
        """Start the workers from ``checkpoint`` and its data position; return how that resumed, or None."""

    def poll(self, timeout_s: float) -> Sequence[Event | PreemptionNotice]: ...
    def release(self, index: int, data: Any) -> None: ...
    def answer_checkpoints(self, rank: int, query_id: int, answer: Any) -> None: ...
    def where(self, rank: int) -> tuple[str, str]: ...
    def probe(self, ranks: list[int]) -> tuple[list[FailedEvent], dict[int, str]]: ...
    def finish(self) -> None: ...

    def stop(self, failed: dict[int, str]) -> RestartRecord:
        """The attempt failed (``failed``: world rank -> failure kind) and the next one follows: stop
        training, keep the workers that can serve the next attempt, and say which were kept."""

    def shutdown(self) -> None:
        """Stop every worker (the run ends, or restarts every worker)."""

    def resize_to(self) -> int | None:
        """The larger size an elastic run restarts at now that more workers fit, else None."""

    def lost_a_node(self, node_ids: list[str]) -> bool:
        """Whether one of these nodes left the cluster (not only a worker process dying)."""


#: Failure kinds that are a process or node going away: the likely root cause of other ranks'
#: errors, so they are listed first.
DEATHS = ("died", "preempted", "unreachable")


class State(enum.Enum):
    LAUNCHING = "launching"
    RUNNING = "running"
    RESTARTING = "restarting"
    FINISHED = "finished"
    FAILED = "failed"


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
    """The run as listeners see it, and how the controller paces itself."""

    #: What ``UserCallback`` hooks receive (with the attempt of the moment); the default names no run.
    run_context: TrainRunContext = TrainRunContext("", "", 0, None, None, None)
    #: "nccl", "gloo" or None: a hang in an NCCL run is raised as NCCLHangError.
    collective_backend: str | None = None
    poll_timeout_s: float = 1.0
    #: Seconds a failed attempt waits for a round that ranks still training may yet complete.
    drain_timeout_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    #: UNIX time in seconds (preemption deadlines are wall-clock times).
    wall_clock: Callable[[], float] = time.time
    #: When a rank is named a straggler (``FLOWTRAIN_STRAGGLER_*``, read by the trainer), for the
    #: run's health watch when the listeners bring none.
    stragglers: StragglerSettings = StragglerSettings()
    #: GPUs each worker holds, for the goodput account's GPU-hours (as ``stragglers``).
    gpus_per_worker: float = 0.0


@dataclasses.dataclass(frozen=True)
class PreemptionUnderWay:
    """A preemption of this attempt's nodes, and when (UNIX seconds) it was first noticed."""

    info: PreemptionInfo
    noticed_at: float


#: ``Controller._restarting_after``'s word for a restart that no failure caused: an elastic run grows.
RESIZE = "resize"


class Controller:
    """Runs attempts until the training function returns on every worker or the budget is spent.
    Every feature that watches the run is one of its ``listeners``, the run's health among them
    (``RunHealthWatch``, attached from ``settings`` when the listeners bring none)."""

    def __init__(
        self,
        workers: Workers,
        *,
        storage: RunRecord,
        policy: FailurePolicy,
        listeners: Sequence[UserCallback] = (),
        validations: ValidationRunner | None = None,
        settings: ControllerSettings = ControllerSettings(),
    ) -> None:
        self.workers = workers
        self.storage = storage
        self.policy = policy
        #: Told of everything that happens, one after another in this order.
        self.listeners = list(listeners)
        if not any(isinstance(listener, RunHealthWatch) for listener in self.listeners):
            self.listeners.insert(0, RunHealthWatch(settings.stragglers, settings.gpus_per_worker))
        self.validations = validations
        self.settings = settings
        self.state = State.LAUNCHING
        self.attempt = 0
        self.return_value: Any = None
        self.error: TrainingFailedError | None = None
        self.book = AttemptBook(settings.clock)
        #: ``get_all_reported_checkpoints()`` calls waiting for rounds or validations.
        self._queries = PendingQueries()
        self._preemption: PreemptionUnderWay | None = None
        #: What the restart under way follows: the failures (root cause first), or ``RESIZE``.
        self._restarting_after: list[RankFailure] | str = []
        #: What the ranks that did not fail were doing when the others failed (hang diagnosis).
        self._activity: dict[int, str] = {}

    @property
    def run_context(self) -> TrainRunContext:
        """The run as listeners see it now."""
        return dataclasses.replace(self.settings.run_context, attempt=self.attempt)

    def tell(self, hook: str, *args: Any) -> None:
        """Call the ``UserCallback`` hook ``hook`` of every listener, in order, with the run's context."""
        context = self.run_context
        for listener in self.listeners:
            getattr(listener, hook)(context, *args)

    def _notify(self, hook: str, *args: Any) -> None:
        """Call the ``RunListener`` hook ``hook`` of every listener that is one, in order."""
        for listener in self.listeners:
            if isinstance(listener, RunListener):
                getattr(listener, hook)(self, *args)

    # -- the state machine ----------------------------------------------------------------------

    def step(self) -> State:
        """Do one unit of work and return the new state."""
        if self.state is State.LAUNCHING:
            self._launch()
        elif self.state is State.RUNNING:
            timeout, report_timeout_s = self.settings.poll_timeout_s, self.policy.config.report_timeout_s
            timeout = timeout if report_timeout_s is None else min(timeout, report_timeout_s / 4)
            if self.validations is not None and self.validations.busy:
                timeout = min(timeout, VALIDATION_POLL_S)  # notice a validation's end soon
            self._handle(self.workers.poll(timeout))
            self._check_preemption_or_resize()
        elif self.state is State.RESTARTING:
            self._restart()
        return self.state

    def run(self) -> Any:
        """Step until done; return rank 0's return value or raise ``WorkerGroupError``/``PreemptionError``."""
        self._notify("run_started")
        try:
            while self.state not in (State.FINISHED, State.FAILED):
                self.step()
        finally:
            self._notify("training_ended")
            self.workers.shutdown()
            self._notify("run_ended")
        if self.error is not None:
            raise self.error
        return self.return_value

    def _launch(self) -> None:
        self.attempt = self.storage.start_attempt()
        self.book.reset()
        self._activity = {}
        self._preemption = None
        self._queries.clear()
        try:
            resumed = self.workers.launch(
                self.attempt, self.storage.latest_checkpoint, self.storage.latest_data_position
            )
        except (ValueError, TypeError, PreflightError):
            raise  # a configuration mistake, or a node the pre-flight check found wanting: restarting cannot help
        except Exception as error:  # noqa: BLE001 - any other start failure is an attempt's failure, which the policy may retry
            self.book.failed[LAUNCH] = FailedEvent(LAUNCH, error, traceback.format_exc(), kind="failed to start")
            self._fail()
            return
        if resumed is not None:
            self.storage.record_data_resume(resumed)
        self._notify("attempt_launched")
        self.state = State.RUNNING

    def _handle(self, events: Sequence[Event | PreemptionNotice]) -> None:
        book = self.book
        arrived_at = self.settings.clock()  # when these reports reached the driver
        for event in events:
            if isinstance(event, CheckpointsQuery):
                self._queries.add(event)
            elif isinstance(event, PreemptionNotice):
                known = self._preemption
                info = merge_preemptions(known.info if known else None, event.info)
                self._preemption = PreemptionUnderWay(info, known.noticed_at if known else self.settings.wall_clock())
                # The surviving ranks may commit their reports (a just-in-time checkpoint) without these.
                if relaxed := self.policy.relaxed_ranks(info):
                    book.relaxed = relaxed
            else:
                book.add(event)
        self._commit_complete_rounds(arrived_at)
        self._validate_and_answer()
        if not book.failed:  # else the attempt ends; its workers are about to be stopped
            while (sync := book.pop_complete_sync(self.workers.world_size)) is not None:
                self.workers.release(*sync)  # a barrier every rank reached lets them all go
        book.failed |= {event.world_rank: event for event in book.returned_during_a_barrier()}
        if (timeout_s := self.policy.config.report_timeout_s) is not None and not book.failed:
            book.failed |= {event.world_rank: event for event in book.laggards(self.workers.world_size, timeout_s)}
        if book.failed:
            self._notify("attempt_failing")  # from here on the attempt only ends
            self._drain_rounds_the_failed_ranks_finished(arrived_at)
            alive = [r for r in range(self.workers.world_size) if r not in book.failed or book.failed[r].kind == "hung"]
            dead, self._activity = self.workers.probe(alive) if alive else ([], {})
            book.failed |= {event.world_rank: event for event in dead}
            self._fail()
        elif len(book.finished) == self.workers.world_size:
            self._finish()

    def _commit_complete_rounds(self, arrived_at: float) -> None:
        """Commit every round all ranks reported (their reports reached the driver at ``arrived_at``)."""
        size = self.workers.world_size
        while (complete := self.book.pop_complete_round(size)) is not None:
            index, round_ = complete
            if not any(e.staged for e in round_.values()) and any(e.validation for e in round_.values()):
                self._refuse_validation_without_checkpoint(index, round_)
                return
            checkpoint = self.storage.record_report(
                report_round(round_, index=index, attempt=self.attempt, world_size=size)
            )
            self.tell(
                "after_report", [round_[rank].metrics if rank in round_ else {} for rank in range(size)], checkpoint
            )
            self._notify("round_committed", index, round_, checkpoint, arrived_at)

    def _refuse_validation_without_checkpoint(self, index: int, round_: dict[int, Any]) -> None:
        """A round asked for a validation and no rank passed a checkpoint. Ray Train raises in
        ``report()``; a rank alone cannot tell (one rank's checkpoint is enough), so the ranks that
        asked fail now, and nothing reported later is committed."""
        asked = sorted(rank for rank, event in round_.items() if event.validation)
        for rank in asked:
            error = ValueError(
                f"Validation requires a checkpoint to be provided. Report {index} of attempt {self.attempt} asked "
                f"for a validation (on rank(s) {asked}) but no rank passed a checkpoint, so there is nothing to "
                "validate. Pass checkpoint= on at least one rank of that report (e.g. rank 0), or drop validation=."
            )
            self.book.failed.setdefault(rank, FailedEvent(rank, error, ""))
        self.book.pending.clear()  # the attempt ends at this round
        self.book.first_seen.clear()

    def _validate_and_answer(self) -> None:
        """Start and collect validations, then answer the checkpoint queries whose wait is over."""
        if self.validations is not None:
            self.validations.poll()
        if self._queries:
            self._queries.answer(
                committed_rounds=self.book.committed_rounds,
                validating=lambda: self.validations is not None and self.validations.busy,
                storage=self.storage,
                send=self.workers.answer_checkpoints,
            )

    def _drain_rounds_the_failed_ranks_finished(self, arrived_at: float) -> None:
        """Commit every round the failed ranks completed whose other reports are on their way.

        A rank whose function ended has every event it will send already queued: those are waited
        for (up to ``ENDED_DRAIN_S``), so a round whose ``report()`` returned on every rank is never
        lost. A rank still running (maybe uploading) gets ``ControllerSettings.drain_timeout_s``.
        """
        start = time.monotonic()
        while missing := self.book.awaited_by_rounds_the_failed_ranks_finished(self.workers.world_size):
            dead, activity = self.workers.probe(sorted(missing))
            for event in dead:
                self.book.failed.setdefault(event.world_rank, event)
            ended = all(activity.get(rank) == NOT_TRAINING for rank in missing)
            limit = start + (ENDED_DRAIN_S if ended else self.settings.drain_timeout_s)
            if dead:
                continue  # a dead rank never reports: the rounds it missed are no longer awaited
            if time.monotonic() >= limit:
                return
            for arrived in self.workers.poll(min(DRAIN_POLL_S, max(0.0, limit - time.monotonic()))):
                self.book.add(arrived)  # barriers and questions no longer matter: the attempt ends
            self._commit_complete_rounds(arrived_at)

    def _finish(self) -> None:
        self._notify("training_ended")
        if self.book.pending:
            error = RuntimeError(
                "every worker must call report() the same number of times; the training function "
                f"returned with reports missing from some ranks ({self.book.uneven_reports()})."
            )
            self.book.failed[0] = FailedEvent(0, error, "")
            self._fail()
            return
        self.return_value = self.book.finished.get(0)
        self.workers.finish()
        self.state = State.FINISHED

    def _fail(self) -> None:
        # A dead process is the likely root cause of the others' errors: listeners see it first too.
        failures = sorted(
            (self._describe(e) for e in self.book.failed.values()), key=lambda f: (f.kind not in DEATHS, f.world_rank)
        )
        errors = {rank: event.error for rank, event in self.book.failed.items()}
        self._notify("attempt_failed", failures)
        charge = self.policy.charge(
            failures,
            list(errors.values()),
            preemption=self._preemption.info if self._preemption else None,
            node_left=self.workers.lost_a_node,
        )
        if charge is Charge.PREEMPTION:
            self.workers.shutdown()  # a preempted node's ranks restart with the rest
            self.tell("after_exception", errors)
            self._preempted(drain_timed_out=False, failures=failures)
        elif charge is Charge.FAILURE and not self.policy.may_restart(charge, self.storage.num_failures):
            self.workers.shutdown()  # the run ends
            self.tell("after_exception", errors)
            self._end(self._error(failures, budget_exhausted=self.policy.config.max_failures != 0))
        else:
            restart = self.workers.stop({rank: event.kind for rank, event in self.book.failed.items()})
            if restart.full_restart is not None and (start := self.book.failed.get(LAUNCH)) is not None:
                why = f"{restart.full_restart}: {type(start.error).__name__}: {start.error}"  # the start's own error
                restart = dataclasses.replace(restart, full_restart=why)
            self.tell("after_exception", errors)
            if charge is Charge.FAILURE:
                self.storage.record_failure()
            self.storage.append("restarts", restart)
            self._restart_after(failures)

    def _restart(self) -> None:
        checkpoint = self.storage.rewind_to_latest_checkpoint()
        if self._restarting_after != RESIZE:  # a resize told the listeners already; nothing failed
            self.tell("on_restart", self._restarting_after, checkpoint)
        self.state = State.LAUNCHING

    # -- preemption and elastic resizing ----------------------------------------------------------

    def _check_preemption_or_resize(self) -> None:
        """End the attempt at a preemption's deadline (plus the grace), else let an elastic run grow."""
        if self.state is not State.RUNNING:
            return
        preemption = self._preemption
        if preemption is not None:
            grace_s = self.policy.config.preemption_grace_s
            if deadline_passed(preemption.info, preemption.noticed_at, grace_s, self.settings.wall_clock()):
                self._preempted(drain_timed_out=True)
            return
        if (size := self.workers.resize_to()) is not None:
            old = self.workers.world_size
            self._notify("attempt_failing")  # it restarts from the latest checkpoint
            self.workers.shutdown()
            self.tell("on_resize", old, size)
            self._restart_after(RESIZE)

    def _preempted(self, *, drain_timed_out: bool, failures: list[RankFailure] | None = None) -> None:
        """A preemption ended this attempt: restart on the nodes left from the latest checkpoint
        while ``FailureConfig.max_preemption_failures`` allows, else fail with ``PreemptionError``."""
        self._notify("attempt_failing")
        self.workers.shutdown()
        info = self._preemption.info if self._preemption else None
        if info is None:  # the node went before its drain was noticed
            nodes: dict[str, list[int]] = {}
            for failure in failures or []:
                if failure.kind == "preempted":
                    nodes.setdefault(failure.node_id, []).append(failure.world_rank)
            info = PreemptionInfo(deadline_ms=None, preempted_node_to_ranks=nodes)
        if self.policy.may_restart(Charge.PREEMPTION, self.storage.num_preemptions):
            self.storage.record_preemption()
            preempted = ", ".join(sorted(info.preempted_node_to_ranks)) or "?"
            self.storage.append("restarts", RestartRecord(self.attempt, full_restart=f"node(s) {preempted} preempted"))
            self._restart_after(failures or [])
        else:
            self._end(PreemptionError(info, drain_timed_out))

    def _restart_after(self, cause: list[RankFailure] | str) -> None:
        self._restarting_after = cause
        self.state = State.RESTARTING

    def _end(self, error: TrainingFailedError) -> None:
        """The run fails for good with ``error``."""
        self.error = error
        self._notify("training_ended")
        self.state = State.FAILED

    # -- errors ----------------------------------------------------------------------------------

    def _describe(self, event: FailedEvent) -> RankFailure:
        rank = event.world_rank
        node_id, node_ip = self.workers.where(rank) if rank >= 0 else ("", "")
        memory = event.memory or self.book.memory.get(rank)
        return RankFailure(
            world_rank=rank,
            node_id=node_id,
            node_ip=node_ip,
            kind=event.kind,
            error_type=type(event.error).__name__,
            message=str(event.error),
            traceback=event.traceback,
            reports=self.book.reports_made.get(rank, 0) if rank >= 0 else None,
            memory=memory,
            out_of_memory=is_out_of_memory(event.error)
            or (event.kind == "died" and memory is not None and memory.near_limit),
            memory_summary=event.memory_summary,
        )

    def _error(self, failures: list[RankFailure], *, budget_exhausted: bool) -> WorkerGroupError:
        """The error that ends the run; ``failures`` come root cause first, as ``_fail`` sorts them."""
        if budget_exhausted:
            budget = f"the failure budget is spent (FailureConfig.max_failures={self.policy.config.max_failures}, {self.storage.num_failures} restart(s) used)"
        else:
            budget = "FailureConfig.max_failures=0, so the run does not restart"
        lines = [f"Training failed in attempt {self.attempt}: {budget}."]
        for failure in failures:
            doing = self._activity.get(failure.world_rank)
            lines.append(f"  - {failure.describe()}" + (f"; it is {doing}" if doing else ""))
        for rank, doing in sorted(self._activity.items()):
            if rank not in self.book.failed:
                node_ip = self.workers.where(rank)[1]
                lines.append(f"  - rank {rank} on node {node_ip or '?'} had not failed; it was {doing}")
        first = failures[0]
        if first.traceback:
            lines.append(f"Traceback of rank {first.world_rank}:\n{first.traceback.rstrip()}")
        error_type = run_error_type(
            worker_group_error_type(failures, self.settings.collective_backend),
            [e.error for e in self.book.failed.values()],
        )
        return error_type(
            "\n".join(lines),
            {event.world_rank: event.error for event in self.book.failed.values()},
            {f.world_rank: f for f in failures},
            attempt=self.attempt,
            budget_exhausted=budget_exhausted,
        )
