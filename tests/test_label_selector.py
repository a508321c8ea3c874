"""ScalingConfig(label_selector=...) on a real two-node Ray on this machine: workers go only to
nodes with the labels, a selector no node matches fails before anything is reserved, and each
worker's Ray Data shard prefers its own node."""

from __future__ import annotations

import pytest

import trainers
from conftest import assert_no_leaks, live_placement_groups
from trainers import DataParallelTrainer, InsufficientResourcesError, RunConfig, ScalingConfig, UserCallback
from trainers._internal.workers.resources import label_matches


@pytest.fixture(scope="module")
def labelled_nodes():
    """Head {"zone": "a"} and one more node {"zone": "b", "tier": "gold"}, 2 CPUs each: node id -> labels."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()  # the suite's shared single-node Ray; ray_local restarts it when needed
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False, "labels": {"zone": "a"}}
    )
    cluster.add_node(num_cpus=2, labels={"zone": "b", "tier": "gold"})
    ray.init(address=cluster.address)
    yield {node["NodeID"]: node["Labels"] for node in ray.nodes() if node["Alive"]}
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def two_nodes(labelled_nodes):
    yield labelled_nodes
    assert_no_leaks()


class Rounds(UserCallback):
    def __init__(self):
        self.rounds = []

    def after_report(self, run_context, metrics, checkpoint):
        self.rounds.append(metrics)


def where_loop():
    import ray

    shard = trainers.get_dataset_shard("train")
    hints = ray.get(shard._coord_actor.__ray_call__.remote(lambda coordinator: coordinator._locality_hints))
    rows = sum(len(batch["id"]) for batch in shard.iter_batches(batch_size=4, batch_format="numpy"))
    trainers.report({"node": ray.get_runtime_context().get_node_id(), "hints": hints, "rows": rows})


def fit(tmp_path, name, label_selector):
    import ray.data

    seen = Rounds()
    DataParallelTrainer(
        where_loop,
        datasets={"train": ray.data.range(8)},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}, label_selector=label_selector),
        run_config=RunConfig(name=name, storage_path=str(tmp_path), callbacks=[seen]),
    ).fit()
    (ranks,) = seen.rounds
    return ranks


def test_one_selector_puts_every_worker_on_a_matching_node(two_nodes, tmp_path):
    ranks = fit(tmp_path, "gold", {"tier": "gold"})
    assert [two_nodes[r["node"]]["zone"] for r in ranks] == ["b", "b"]


def test_a_list_gives_each_worker_its_own_selector_and_shards_prefer_their_workers_nodes(two_nodes, tmp_path):
    # PACK alone would put both 0.5-CPU workers on one node.
    ranks = fit(tmp_path, "per-worker", [{"zone": "b"}, {"zone": "in(a,c)"}])
    assert sorted(two_nodes[r["node"]]["zone"] for r in ranks) == ["a", "b"]
    # Shard locality: the hints are the workers' nodes in rank order (the nodes differ, so the
    # order is checked too), and the equal shards still cover the rows.
    nodes_by_rank = [r["node"] for r in ranks]
    assert [r["hints"] for r in ranks] == [nodes_by_rank, nodes_by_rank]
    assert [r["rows"] for r in ranks] == [4, 4]


def test_a_selector_no_node_can_satisfy_fails_before_anything_is_reserved(two_nodes, tmp_path):
    with pytest.raises(InsufficientResourcesError) as info:
        DataParallelTrainer(
            where_loop,
            scaling_config=ScalingConfig(num_workers=2, label_selector={"zone": "c"}),
            run_config=RunConfig(name="nowhere", storage_path=str(tmp_path)),
        ).fit()
    message = str(info.value)
    assert "label_selector {'zone': 'c'} (for every worker) matches none of the cluster's 2 live node(s)" in message
    assert "{'zone': 'a'}" in message and "{'tier': 'gold', 'zone': 'b'}" in message
    # Node b alone matches, and its 2 CPUs cannot hold 3 one-CPU workers (the cluster's 4 could).
    with pytest.raises(
        InsufficientResourcesError,
        match=r"3 workers x \{CPU: 1\}.* on 1 node\(s\) matching label_selector \{'zone': 'b'\}",
    ):
        DataParallelTrainer(
            where_loop,
            scaling_config=ScalingConfig(num_workers=3, label_selector={"zone": "b"}),
            run_config=RunConfig(name="too-small", storage_path=str(tmp_path)),
        ).fit()
    assert live_placement_groups() == []
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "too-small").exists()


@pytest.mark.parametrize(
    "selector, matches",
    [
        ({"zone": "b"}, True),
        ({"zone": "a"}, False),
        ({"zone": "!a"}, True),
        ({"zone": "in(a, b)"}, True),
        ({"zone": "!in(b,c)"}, False),
        ({"tier": "!gold"}, True),  # a label the node lacks is "not gold", as Ray's scheduler reads it
        ({"tier": "gold"}, False),
        ({"zone": "b", "disk": "ssd"}, True),
        ({"zone": "b", "disk": "hdd"}, False),
    ],
)
def test_selectors_read_as_rays_scheduler_reads_them(selector, matches):
    assert label_matches(selector, {"zone": "b", "disk": "ssd"}) is matches
