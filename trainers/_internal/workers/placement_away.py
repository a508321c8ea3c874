"""Hosts the run stopped hearing, and bundles of a worker group reserved again away from them.

A silent or dead rank may have lost its process or its host; one TCP connect from the driver to
the node's raylet tells which (``silent_raylets``). Ray keeps a lost node alive for up to a minute
(its health checks), and with it the group's bundles there: a replacement put in one never starts.
Its bundle therefore moves (``MovedBundles``): into a slot an earlier move emptied, else into a
one-bundle placement group of its own kept off the lost nodes (``off_nodes``); the group's own
bundle stays reserved (Ray cannot shrink a placement group) until the run ends.
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

from trainers._internal.workers.resources import NODE_ID_LABEL, WORKER_GROUP_PREFIX


def off_nodes(node_ids: set[str] | frozenset[str]) -> dict[str, str]:
    """The label selector that keeps a bundle off the Ray nodes ``node_ids``."""
    return {NODE_ID_LABEL: f"!in({','.join(sorted(node_ids))})"}


def silent_raylets(node_ids: set[str], timeout_s: float) -> set[str]:
    """Those of Ray nodes ``node_ids`` whose raylet takes no TCP connection within ``timeout_s``
    (not those Ray does not know or has declared dead: Ray places their bundles again)."""
    silent = set()
    for node in ray.nodes():
        if node["NodeID"] in node_ids and node.get("Alive"):
            try:
                address = (node["NodeManagerAddress"], node["NodeManagerPort"])
                socket.create_connection(address, timeout=timeout_s).close()
            except OSError:  # refused (the raylet is gone) or no answer (the host is cut off)
                silent.add(node["NodeID"])
    return silent


def wait_for_bundles(group: PlacementGroup, bundles: list[int], deadline: float) -> bool:
    """Whether ``group``'s ``bundles`` are placed by ``deadline``. While Ray places a lost node's
    bundles again the group as a whole is not ready (forever, when a bundle moved away took their
    room), yet its placed bundles take workers."""
    while not group.wait(timeout_seconds=min(1.0, max(0.0, deadline - time.monotonic()))):
        slots = placement_group_table(group).get("bundles_to_node_id") or {}
        if all(slots.get(bundle) for bundle in bundles):  # an unplaced bundle's node is ""
            return True
        if time.monotonic() >= deadline:
            return False
    return True


class MovedBundles:
    """The group's bundles placed elsewhere: bundle index -> (placement group, its bundle index
    there, node)."""

    def __init__(self) -> None:
        self._moved: dict[int, tuple[PlacementGroup, int, str]] = {}
        #: The one-bundle placement groups this made (removed with their bundle's move).
        self._own: dict[int, PlacementGroup] = {}

    def move(
        self,
        bundles: list[int],
        group: PlacementGroup,
        slots: dict[int, str],
        resources: dict[str, float],
        avoid: set[str],
        selectors: list[dict[str, str]] | None,
        deadline: float,
    ) -> list[int]:
        """Place each of ``bundles`` again, on a node not in ``avoid`` and matching its label
        selector (``selectors``, by bundle index, as ``group`` was reserved); ``slots``: where
        each of ``group``'s bundles is (bundle -> node). Returns the bundles that could not be
        placed by ``deadline`` (nothing is held for them), nor were placed again in ``group``."""
        for bundle in bundles:
            self.release(bundle)
        taken = {index for pg, index, _ in self._moved.values() if pg is group}
        empty = {
            slot: node
            for slot, node in slots.items()
            if slot in self._moved and slot not in taken and node and node not in avoid
        }
        off = off_nodes(avoid)
        reserved = {}
        for bundle in bundles:
            selector = selectors[bundle] if selectors else {}
            slot = next((s for s in empty if not selectors or selectors[s] == selector), None)
            if slot is not None:
                self._moved[bundle] = (group, slot, empty.pop(slot))
                continue
            reserved[bundle] = placement_group(
                [dict(resources)],
                name=f"{WORKER_GROUP_PREFIX}moved-{uuid.uuid4().hex[:8]}",
                bundle_label_selector=[{**selector, **off}],
            )
        missing = []
        for bundle, own in reserved.items():
            while True:
                placed = own.wait(timeout_seconds=min(1.0, max(0.0, deadline - time.monotonic())))
                # Ray declared the lost node dead meanwhile and placed the group's own bundle again (its slot
                # lent to no other move), maybe in the very room this waits for: the bundle stays in the group.
                again = None if placed else placement_group_table(group)["bundles_to_node_id"].get(bundle)
                back = bool(again) and again not in avoid and bundle not in taken
                if placed or back or time.monotonic() >= deadline:
                    break
            if placed:
                self._moved[bundle] = (own, 0, placement_group_table(own)["bundles_to_node_id"][0])
                self._own[bundle] = own
            else:
                remove_placement_group(own)
                if not back:
                    missing.append(bundle)
        return missing

    def nodes(self) -> dict[int, str]:
        """Where each moved bundle is now."""
        return {bundle: node for bundle, (_, _, node) in self._moved.items()}

    def placement(self, bundle: int) -> tuple[PlacementGroup, int] | None:
        """The placement group and bundle index a worker of ``bundle`` runs in, when it moved."""
        moved = self._moved.get(bundle)
        return (moved[0], moved[1]) if moved is not None else None

    def release(self, bundle: int | None = None) -> None:
        """Give back the placement of ``bundle`` (every moved bundle's when None)."""
        for index in [bundle] if bundle is not None else list(self._moved):
            self._moved.pop(index, None)
            own = self._own.pop(index, None)
            if own is not None:
                with contextlib.suppress(Exception):  # Ray shutting down: the reservation goes with it
                    remove_placement_group(own)
