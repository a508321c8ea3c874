"""Rank assignment and the can-this-ever-fit check, as pure functions."""

from __future__ import annotations

import pytest

from trainers import InsufficientResourcesError, ScalingConfig
from trainers._internal.workers.ranks import assign_ranks
from trainers._internal.workers.resources import check_feasible


def test_ranks_group_workers_by_node_driver_node_first():
    ranks = assign_ranks(["b", "a", "b", "a", "c"], first_node="a")
    # worker 1 and 3 are on the driver's node "a": world ranks 0 and 1.
    assert [(r.world_rank, r.local_rank, r.node_rank, r.local_world_size) for r in ranks] == [
        (2, 0, 1, 2),
        (0, 0, 0, 2),
        (3, 1, 1, 2),
        (1, 1, 0, 2),
        (4, 0, 2, 1),
    ]
    assert sorted(r.world_rank for r in ranks) == [0, 1, 2, 3, 4]


def test_ranks_without_driver_node_follow_first_appearance():
    ranks = assign_ranks(["x", "y", "x"], first_node="elsewhere")
    assert [(r.world_rank, r.node_rank) for r in ranks] == [(0, 0), (2, 1), (1, 0)]


NODE = {"CPU": 4.0, "memory": 1e9}


def test_feasible_requests_pass():
    check_feasible(ScalingConfig(num_workers=4), [NODE])
    check_feasible(ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD"), [NODE, NODE])
    check_feasible(
        ScalingConfig(num_workers=2, resources_per_worker={"CPU": 2}, placement_strategy="STRICT_PACK"), [NODE]
    )
    check_feasible(ScalingConfig(num_workers=4, accelerator_type="A100"), [{**NODE, "accelerator_type:A100": 1.0}])


@pytest.mark.parametrize(
    "scaling, nodes, message",
    [
        (
            ScalingConfig(num_workers=5),
            [NODE],
            r"5 workers x \{CPU: 1\} = \{CPU: 5\}, but the cluster has \{CPU: 4, GPU: 0\}",
        ),
        (ScalingConfig(num_workers=1, use_gpu=True), [NODE], r"no node has 'GPU'"),
        (ScalingConfig(resources_per_worker={"neuron_cores": 1}), [NODE], r"no node has 'neuron_cores'"),
        (ScalingConfig(num_workers=1, accelerator_type="A100"), [NODE], r"no node has 'accelerator_type:A100'"),
        (
            ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD"),
            [NODE],
            r"STRICT_SPREAD needs one node per worker",
        ),
        (
            ScalingConfig(num_workers=2, resources_per_worker={"CPU": 3}, placement_strategy="STRICT_PACK"),
            [NODE, NODE],
            r"STRICT_PACK needs every worker on one node",
        ),
        # 8 CPUs in all, but a 3-CPU worker fits only once on each 4-CPU node.
        (ScalingConfig(num_workers=3, resources_per_worker={"CPU": 3}), [NODE, NODE], r"cannot be packed"),
    ],
)
def test_infeasible_requests_name_requested_and_available(scaling, nodes, message):
    with pytest.raises(InsufficientResourcesError, match=message) as info:
        check_feasible(scaling, nodes)
    assert "Lower ScalingConfig.num_workers" in str(info.value)
