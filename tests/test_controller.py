"""The controller, stepped by hand with scripted workers and an in-memory store: no Ray."""

from __future__ import annotations

import pytest

from storage.positions import RankPosition, RoundPosition, ShardRecord
from trainers import FailureConfig, UserCallback
from trainers._internal.events.messages import FailedEvent, FinishedEvent, ReportEvent, SyncEvent
from trainers._internal.run.controller import LAUNCH, Controller, ControllerSettings, State
from trainers._internal.run.failure_policy import FailurePolicy, may_restart
from trainers.errors import WorkerGroupError
from trainers.tuning import SETUP_CLASH_RESTARTS


class MemoryStore:
    """Records what the controller commits; same calls as storage.RunStorage."""

    def __init__(self):
        self.attempts = 0
        self.reports = []  # (attempt, index, metrics, staged)
        self.num_failures = 0
        self.num_preemptions = 0
        self.latest_checkpoint = None
        self.latest_data_position = None
        self.data_resumes = []
        self.restarts = []
        self.rewinds = 0
        self.stragglers = []
        self.accounts = []

    def start_attempt(self):
        self.attempts += 1
        return self.attempts

    def record_report(self, round_):
        self.reports.append((round_.attempt, round_.report_index, round_.metrics, round_.staged))
        if round_.staged:
            self.latest_checkpoint = f"checkpoint@{round_.attempt}/{round_.report_index}"
            self.latest_data_position = round_.data_position
            return self.latest_checkpoint
        return None

    def record_data_resume(self, note):
        self.data_resumes.append(note)

    def append(self, name, record):
        getattr(self, name).append(record)

    def record_failure(self):
        self.num_failures += 1
        return self.num_failures

    def record_preemption(self):
        self.num_preemptions += 1
        return self.num_preemptions

    def record_goodput(self, account, workers_parked=None):
        self.accounts.append(account)

    def rewind_to_latest_checkpoint(self):
        self.rewinds += 1
        return self.latest_checkpoint


class ScriptedWorkers:
    """Hands out one scripted batch of events per poll, per attempt."""

    preflight = workers_parked = None  # no pre-flight check, no worker process to park in scripted runs

    def __init__(self, world_size, attempts, fail_launch=()):
        self.world_size = world_size
        self.attempts = attempts  # list (per attempt) of lists (per poll) of events
        self.fail_launch = set(fail_launch)
        self.launched = []
        self.dead = set()
        self.shutdowns = 0
        self.stops = []  # what stop() was told failed, per failed attempt that restarts
        self.finished = 0
        self.released = []
        self.sizes = []  # what resize_to() answers, one per running step (then None)
        self.lost_nodes = set()  # the nodes lost_a_node() finds gone
        self.data_positions = []  # the data position each launch was given
        self._script = []

    def launch(self, attempt, checkpoint, data_position=None):
        self.launched.append((attempt, checkpoint))
        self.data_positions.append(data_position)
        if attempt in self.fail_launch:
            raise RuntimeError("placement group timed out")
        self._script = list(self.attempts[len(self.launched) - 1])
        return {"resumed": data_position} if data_position is not None else None

    def poll(self, timeout_s):
        return self._script.pop(0) if self._script else []

    def release(self, index, data):
        self.released.append((index, data))

    def where(self, rank):
        return (f"node-{rank}", f"10.0.0.{rank}")

    def probe(self, ranks):
        dead = [FailedEvent(rank, RuntimeError("process gone"), "", kind="died") for rank in ranks if rank in self.dead]
        return dead, {rank: "running train.py:7 in loop: time.sleep(60)" for rank in ranks if rank not in self.dead}

    def finish(self):
        self.finished += 1

    def stop(self, failed):
        from storage.snapshot import RestartRecord

        self.stops.append(dict(failed))
        replaced = {rank: kind for rank, kind in failed.items() if rank >= 0}
        kept = tuple(rank for rank in range(self.world_size) if rank not in replaced)
        return RestartRecord(len(self.launched), kept=kept, replaced=replaced)

    def shutdown(self):
        self.shutdowns += 1

    def resize_to(self):
        return self.sizes.pop(0) if self.sizes else None

    def lost_a_node(self, node_ids):
        return bool(self.lost_nodes & set(node_ids))


def policy(is_setup_clash=lambda error: False, elastic=False, **failure_config):
    """The failure policy of ``FailureConfig(**failure_config)``."""
    return FailurePolicy(FailureConfig(**failure_config), elastic=elastic, is_setup_clash=is_setup_clash)


class Listener(UserCallback):
    """Hands what the controller tells its listeners, with the attempt number, to plain functions."""

    def __init__(self, on_report=None, on_restart=None, on_resize=None):
        def nothing(*args):
            return None

        self.report, self.restart, self.resize = on_report or nothing, on_restart or nothing, on_resize or nothing

    def after_report(self, run_context, metrics, checkpoint):
        self.report(run_context.attempt, metrics, checkpoint)

    def on_restart(self, run_context, failures, resume_from):
        self.restart(run_context.attempt, failures, resume_from)

    def on_resize(self, run_context, old_size, new_size):
        self.resize(run_context.attempt, old_size, new_size)


def report(rank, index, staged=False, **metrics):
    return ReportEvent(rank, index, {"i": index, **metrics}, staged)


def test_commits_a_round_only_when_every_rank_reported():
    workers = ScriptedWorkers(
        2,
        [
            [
                [report(0, 0, True)],
                [report(1, 0), report(0, 1)],
                [report(1, 1)],
                [FinishedEvent(0, 7), FinishedEvent(1, None)],
            ]
        ],
    )
    store = MemoryStore()
    seen = []
    controller = Controller(
        workers=workers,
        storage=store,
        policy=policy(max_failures=0),
        listeners=[Listener(on_report=lambda a, m, c: seen.append((m, c)))],
    )
    assert controller.step() is State.RUNNING
    assert controller.step() is State.RUNNING and store.reports == []
    controller.step()
    assert store.reports == [(1, 0, {"i": 0}, True)]
    assert seen == [([{"i": 0}, {"i": 0}], "checkpoint@1/0")]
    controller.step()
    assert [r[1] for r in store.reports] == [0, 1]
    assert controller.step() is State.FINISHED
    assert controller.return_value == 7 and workers.finished == 1


def test_a_barrier_releases_every_rank_with_rank_0s_data_only_once_all_arrived_and_in_order():
    workers = ScriptedWorkers(
        2,
        [
            [
                [SyncEvent(1, 0)],
                [SyncEvent(0, 0, "run-7")],
                [SyncEvent(0, 1), SyncEvent(1, 1)],
                [FinishedEvent(0, None), FinishedEvent(1, None)],
            ]
        ],
    )
    controller = Controller(workers=workers, storage=MemoryStore(), policy=policy(max_failures=0))
    controller.step()  # launch
    controller.step()
    assert workers.released == []  # rank 0 has not arrived
    controller.step()
    assert workers.released == [(0, "run-7")]
    controller.step()
    assert workers.released == [(0, "run-7"), (1, None)]
    assert controller.step() is State.FINISHED


def test_a_barrier_half_reached_when_an_attempt_failed_does_not_count_in_the_next_attempt():
    attempt1 = [[SyncEvent(1, 0)], [FailedEvent(0, RuntimeError("boom"), "")]]
    attempt2 = [[SyncEvent(0, 0, "b")], [SyncEvent(1, 0)], [FinishedEvent(0, None), FinishedEvent(1, None)]]
    workers = ScriptedWorkers(2, [attempt1, attempt2])
    controller = Controller(workers=workers, storage=MemoryStore(), policy=policy(max_failures=1))
    while len(workers.launched) < 2 or controller.state is not State.RUNNING:
        controller.step()
    controller.step()
    assert workers.released == []  # attempt 1's rank 1 is gone: attempt 2's rank 1 has not arrived
    controller.step()
    assert workers.released == [(0, "b")]
    assert controller.step() is State.FINISHED


def test_failure_restarts_from_latest_checkpoint_within_budget():
    attempt1 = [[report(0, 0, True), report(1, 0)], [FailedEvent(1, ValueError("boom"), "Traceback ...boom")]]
    attempt2 = [[FinishedEvent(0, "done"), FinishedEvent(1, None)]]
    workers = ScriptedWorkers(2, [attempt1, attempt2])
    store = MemoryStore()
    restarts = []
    controller = Controller(
        workers=workers,
        storage=store,
        policy=policy(max_failures=1),
        listeners=[Listener(on_restart=lambda a, f, c: restarts.append((a, f, c)))],
    )
    assert controller.run() == "done"
    assert workers.launched == [(1, None), (2, "checkpoint@1/0")]
    assert store.num_failures == 1 and store.rewinds == 1
    ((attempt, failures, checkpoint),) = restarts
    assert attempt == 1 and checkpoint == "checkpoint@1/0"
    assert failures[0].world_rank == 1 and failures[0].node_ip == "10.0.0.1" and failures[0].error_type == "ValueError"


def test_every_ranks_data_position_is_committed_with_the_checkpoint_and_given_to_the_next_attempt():
    def at(rank, index, rows, staged=False):
        position = RankPosition({"train": ShardRecord(0, rows)})
        return ReportEvent(rank, index, {"i": index}, staged, data_position=position)

    attempt1 = [
        # Only rank 0 passes the checkpoint; rank 1's position goes with it all the same.
        [at(0, 0, 8, staged=True), at(1, 0, 8)],
        [at(0, 1, 16), at(1, 1, 16)],  # no checkpoint: its positions are not kept
        [FailedEvent(1, ValueError("boom"), "")],
    ]
    workers = ScriptedWorkers(2, [attempt1, [[FinishedEvent(0, None), FinishedEvent(1, None)]]])
    store = MemoryStore()
    Controller(workers=workers, storage=store, policy=policy(max_failures=1)).run()
    saved = RoundPosition(2, (RankPosition({"train": ShardRecord(0, 8)}),) * 2)
    assert workers.data_positions == [None, saved]
    assert store.data_resumes == [{"resumed": saved}]


def test_budget_exhausted_raises_with_rank_node_traceback_attempt():
    failing = [
        [
            FailedEvent(
                0, RuntimeError("oom"), "Traceback (most recent call last):\n  line 1\nRuntimeError: oom", kind="died"
            )
        ]
    ]
    workers = ScriptedWorkers(2, [failing, failing, failing])
    store = MemoryStore()
    controller = Controller(workers=workers, storage=store, policy=policy(max_failures=2))
    with pytest.raises(WorkerGroupError) as info:
        controller.run()
    error = info.value
    assert len(workers.launched) == 3 and store.num_failures == 2
    assert error.attempt == 3 and error.budget_exhausted
    text = str(error)
    assert "attempt 3" in text and "max_failures=2" in text and "2 restart(s) used" in text
    assert "rank 0 on node 10.0.0.0" in text and "died" in text and "RuntimeError: oom" in text
    assert "Traceback of rank 0" in text
    # Each restart stopped the attempt, naming the failed rank, and was recorded; the last ended the run.
    assert workers.stops == [{0: "died"}, {0: "died"}] and workers.shutdowns >= 1
    assert [(r.attempt, r.kept, r.replaced) for r in store.restarts] == [(1, (1,), {0: "died"}), (2, (1,), {0: "died"})]


def test_a_dead_rank_is_named_first_when_others_fail_in_the_collective():
    collective_error = [[FailedEvent(1, RuntimeError("gloo: connection closed by peer"), "tb1")]]
    workers = ScriptedWorkers(2, [collective_error])
    workers.dead = {0}
    with pytest.raises(WorkerGroupError) as info:
        Controller(workers=workers, storage=MemoryStore(), policy=policy(max_failures=0)).run()
    lines = str(info.value).splitlines()
    assert "rank 0 on node 10.0.0.0 (node-0) died: RuntimeError: process gone" in lines[1]
    assert "rank 1" in lines[2] and "connection closed" in lines[2]
    assert set(info.value.worker_failures) == {0, 1}


def test_ranks_that_did_not_fail_say_what_they_were_doing():
    timeout = [[FailedEvent(0, RuntimeError("gloo: Timed out waiting 3000ms for recv"), "tb0")]]
    with pytest.raises(WorkerGroupError) as info:
        Controller(workers=ScriptedWorkers(2, [timeout]), storage=MemoryStore(), policy=policy(max_failures=0)).run()
    assert "rank 1 on node 10.0.0.1 had not failed; it was running train.py:7 in loop: time.sleep(60)" in str(
        info.value
    )


def test_a_rank_that_stops_reporting_is_hung_after_the_report_timeout():
    now = [0.0]
    events = [[report(0, 0)], [], [], []]
    workers = ScriptedWorkers(2, [events])
    controller = Controller(
        workers=workers,
        storage=MemoryStore(),
        policy=policy(max_failures=0, report_timeout_s=30),
        settings=ControllerSettings(clock=lambda: now[0]),
    )
    controller.step()  # launch
    controller.step()  # rank 0 reports step 0 at t=0
    now[0] = 29.0
    assert controller.step() is State.RUNNING  # within the timeout
    now[0] = 31.0
    assert controller.step() is State.FAILED
    message = str(controller.error)
    assert "rank 1 on node 10.0.0.1 (node-1) hung: TimeoutError: rank 1 has not reported step 0" in message
    assert "31 s after rank(s) 0 did (FailureConfig.report_timeout_s=30); it is running train.py:7" in message


def test_a_rank_that_never_reaches_a_barrier_is_hung_after_the_report_timeout():
    now = [0.0]
    workers = ScriptedWorkers(2, [[[SyncEvent(1, 0)], [], []]])
    controller = Controller(
        workers=workers,
        storage=MemoryStore(),
        policy=policy(max_failures=0, report_timeout_s=30),
        settings=ControllerSettings(clock=lambda: now[0]),
    )
    controller.step()  # launch
    controller.step()  # rank 1 waits at barrier 0 from t=0
    now[0] = 29.0
    assert controller.step() is State.RUNNING
    now[0] = 31.0
    assert controller.step() is State.FAILED
    assert "rank 0 has not reached barrier 0 of this attempt 31 s after rank(s) 1 did" in str(controller.error)
    assert workers.released == []


def test_a_rank_that_returns_while_another_waits_at_a_barrier_fails_the_attempt_at_once():
    workers = ScriptedWorkers(2, [[[SyncEvent(0, 0, "x")], [FinishedEvent(1, None)]]])
    controller = Controller(workers=workers, storage=MemoryStore(), policy=policy(max_failures=0))
    controller.step()  # launch
    controller.step()
    assert controller.step() is State.FAILED
    assert "rank 1's training function returned while rank(s) 0 wait at barrier 0" in str(controller.error)


def test_max_failures_zero_never_restarts():
    workers = ScriptedWorkers(1, [[[FailedEvent(0, ValueError("x"), "tb")]]])
    controller = Controller(workers=workers, storage=MemoryStore(), policy=policy(max_failures=0))
    with pytest.raises(WorkerGroupError, match="max_failures=0, so the run does not restart"):
        controller.run()
    assert len(workers.launched) == 1


def test_launch_failure_counts_as_a_failure_and_is_retried():
    workers = ScriptedWorkers(1, [[], [[FinishedEvent(0, "ok")]]], fail_launch={1})
    controller = Controller(workers=workers, storage=MemoryStore(), policy=policy(max_failures=1))
    assert controller.run() == "ok"
    assert len(workers.launched) == 2


def test_launch_failure_over_budget_names_the_group():
    workers = ScriptedWorkers(1, [[]], fail_launch={1})
    with pytest.raises(
        WorkerGroupError, match="the worker group failed to start: RuntimeError: placement group timed out"
    ) as info:
        Controller(workers=workers, storage=MemoryStore(), policy=policy(max_failures=0)).run()
    assert LAUNCH in info.value.worker_failures


def test_uneven_report_counts_are_an_error():
    events = [[report(0, 0), report(0, 1), report(1, 0)], [FinishedEvent(0, None), FinishedEvent(1, None)]]
    workers = ScriptedWorkers(2, [events])
    with pytest.raises(WorkerGroupError, match="same number of times"):
        Controller(workers=workers, storage=MemoryStore(), policy=policy(max_failures=0)).run()


def test_unlimited_budget_policy():
    assert may_restart(-1, 10_000)
    assert may_restart(2, 1) and not may_restart(2, 2)
    assert not may_restart(0, 0)


def test_setup_clashes_restart_without_spending_the_budget_a_few_times():
    def clash(rank):
        return [[FailedEvent(rank, OSError("Binding port 4242 failed"), "tb")]]

    def is_clash(error):
        return "Binding port" in str(error)

    done = [[FinishedEvent(0, "done"), FinishedEvent(1, None)]]
    workers = ScriptedWorkers(2, [clash(0), clash(1), done])
    store = MemoryStore()
    controller = Controller(workers=workers, storage=store, policy=policy(is_clash, max_failures=0))
    assert controller.run() == "done"
    assert len(workers.launched) == 3 and store.num_failures == 0 and controller.policy.setup_clashes == 2

    # A clash beside a real error is a real failure; and free restarts are limited.
    mixed = [[FailedEvent(0, OSError("Binding port 1 failed"), "tb"), FailedEvent(1, ValueError("boom"), "tb")]]
    with pytest.raises(WorkerGroupError, match="boom"):
        Controller(
            workers=ScriptedWorkers(2, [mixed]), storage=MemoryStore(), policy=policy(is_clash, max_failures=0)
        ).run()
    endless = ScriptedWorkers(2, [clash(0)] * (SETUP_CLASH_RESTARTS + 1))
    with pytest.raises(WorkerGroupError, match="Binding port"):
        Controller(workers=endless, storage=MemoryStore(), policy=policy(is_clash, max_failures=0)).run()
    assert len(endless.launched) == SETUP_CLASH_RESTARTS + 1


def test_callbacks_see_the_dead_rank_first_whatever_order_failures_arrive_in():
    attempt1 = [[FailedEvent(0, RuntimeError("Socket recv error, Connection reset by peer"), "tb")]]
    workers = ScriptedWorkers(2, [attempt1, [[FinishedEvent(0, None), FinishedEvent(1, None)]]])
    workers.dead = {1}
    restarts = []
    Controller(
        workers=workers,
        storage=MemoryStore(),
        policy=policy(max_failures=1),
        listeners=[Listener(on_restart=lambda a, f, c: restarts.append(f))],
    ).run()
    (failures,) = restarts
    assert [(f.world_rank, f.kind) for f in failures][0] == (1, "died") and len(failures) == 2


def test_features_attach_as_listeners_and_the_controller_keeps_only_the_run_loop():
    """Health, progress, tracking and Prefect's reports are listeners (``RunListener`` or the
    public ``UserCallback``): the controller's own state is the run loop's, 15 attributes at most."""
    from trainers._internal.run.health_watch import RunHealthWatch
    from trainers._internal.run.listener import RunListener
    from trainers._internal.run.progress import ProgressLine
    from trainers.integrations.mlflow import MLflowLoggerCallback

    heard = []

    class Heard(RunListener):
        def round_committed(self, run, index, round_, checkpoint, arrived_at):
            heard.append(("round", index, sorted(round_)))

        def run_ended(self, run):
            heard.append(("end", run.state))

    workers = ScriptedWorkers(2, [[[report(0, 0), report(1, 0)], [FinishedEvent(0, None), FinishedEvent(1, None)]]])
    controller = Controller(workers, storage=MemoryStore(), policy=policy(), listeners=[Heard()])
    controller.run()
    assert heard == [("round", 0, [0, 1]), ("end", State.FINISHED)]
    assert len(vars(controller)) <= 15, sorted(vars(controller))
    (health,) = [listener for listener in controller.listeners if isinstance(listener, RunHealthWatch)]
    assert health.account is not None and health.account.wall_s >= 0  # attached by default, and heard the run
    assert issubclass(ProgressLine, UserCallback) and issubclass(MLflowLoggerCallback, UserCallback)
