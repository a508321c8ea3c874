"""A run's health, attached to its controller as a listener: its goodput account, timeline,
stragglers (also told to every listener and the log) and pre-flight check (``health/``), each kept
in the run's record as it happens."""

from __future__ import annotations

import logging
from typing import Any

from storage import Checkpoint
from storage.health import GoodputAccount, StragglerRecord, Timeline
from trainers._internal.events.messages import ReportEvent
from trainers._internal.health.goodput import GoodputClock, Phase, blocked_on_upload_s, waited_for_data_s
from trainers._internal.health.health_settings import StragglerSettings
from trainers._internal.health.stragglers import StragglerWatch, Straggling
from trainers._internal.health.timeline import TimelineBook
from trainers._internal.run.listener import RunListener
from trainers._internal.run.round_commit import round_steps
from trainers.errors import RankFailure

logger = logging.getLogger(__name__)


class RunHealthWatch(RunListener):
    """The run's health as the controller tells it; ``gpus_per_worker``: for the account's GPU-hours."""

    def __init__(self, stragglers: StragglerSettings, gpus_per_worker: float = 0.0) -> None:
        self.straggler_settings = stragglers
        self.gpus_per_worker = gpus_per_worker
        self.goodput: GoodputClock | None = None
        self.book = TimelineBook()
        #: This fit() call's goodput account and timeline, once the run ended.
        self.account: GoodputAccount | None = None
        self.timeline: Timeline | None = None
        self._stragglers = StragglerWatch(stragglers)
        self._preflight_kept = False

    def _clock(self, run: Any) -> GoodputClock:
        if self.goodput is None:
            self.goodput = GoodputClock(run.settings.clock, self.gpus_per_worker)
        return self.goodput

    def run_started(self, run: Any) -> None:
        self._clock(run).start(run.workers.world_size)

    def attempt_launched(self, run: Any) -> None:
        self._stragglers = StragglerWatch(self.straggler_settings)
        preflight = run.workers.preflight
        if preflight is not None and not self._preflight_kept:
            self._preflight_kept = True
            logger.info("%s: %s", run.settings.run_context.name or "run", preflight.describe())
            run.storage.append("preflight", preflight)
        self._clock(run).switch(Phase.TRAINING, run.workers.world_size)

    def round_committed(
        self, run: Any, index: int, round_: dict[int, ReportEvent], checkpoint: Checkpoint | None, arrived_at: float
    ) -> None:
        clock = self._clock(run)
        clock.waited_for_data(waited_for_data_s(round_.values()))
        if checkpoint is not None:
            clock.committed(blocked_on_upload_s(round_.values()), reported_at=arrived_at)
        steps = round_steps(round_, run.workers.world_size)
        self.book.round(clock.elapsed(), run.attempt, index, checkpoint is not None, steps)
        for straggling in self._stragglers.observe(steps):
            self._name_straggler(run, index, straggling)

    def _name_straggler(self, run: Any, index: int, straggling: Straggling) -> None:
        """Say once, everywhere a user looks, that a rank trains persistently slower than the others."""
        node_id, node_ip = run.workers.where(straggling.rank)
        node = f"{node_ip} ({node_id[:12]})" if node_ip and node_id else (node_ip or node_id or "?")
        record = StragglerRecord(
            run.attempt,
            straggling.rank,
            node,
            index,
            straggling.steps,
            straggling.ratio,
            straggling.step_s,
            straggling.median_step_s,
        )
        logger.warning("%s: straggler: %s", run.settings.run_context.name or "run", record.describe())
        self.book.mark(self._clock(run).elapsed(), run.attempt, straggling.rank, "straggler")
        run.storage.append("stragglers", record)
        run.tell("on_straggler", record)

    def attempt_failing(self, run: Any) -> None:
        self._clock(run).thrown_away(Phase.RESTARTING)

    def attempt_failed(self, run: Any, failures: list[RankFailure]) -> None:
        clock = self._clock(run)
        clock.thrown_away(Phase.RESTARTING)
        for failure in failures:
            self.book.mark(clock.elapsed(), run.attempt, failure.world_rank, failure.kind)

    def training_ended(self, run: Any) -> None:
        self._clock(run).switch(Phase.WAITING)

    def run_ended(self, run: Any) -> None:
        """Keep this fit() call's goodput account and timeline in the run's record, and say the account in one line."""
        clock = self._clock(run)
        clock.switch(Phase.WAITING)
        name = run.settings.run_context.name or "run"
        self.account = clock.account()
        self.timeline = self.book.close(name, run.workers.world_size, clock)
        logger.info("%s: %s", name, self.account.describe())
        try:
            run.storage.record_goodput(self.account, run.workers.workers_parked)
            run.storage.record_timeline(self.timeline)
        except Exception as error:  # noqa: BLE001 - the run's own outcome (or error) must come out, not this
            logger.warning("the goodput account and timeline were not written to the run's folder: %s", error)
