"""Which budget pays for an attempt that failed, and whether the run goes on: the worker-level rows
of the failure budget table in docs/design.md, one ``Charge`` each (the driver-level rows are
``tasks/retries.py``'s). The run's record keeps the counts, the policy this fit()'s free restarts.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from trainers.config import FailureConfig
from trainers.errors import RankFailure
from trainers.preemption import PreemptionInfo
from trainers.tuning import SETUP_CLASH_RESTARTS


def may_restart(limit: int, used: int) -> bool:
    """Whether a budget of ``limit`` restarts (-1: unlimited) allows one more after ``used``."""
    return limit == -1 or used < limit


class Charge(enum.Enum):
    """Who pays for a failed attempt, one row of the table each; the value names the budget."""

    #: The loop raised, a worker died, a node was lost (fixed-size run), a rank hung, or the group
    #: did not start.
    FAILURE = "FailureConfig.max_failures"
    #: A node being preempted (drained with a deadline) took workers with it.
    PREEMPTION = "FailureConfig.max_preemption_failures"
    #: An elastic run lost a node; the next attempt takes the workers that fit then.
    NODE_LOST = "free"
    #: Every error is the backend's setup clash (a reserved port taken before use).
    SETUP_CLASH = "free SETUP_CLASH_RESTARTS times a run, then FAILURE"


class FailurePolicy:
    """A run's failure budgets, from its ``FailureConfig``. ``elastic`` runs lose nodes for free;
    ``is_setup_clash`` is the backend's test for an error a restart cures."""

    def __init__(
        self,
        config: FailureConfig,
        *,
        elastic: bool = False,
        is_setup_clash: Callable[[BaseException], bool] = lambda error: False,
    ) -> None:
        self.config = config
        self.elastic = elastic
        self.is_setup_clash = is_setup_clash
        #: Free restarts after a backend's set-up clash, counted per fit() call and not in run.json:
        #: a clash is a race for a port, not a fault of the run, and a rerun starts a new race.
        self.setup_clashes = 0

    def charge(
        self,
        failures: list[RankFailure],
        errors: list[BaseException],
        *,
        preemption: PreemptionInfo | None,
        node_left: Callable[[list[str]], bool],
    ) -> Charge:
        """Which budget pays for ``failures`` (and their ``errors``), given the preemption under
        way and the workers' answer to "did one of these nodes leave?"; a free setup-clash restart
        is counted here."""
        # As in Ray Train, a preempted node's death makes the others' errors its echo (broken
        # collectives); a call in flight may fail before Ray knows why: a death on a draining node counts.
        draining = set(preemption.preempted_ranks) if preemption is not None else set()
        if any(f.kind == "preempted" or (f.kind == "died" and f.world_rank in draining) for f in failures):
            return Charge.PREEMPTION
        deaths = [f.node_id for f in failures if f.kind == "died"]
        if self.elastic and deaths and node_left(deaths):  # asked only here: the answer waits for Ray
            return Charge.NODE_LOST
        if self.setup_clashes < SETUP_CLASH_RESTARTS and errors and all(map(self.is_setup_clash, errors)):
            self.setup_clashes += 1
            return Charge.SETUP_CLASH
        return Charge.FAILURE

    def may_restart(self, charge: Charge, used: int) -> bool:
        """Whether the budget ``charge`` draws on allows one more restart after ``used``."""
        limits = {Charge.FAILURE: self.config.max_failures, Charge.PREEMPTION: self.config.max_preemption_failures}
        return may_restart(limits.get(charge, -1), used)

    def relaxed_ranks(self, preemption: PreemptionInfo) -> set[int]:
        """The preempted ranks a round commits without (``relax_collectives_on_preemption``, as in
        Ray Train); none when rank 0 is among them, since its metrics are the run's."""
        preempted = set(preemption.preempted_ranks)
        return preempted if self.config.relax_collectives_on_preemption and 0 not in preempted else set()
