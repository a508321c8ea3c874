"""Node preemption: a node drained with a deadline, as a cloud does before taking it back.

The budget rules and the drain watch are checked without Ray; then a real two-node Ray on this
machine drains the node of rank 1: the loop sees ``get_preemption_info()``, saves a checkpoint,
and the run goes on from it on the other node, spending ``max_preemption_failures`` only.
"""

from __future__ import annotations

import pickle
import time

import pytest

import elastic_loops
from multinode import RecordedReports, fit_in_background, two_node_cluster
from test_controller import MemoryStore, ScriptedWorkers, policy, report
from trainers import (
    DataParallelTrainer,
    FailureConfig,
    PreemptionError,
    PreemptionInfo,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)
from trainers._internal.events.messages import FailedEvent, FinishedEvent
from trainers._internal.run.controller import Controller, ControllerSettings
from trainers._internal.workers.preemption_watch import DrainWatch, PreemptionNotice
from trainers.errors import WorkerError, WorkerGroupError


def preempted(rank):
    return FailedEvent(rank, WorkerError("worker process died: its node was preempted"), "", kind="preempted")


def test_preempted_deaths_spend_the_preemption_budget_not_max_failures():
    attempt1 = [
        [report(0, 0, True), report(1, 0)],
        [preempted(1), FailedEvent(0, RuntimeError("gloo: connection reset"), "")],
    ]
    attempt3 = [[FinishedEvent(0, "done"), FinishedEvent(1, None)]]
    workers = ScriptedWorkers(2, [attempt1, [[preempted(0)]], attempt3])
    store = MemoryStore()
    controller = Controller(workers=workers, storage=store, policy=policy(max_failures=0, max_preemption_failures=2))
    assert controller.run() == "done"
    assert store.num_failures == 0 and store.num_preemptions == 2
    assert workers.launched[1] == (2, "checkpoint@1/0")


def test_a_spent_preemption_budget_raises_preemption_error_naming_the_node_and_ranks():
    workers = ScriptedWorkers(2, [[[preempted(1)]], [[preempted(1)]]])
    controller = Controller(
        workers=workers, storage=MemoryStore(), policy=policy(max_failures=5, max_preemption_failures=1)
    )
    with pytest.raises(PreemptionError) as caught:
        controller.run()
    error = caught.value
    assert isinstance(error, TrainingFailedError) and not error.drain_timed_out
    assert error.preemption_info == PreemptionInfo(None, {"node-1": [1]})
    assert "max_preemption_failures" in str(error)
    again = pickle.loads(pickle.dumps(error))
    assert (
        type(again) is PreemptionError and again.preemption_info == error.preemption_info and str(again) == str(error)
    )


def test_workers_still_running_at_the_deadline_plus_grace_are_stopped():
    info = PreemptionInfo(deadline_ms=1_000_000, preempted_node_to_ranks={"node-1": [1]})
    workers = ScriptedWorkers(2, [[[PreemptionNotice(info)], [report(0, 0, True), report(1, 0)], [], []]])
    now = [990.0]
    controller = Controller(
        workers=workers,
        storage=MemoryStore(),
        policy=policy(max_failures=0, max_preemption_failures=0, preemption_grace_s=5.0),
        settings=ControllerSettings(wall_clock=lambda: now[0]),
    )
    controller.step()  # launch
    controller.step()  # the notice
    now[0] = 1004.0  # past the deadline, within the grace: the checkpoint round still commits
    controller.step()
    assert workers.shutdowns == 0
    now[0] = 1005.0
    with pytest.raises(PreemptionError) as caught:
        controller.run()
    assert caught.value.drain_timed_out and caught.value.preemption_info == info


def test_the_drain_watch_reports_each_drain_of_its_own_nodes_once():
    drained = {}
    now = [0.0]
    watch = DrainWatch({"a": [0, 1], "b": [2]}, source=lambda: dict(drained), poll_s=1.0, clock=lambda: now[0])
    assert watch.check() is None
    drained.update({"elsewhere": 5, "b": 0})
    now[0] = 0.5
    assert watch.check() is None  # polled less than poll_s ago
    now[0] = 1.0
    assert watch.check() == PreemptionInfo(None, {"b": [2]})  # Ray's deadline 0: none given
    now[0] = 2.0
    assert watch.check() is None  # nothing new
    drained["a"] = 7000
    now[0] = 3.0
    assert watch.check() == PreemptionInfo(7000, {"a": [0, 1]})


# -- a real two-node Ray -------------------------------------------------------------------------


@pytest.fixture
def two_nodes(monkeypatch):
    """Head and one more node, 1 CPU each."""
    with two_node_cluster(monkeypatch, start_timeout_s=30.0) as nodes:
        yield nodes


def drain_for_preemption(node_id: str, deadline_s: float) -> None:
    """What a cloud's autoscaler does before it takes a spot node back."""
    import ray
    from ray.core.generated import autoscaler_pb2

    reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
    gcs = ray._raylet.GcsClient(address=ray.get_runtime_context().gcs_address)
    accepted, why = gcs.drain_node(node_id, reason, "spot instance reclaimed", int((time.time() + deadline_s) * 1000))
    assert accepted, why


def test_a_drained_nodes_workers_see_the_preemption_save_and_the_run_resumes_on_the_other_node(two_nodes, tmp_path):
    cluster, spare = two_nodes
    reports = RecordedReports()
    stop = tmp_path / "stop"
    trainer = DataParallelTrainer(
        elastic_loops.preemption_loop,
        train_loop_config={"stop_file": str(stop), "sleep_s": 0.1},
        scaling_config=ScalingConfig(num_workers=(1, 2), elastic_resize_monitor_interval_s=0.5),
        # No failure allowed at all: the preemption must not count as one.
        run_config=RunConfig(
            name="preempted",
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=0),
            callbacks=[reports],
        ),
    )
    thread, outcome = fit_in_background(trainer)
    try:
        reports.wait_for(lambda r: r["world_size"] == 2)
        drain_for_preemption(spare.node_id, deadline_s=600)  # the node goes when the test removes it
        saved = reports.wait_for(lambda r: r["preempted_ranks"] is not None)
        cluster.remove_node(spare)  # the cloud takes the node back
        resumed = reports.wait_for(lambda r: r["world_size"] == 1)
    finally:
        stop.touch()
        thread.join(120)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    jit = reports.reports[saved]
    assert jit["preempted_ranks"] == [1] and jit["deadline_ms"] > time.time() * 1000
    assert reports.checkpoints[saved] is not None
    assert reports.reports[resumed]["resumed_from"] == jit["step"]
    assert [[f.world_rank for f in failures] for failures in reports.restarts] == [
        [1]
    ]  # one restart, for rank 1's node, though max_failures=0


def test_a_preemption_over_budget_raises_preemption_error_once_the_deadline_passes(two_nodes, tmp_path):
    cluster, spare = two_nodes
    reports = RecordedReports()
    trainer = DataParallelTrainer(
        elastic_loops.preemption_loop,
        train_loop_config={"stop_file": str(tmp_path / "never"), "sleep_s": 0.1},
        scaling_config=ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD"),
        run_config=RunConfig(
            name="over-budget",
            storage_path=str(tmp_path),
            callbacks=[reports],
            failure_config=FailureConfig(max_failures=3, max_preemption_failures=0),
        ),
    )
    thread, outcome = fit_in_background(trainer)
    reports.wait_for(lambda r: r["step"] >= 1)
    drain_for_preemption(spare.node_id, deadline_s=1)  # the node stays, but its deadline passes
    thread.join(120)
    assert not thread.is_alive()
    error = outcome.get("error")
    assert isinstance(error, PreemptionError), outcome
    assert error.drain_timed_out  # the workers were still training at the deadline
    assert error.preemption_info.preempted_ranks == [1]
    assert error.preemption_info.preempted_node_ids == [spare.node_id]


@pytest.mark.parametrize("relax", [True, False])
def test_relaxed_collectives_commit_the_survivors_checkpoint_without_the_preempted_rank(relax):
    """FailureConfig(relax_collectives_on_preemption=True): rank 1 is being taken away and never
    reports step 0; rank 0's just-in-time checkpoint commits without it (and waits for it without)."""
    info = PreemptionInfo(deadline_ms=1_000_000, preempted_node_to_ranks={"node-1": [1]})
    store = MemoryStore()
    workers = ScriptedWorkers(2, [[[PreemptionNotice(info)], [report(0, 0, True)], [report(1, 0)], []]])
    controller = Controller(
        workers=workers,
        storage=store,
        policy=policy(max_failures=0, relax_collectives_on_preemption=relax),
        settings=ControllerSettings(wall_clock=lambda: 990.0),
    )
    controller.step()  # launch
    controller.step()  # the notice
    controller.step()  # rank 0 reports step 0 with a checkpoint
    assert [(index, staged) for _, index, _, staged in store.reports] == ([(0, True)] if relax else [])
    controller.step()  # rank 1's late report of the same step is not a second round
    assert len(store.reports) == 1 and controller.book.pending == {}


def test_rank_0_being_preempted_relaxes_nothing():
    info = PreemptionInfo(deadline_ms=1_000_000, preempted_node_to_ranks={"node-0": [0]})
    store = MemoryStore()
    workers = ScriptedWorkers(2, [[[PreemptionNotice(info)], [report(1, 0, True)], []]])
    controller = Controller(
        workers=workers,
        storage=store,
        policy=policy(max_failures=0, relax_collectives_on_preemption=True),
        settings=ControllerSettings(wall_clock=lambda: 990.0),
    )
    for _ in range(3):
        controller.step()
    assert store.reports == []  # rank 0's metrics are the run's: its round waits for it


class DriverKilled(BaseException):
    """Ends the controller's run as a killed driver process would, mid-attempt."""


class WorkersOfADriverThatDies(ScriptedWorkers):
    def poll(self, timeout_s):
        if not self._script:
            raise DriverKilled
        return super().poll(timeout_s)


@pytest.mark.parametrize("second_fault", ["preemption", "failure"])
def test_a_driver_rerun_goes_on_spending_both_budgets_from_run_json(tmp_path, second_fault):
    from storage import RunStorage

    budgets = policy(max_failures=1, max_preemption_failures=1)
    first = RunStorage(str(tmp_path), "r")
    first.open("driver-1")
    dies_after_two_faults = WorkersOfADriverThatDies(
        2, [[[preempted(1)]], [[FailedEvent(0, RuntimeError("loss is nan"), "")]], [[]]]
    )
    with pytest.raises(DriverKilled):
        Controller(workers=dies_after_two_faults, storage=first, policy=budgets).run()
    first.close()

    rerun = RunStorage(str(tmp_path), "r")
    snapshot = rerun.open("driver-2")
    assert (snapshot.num_preemptions, snapshot.num_failures) == (1, 1)
    fault = preempted(1) if second_fault == "preemption" else FailedEvent(0, RuntimeError("loss is nan"), "")
    workers = ScriptedWorkers(2, [[[fault]], [[FinishedEvent(0, "done"), FinishedEvent(1, None)]]])
    spent = PreemptionError if second_fault == "preemption" else WorkerGroupError
    with pytest.raises(spent):  # each budget held one restart, and the first driver used it
        Controller(workers=workers, storage=rerun, policy=budgets).run()
    assert len(workers.launched) == 1
