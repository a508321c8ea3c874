"""Bundles moved away from nodes that stopped answering (``workers/placement_away.py``), on a
real local Ray: a node to avoid gets nothing, and a slot an earlier move emptied is used before
anything new is reserved."""

from __future__ import annotations

import time

import pytest

from trainers._internal.workers.placement_away import MovedBundles, silent_raylets

pytestmark = pytest.mark.usefixtures("ray_local")


def test_a_bundle_moves_off_the_avoided_node_then_a_second_one_into_the_slot_the_first_left():
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    here = ray.get_runtime_context().get_node_id()
    group = placement_group([{"CPU": 0.1}, {"CPU": 0.1}])
    assert group.wait(60)
    slots = placement_group_table(group)["bundles_to_node_id"]
    moved = MovedBundles()
    try:
        # The only node avoided: nothing can hold the bundle, and nothing is left reserved.
        assert moved.move([0], group, slots, {"CPU": 0.1}, {here}, None, time.monotonic() + 2) == [0]
        assert moved.placement(0) is None and _held() == 1
        # Away from a node that is not this one: a reservation of its own, here.
        assert moved.move([0], group, slots, {"CPU": 0.1}, {"f" * 56}, None, time.monotonic() + 60) == []
        own, index = moved.placement(0)
        assert own is not group and index == 0 and moved.nodes() == {0: here}
        # Bundle 1 moves next: into bundle 0's emptied slot of the group, nothing new reserved.
        assert moved.move([1], group, slots, {"CPU": 0.1}, {"f" * 56}, None, time.monotonic() + 60) == []
        assert moved.placement(1) == (group, 0)
        assert _held() == 2
    finally:
        moved.release()
        remove_placement_group(group)
    assert _held() == 0


def test_a_bundle_ray_placed_again_in_its_group_stays_there_instead_of_waiting_for_room():
    """The lost node was declared dead while the bundle was being moved, and Ray placed the group's
    own bundle again, in the room the move waited for (here: a reservation that never fits)."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    here, lost = ray.get_runtime_context().get_node_id(), "f" * 56
    group = placement_group([{"CPU": 0.1}])
    assert group.wait(60)
    moved = MovedBundles()
    try:
        # Without the check it waits out the deadline and reports the bundle missing: [0].
        assert moved.move([0], group, {0: lost}, {"CPU": 10_000}, {lost}, None, time.monotonic() + 60) == []
        assert moved.placement(0) is None and moved.nodes() == {}
        assert _held() == 1 and placement_group_table(group)["bundles_to_node_id"][0] == here  # nothing else held
    finally:
        moved.release()
        remove_placement_group(group)


def _held() -> int:
    """Placement groups not removed."""
    import ray

    return sum(1 for group in ray.util.placement_group_table().values() if group["state"] != "REMOVED")


def test_a_live_raylet_answers_and_an_unknown_node_is_left_to_ray():
    import ray

    here = ray.get_runtime_context().get_node_id()
    assert silent_raylets({here, "f" * 56}, timeout_s=1.0) == set()
