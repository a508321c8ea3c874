"""Elastic training: ``ScalingConfig(num_workers=(min, max))``.

The sizing rules and the controller's resize are checked without Ray; then a real multi-node
Ray on this machine starts with room for fewer than min_workers (the run waits for a node to
join), loses a node (the run shrinks and resumes from its checkpoint) and gains one (the run
grows, without spending the failure budget).
"""

from __future__ import annotations

import logging
import threading

import pytest

import elastic_loops
from conftest import assert_no_leaks
from multinode import RecordedReports, fit_in_background, two_node_cluster
from test_controller import Listener, MemoryStore, ScriptedWorkers, policy, report
from trainers import DataParallelTrainer, FailureConfig, InsufficientResourcesError, RunConfig, ScalingConfig
from trainers._internal.events.messages import FailedEvent, FinishedEvent
from trainers._internal.run.controller import Controller, State
from trainers._internal.workers.elastic import ElasticSizer, count_workers
from trainers._internal.workers.resources import check_feasible

CPU = {"CPU": 1.0}


def test_count_workers_follows_the_placement_strategy_and_stops_at_max():
    nodes = {"a": {"CPU": 3.0}, "b": {"CPU": 1.5}, "c": {"CPU": 0.5}}
    assert count_workers(ScalingConfig(num_workers=(1, 8)), nodes) == 4
    assert count_workers(ScalingConfig(num_workers=(1, 3)), nodes) == 3
    assert count_workers(ScalingConfig(num_workers=(1, 8), placement_strategy="STRICT_PACK"), nodes) == 3
    assert count_workers(ScalingConfig(num_workers=(1, 8), placement_strategy="STRICT_SPREAD"), nodes) == 2
    labelled = ScalingConfig(num_workers=(1, 8), label_selector={"zone": "x"})
    assert count_workers(labelled, nodes, {"a": {"zone": "y"}, "b": {"zone": "x"}}) == 1


def test_a_running_elastic_group_grows_only_when_more_fit_and_at_most_once_an_interval():
    free = {"a": {}}
    now = [100.0]
    sizer = ElasticSizer(
        ScalingConfig(num_workers=(1, 4), elastic_resize_monitor_interval_s=10),
        free=lambda: free,
        labels=None,
        clock=lambda: now[0],
    )
    held = {"a": {"CPU": 1.0}}  # the attempt's own worker
    assert sizer.resize_to(1, held, started_at=95.0) is None  # 5 s into the attempt: too early
    now[0] = 106.0
    assert sizer.resize_to(1, held, started_at=95.0) is None  # counted: nothing more fits
    free = {"a": {}, "b": {"CPU": 2.0}}
    now[0] = 110.0
    assert sizer.resize_to(1, held, started_at=95.0) is None  # 4 s after the last count
    now[0] = 116.5
    assert sizer.resize_to(1, held, started_at=95.0) == 3


def test_too_few_to_start_waits_saying_so_once_until_the_deadline_then_returns_what_fits(caplog):
    now = [0.0]

    def free():
        now[0] += 1.0  # each count finds the clock a second on
        return {"a": {"CPU": 1.0}}

    sizer = ElasticSizer(ScalingConfig(num_workers=(2, 4)), free=free, labels=None, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="trainers._internal.workers.elastic"):
        assert sizer.size_to_start(deadline=2.5) == 1  # RayWorkers.launch then fails: WorkerStartError
    assert caplog.text.count("for the cluster to hold min_workers=2 worker(s) x {CPU: 1}") == 1


def test_elastic_feasibility_fails_only_when_no_node_shape_could_ever_hold_min_workers():
    nodes = [{"CPU": 2.0}, {"CPU": 2.0}]
    # As in Ray, an elastic run waits for nodes to join: 5 do not fit now, but 2-CPU nodes may join.
    check_feasible(ScalingConfig(num_workers=(5, 16)), nodes)
    with pytest.raises(
        InsufficientResourcesError,
        match=r"5 workers \(min_workers of num_workers=\(5, 16\)\).*no node holds one worker",
    ):
        check_feasible(ScalingConfig(num_workers=(5, 16), resources_per_worker={"CPU": 3}), nodes)
    with pytest.raises(InsufficientResourcesError, match="STRICT_PACK needs every worker on one node"):
        check_feasible(ScalingConfig(num_workers=(3, 4), placement_strategy="STRICT_PACK"), nodes)
    with pytest.raises(InsufficientResourcesError, match="no node has 'GPU'"):
        check_feasible(ScalingConfig(num_workers=(1, 2), use_gpu=True), nodes)
    check_feasible(ScalingConfig(num_workers=5), nodes[:1] * 5)  # a fixed size still counts the nodes there are
    with pytest.raises(InsufficientResourcesError, match="cannot be packed"):
        check_feasible(ScalingConfig(num_workers=5), nodes)


def test_a_resize_restarts_from_the_latest_checkpoint_without_a_failure_or_on_restart():
    attempt1 = [[report(0, 0, True)], []]
    attempt2 = [[FinishedEvent(0, "done"), FinishedEvent(1, None)]]
    workers = ScriptedWorkers(1, [attempt1, attempt2])
    store = MemoryStore()
    workers.sizes = [None, 2]
    resized, restarts = [], []

    controller = Controller(
        workers=workers,
        storage=store,
        policy=policy(max_failures=0),
        listeners=[Listener(on_resize=lambda *a: resized.append(a), on_restart=lambda *a: restarts.append(a))],
    )
    assert controller.step() is State.RUNNING
    assert controller.step() is State.RUNNING  # the round commits; nothing more fits yet
    assert controller.step() is State.RESTARTING
    assert resized == [(1, 1, 2)] and workers.shutdowns == 1
    workers.world_size = 2  # what RayWorkers does at its next launch
    assert controller.run() == "done"
    assert workers.launched == [(1, None), (2, "checkpoint@1/0")]
    assert store.num_failures == 0 and restarts == []


@pytest.mark.parametrize("elastic", [True, False])
def test_a_lost_node_costs_no_failure_only_in_an_elastic_run(elastic):
    died = [[FailedEvent(1, RuntimeError("worker process died"), "", kind="died")]]
    workers = ScriptedWorkers(2, [died, [[FinishedEvent(0, "done"), FinishedEvent(1, None)]]])
    workers.lost_nodes = {"node-1"}  # rank 1's node left the cluster
    store = MemoryStore()
    controller = Controller(workers=workers, storage=store, policy=policy(elastic=elastic, max_failures=1))
    assert controller.run() == "done"
    assert store.num_failures == (0 if elastic else 1)


def test_an_elastic_worker_no_node_shape_can_hold_fails_before_any_worker_starts(ray_local, tmp_path):
    trainer = DataParallelTrainer(
        elastic_loops.elastic_loop,
        train_loop_config={"stop_file": str(tmp_path / "stop"), "sleep_s": 0},
        scaling_config=ScalingConfig(num_workers=(2, 4), resources_per_worker={"CPU": 64}),
        run_config=RunConfig(name="too-big", storage_path=str(tmp_path)),
    )
    with pytest.raises(
        InsufficientResourcesError, match="min_workers of num_workers=\\(2, 4\\).*no node holds one worker"
    ):
        trainer.fit()
    assert_no_leaks()


# -- a real multi-node Ray ---------------------------------------------------------------------


@pytest.fixture
def two_nodes(monkeypatch):
    """Head and one more node, 1 CPU each."""
    with two_node_cluster(monkeypatch, start_timeout_s=30.0) as nodes:
        yield nodes


@pytest.fixture
def one_node(monkeypatch):
    """The head alone, 1 CPU: room for 1 worker until the test adds a node."""
    with two_node_cluster(monkeypatch, start_timeout_s=60.0, spare=False) as nodes:
        yield nodes


class LogLine(logging.Handler):
    """Set when ``logger`` logs a line containing ``text``."""

    def __init__(self, logger: str, text: str) -> None:
        super().__init__()
        self.text, self.seen = text, threading.Event()
        self.logger = logging.getLogger(logger)

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()

    def __enter__(self) -> LogLine:
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self)


def test_an_elastic_run_waits_for_nodes_to_join_until_min_workers_fit(one_node, tmp_path):
    cluster, _ = one_node
    sizes = RecordedReports()
    stop = tmp_path / "stop"
    trainer = DataParallelTrainer(
        elastic_loops.elastic_loop,
        train_loop_config={"stop_file": str(stop), "sleep_s": 0.1},
        scaling_config=ScalingConfig(num_workers=(2, 4)),
        run_config=RunConfig(
            name="waits", storage_path=str(tmp_path), failure_config=FailureConfig(max_failures=0), callbacks=[sizes]
        ),
    )
    with LogLine("trainers._internal.workers.elastic", "for the cluster to hold min_workers=2 worker(s)") as waiting:
        thread, outcome = fit_in_background(trainer)
        try:
            assert waiting.seen.wait(120), outcome  # not InsufficientResourcesError: it waits, saying for what
            cluster.add_node(num_cpus=1)
            sizes.wait_for(lambda r: r["world_size"] == 2)
        finally:
            stop.touch()
            thread.join(120)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].metrics["world_size"] == 2


def test_elastic_run_shrinks_on_a_lost_node_and_grows_when_a_node_joins(two_nodes, tmp_path):
    cluster, spare = two_nodes
    sizes = RecordedReports()
    stop = tmp_path / "stop"
    trainer = DataParallelTrainer(
        elastic_loops.elastic_loop,
        train_loop_config={"stop_file": str(stop), "sleep_s": 0.1},
        scaling_config=ScalingConfig(num_workers=(1, 2), elastic_resize_monitor_interval_s=0.5),
        # No failure allowed: an elastic run shrinks past a lost node, and grows, at no cost.
        run_config=RunConfig(
            name="elastic", storage_path=str(tmp_path), failure_config=FailureConfig(max_failures=0), callbacks=[sizes]
        ),
    )
    thread, outcome = fit_in_background(trainer)
    try:
        first = sizes.wait_for(lambda r: r["world_size"] == 2)  # both nodes free: it starts at max_workers
        cluster.remove_node(spare)  # rank 1 dies with its node
        shrunk = sizes.wait_for(lambda r: r["world_size"] == 1, after=first + 1)
        cluster.add_node(num_cpus=1)
        grown = sizes.wait_for(lambda r: r["world_size"] == 2, after=shrunk + 1)
    finally:
        stop.touch()
        thread.join(120)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    reports = sizes.reports
    # Each new size resumed from the checkpoint of the report just before it.
    assert reports[shrunk]["resumed_from"] == reports[shrunk - 1]["step"] == reports[shrunk]["step"] - 1
    assert reports[shrunk - 1]["world_size"] == 2
    assert reports[grown]["resumed_from"] == reports[grown - 1]["step"] == reports[grown]["step"] - 1
    assert reports[grown - 1]["world_size"] == 1
    assert [[f.kind for f in failures] for failures in sizes.restarts] == [
        ["died"]
    ]  # the lost node; the growth was no failure
    history = outcome["result"].metrics_dataframe
    assert list(history["step"]) == list(range(len(history)))  # every step exactly once
