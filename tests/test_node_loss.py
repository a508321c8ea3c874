"""A real two-node Ray cluster on this machine: losing the node of one rank mid-run."""

from __future__ import annotations

import os
import threading
import time

import pytest

import loops
from multinode import fit_in_background, two_node_cluster
from trainers import FailureConfig, RunConfig, ScalingConfig, UserCallback, WorkerGroupError, report
from trainers.torch import TorchTrainer


@pytest.fixture
def two_nodes(monkeypatch):
    """Head and one more node, 1 CPU each, so STRICT_SPREAD puts one rank on each."""
    with two_node_cluster(monkeypatch, start_timeout_s=15.0) as nodes:
        yield nodes


class Watch(UserCallback):
    """Signals when ``step`` was reported; records restarts."""

    def __init__(self, step):
        self.step = step
        self.reached = threading.Event()
        self.restarted = threading.Event()
        self.restarts = []

    def after_report(self, run_context, metrics, checkpoint):
        if metrics[0]["step"] >= self.step:
            self.reached.set()

    def on_restart(self, run_context, failures, resume_from):
        self.restarts.append(failures)
        self.restarted.set()


def trainer(tmp_path, name, callback, max_failures, report_where=False):
    return TorchTrainer(
        loops.checkpointing_loop,
        train_loop_config={"steps": 10, "every": 1, "sleep_s": 0.2, "report_where": report_where},
        scaling_config=ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD"),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=max_failures),
            callbacks=[callback],
        ),
    )


class Where(Watch):
    """Watch, plus each attempt's (pid, node) per rank, from the loop's reports."""

    def __init__(self, step):
        super().__init__(step)
        self.places = {}

    def after_report(self, run_context, metrics, checkpoint):
        self.places.setdefault(run_context.attempt, [(m["pid"], m["node"]) for m in metrics])
        super().after_report(run_context, metrics, checkpoint)


def test_lost_node_resumes_when_a_node_comes_back(two_nodes, tmp_path):
    """The rank on the lost node is replaced on the node that joins; the other keeps its process."""
    cluster, spare = two_nodes
    watch = Where(step=3)
    thread, outcome = fit_in_background(trainer(tmp_path, "node-loss", watch, max_failures=2, report_where=True))
    assert watch.reached.wait(120)
    cluster.remove_node(spare)  # the rank on it dies with its node
    assert watch.restarted.wait(120)  # the controller saw the loss; its restart waits for a second node
    new = cluster.add_node(num_cpus=1)
    thread.join(180)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert watch.restarts and watch.restarts[0][0].kind == "died"
    assert list(result.metrics_dataframe["step"]) == list(range(10))
    before, after = watch.places[1], watch.places[2]
    assert before[0] == after[0] and before[0][1] == cluster.head_node.node_id  # rank 0 kept its process
    assert before[1][1] == spare.node_id and after[1][1] == new.node_id  # rank 1 replaced on the new node
    (restart,) = result_record(result)["restarts"]
    assert (restart["kept"], restart["replaced"]) == ([0], {"1": "its process died"})


def result_record(result):
    import json

    with open(os.path.join(result.path, "run.json")) as f:
        return json.load(f)


def test_lost_node_without_replacement_is_a_clear_error_not_a_hang(two_nodes, tmp_path):
    cluster, spare = two_nodes
    watch = Watch(step=2)
    thread, outcome = fit_in_background(trainer(tmp_path, "node-gone", watch, max_failures=1))
    assert watch.reached.wait(120)
    cluster.remove_node(spare)
    thread.join(120)
    assert not thread.is_alive()
    error = outcome.get("error")
    assert isinstance(error, WorkerGroupError), outcome
    message = str(error)
    assert "the worker group failed to start" in message
    assert "could not reserve 2 x {'CPU': 1} (STRICT_SPREAD) within 15 s" in message
    assert error.budget_exhausted


def test_node_lost_while_the_workers_start_names_the_node_within_the_timeout(two_nodes, tmp_path, monkeypatch):
    """The group is placed on both nodes, then the spare node dies before its worker starts: the
    start-up wait ends at the start timeout with the node and the resources named, not a hang."""
    import trainers._internal.workers.run_workers as attempt

    cluster, spare = two_nodes
    split = attempt.split_datasets

    def lose_the_spare_node_then_split(*args, **kwargs):
        cluster.remove_node(spare)  # between placement and the actors' start
        return split(*args, **kwargs)

    monkeypatch.setattr(attempt, "split_datasets", lose_the_spare_node_then_split)
    with pytest.raises(WorkerGroupError) as raised:
        trainer(tmp_path, "node-lost-at-start", Watch(step=99), max_failures=0).fit()
    message = str(raised.value)
    assert "the worker group failed to start" in message
    assert "1 of 2 worker(s) x {'CPU': 1} did not start" in message, message
    assert f"on node {spare.node_id[:8]} (" in message.split("Nodes now:")[0], message  # the node it was placed on
    nodes_now = message.split("Nodes now:")[1].split(". A node")[0]
    assert spare.node_id[:8] not in nodes_now and "free {CPU: 0} of {CPU: 1}" in nodes_now, message


def test_resources_held_by_other_work_are_named_per_node(two_nodes, tmp_path):
    """Both nodes exist but another actor holds the spare node's CPU: the placement wait ends at
    the start timeout, naming what each node has free."""
    import ray

    cluster, spare = two_nodes

    @ray.remote(num_cpus=1)
    class Blocker:
        def node(self):
            return ray.get_runtime_context().get_node_id()

    blockers = [Blocker.remote()]
    held_node = ray.get(blockers[0].node.remote())
    try:
        with pytest.raises(WorkerGroupError) as raised:
            trainer(tmp_path, "resources-held", Watch(step=99), max_failures=0).fit()
    finally:
        ray.kill(blockers[0])
    message = str(raised.value)
    assert "could not reserve 2 x {'CPU': 1} (STRICT_SPREAD) within 15 s" in message, message
    assert f"node {held_node[:8]} (" in message and "free {CPU: 0} of {CPU: 1}" in message, message


def _pid_and_node():
    import ray

    report({"step": 0})
    return os.getpid(), ray.get_runtime_context().get_node_id()


def _pids_by_node(tmp_path, name):
    """Each rank's (pid, node) of one short STRICT_SPREAD run (rank 0's return value gathers them)."""

    def everyone(config):
        import torch.distributed as dist

        rows = [None] * dist.get_world_size()
        dist.all_gather_object(rows, _pid_and_node())
        return {node: pid for pid, node in rows}

    return (
        TorchTrainer(
            everyone,
            scaling_config=ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD"),
            run_config=RunConfig(name=name, storage_path=str(tmp_path)),
        )
        .fit()
        .return_value
    )


def test_a_worker_kept_on_a_node_that_left_is_replaced_and_the_other_reused(two_nodes, tmp_path):
    """Workers kept after a clean run (FLOWTRAIN_KEEP_WORKERS_S) are matched to the next group's
    nodes: the one whose node left is not waited for, the other serves again."""
    cluster, spare = two_nodes
    first = _pids_by_node(tmp_path, "kept-first")
    assert set(first) == {cluster.head_node.node_id, spare.node_id}
    cluster.remove_node(spare)
    new = cluster.add_node(num_cpus=1)
    second = _pids_by_node(tmp_path, "kept-second")
    assert second[cluster.head_node.node_id] == first[cluster.head_node.node_id]
    assert second[new.node_id] != first[spare.node_id]


def test_a_group_that_cannot_place_a_lost_bundle_again_still_starts_workers_in_the_others(two_nodes):
    """After a node loss Ray places the lost node's bundles again; while one cannot be (here: no
    room left; in a run, a bundle moved away took it) the group never becomes ready, yet its
    placed bundles take workers, so replacing a rank elsewhere waits only for that rank's bundle."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from prefect_server import wait_until
    from trainers._internal.workers.placement_away import wait_for_bundles

    @ray.remote(num_cpus=1)
    class NodeProbe:
        def node(self):
            return ray.get_runtime_context().get_node_id()

    cluster, spare = two_nodes
    group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    assert group.wait(60)
    slots = placement_group_table(group)["bundles_to_node_id"]
    lost = next(bundle for bundle, node in slots.items() if node == spare.node_id)
    kept = 1 - lost
    probe = None
    try:
        cluster.remove_node(spare)
        wait_until(lambda: placement_group_table(group)["state"] == "RESCHEDULING", timeout_s=60, what="the loss")
        assert not group.wait(0) and not placement_group_table(group)["bundles_to_node_id"][lost]
        # Without it, the wait for the whole group: not ready within the deadline.
        assert wait_for_bundles(group, [kept], time.monotonic() + 60)
        assert not wait_for_bundles(group, [lost], time.monotonic() + 2)
        in_kept = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=kept)
        probe = NodeProbe.options(scheduling_strategy=in_kept).remote()
        assert ray.get(probe.node.remote(), timeout=60) == slots[kept]
    finally:
        if probe is not None:
            ray.kill(probe)
        remove_placement_group(group)


def test_a_rank_on_a_live_host_is_replaced_while_ray_cannot_place_a_moved_bundle_again(two_nodes, tmp_path):
    """A killed host's rank moves to a third node before Ray declares the host dead; Ray then
    tries to place the group's bundle there again and finds no room (the move took it). A rank
    that dies next, on a live host, is still replaced alone: the refill waits for its own bundle,
    not for the group that can no longer be whole (which waited out the start timeout, then
    restarted every worker)."""
    import signal

    from ray.util.placement_group import placement_group_table

    from multinode import RecordedReports
    from prefect_server import wait_until
    from trainers._internal.workers.resources import WORKER_GROUP_PREFIX

    cluster, spare = two_nodes
    steps_file = tmp_path / "steps"
    record = RecordedReports()
    fit = TorchTrainer(
        loops.checkpointing_loop,
        train_loop_config={
            "steps": 10**6,
            "every": 5,
            "sleep_s": 0.1,
            "report_where": True,
            "steps_file": str(steps_file),
        },
        scaling_config=ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD"),
        run_config=RunConfig(
            name="moved-then-lost",
            storage_path=str(tmp_path),
            failure_config=FailureConfig(max_failures=3),
            callbacks=[record],
        ),
    )
    thread, outcome = fit_in_background(fit)
    try:
        record.wait_for(lambda r: r["step"] >= 3)
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        cluster.remove_node(spare, allow_graceful=False)  # its raylet refuses at once; Ray's verdict takes ~16 s
        wait_until(lambda: len(record.restarts) == 1, timeout_s=120, what="the first replacement")

        def group_state():
            groups = placement_group_table().values()
            return {
                g["state"] for g in groups if g["name"].startswith(WORKER_GROUP_PREFIX) and "moved" not in g["name"]
            }

        wait_until(lambda: group_state() == {"RESCHEDULING"}, timeout_s=120, what="Ray placing the lost bundle again")
        after = len(record.reports)
        latest = record.reports[record.wait_for(lambda r: True, after=after)]
        steps_file.write_text(str(latest["step"] + 20))  # the attempt after the next failure ends soon
        os.kill(latest["pid"], signal.SIGKILL)
    finally:
        thread.join(240)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    first, second = result_record(outcome["result"])["restarts"]
    assert first["full_restart"] is None and list(first["replaced"]) == ["1"], first
    assert second["full_restart"] is None and list(second["replaced"]) == ["0"], second
