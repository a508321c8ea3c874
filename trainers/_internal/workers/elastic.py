"""How many workers an elastic run (``ScalingConfig(num_workers=(min, max))``) trains with
(docs/scaling-out.md, "Elastic training"): each attempt as many as the cluster's free resources
hold, once ``min_workers`` fit; while it trains, every ``elastic_resize_monitor_interval_s``,
whether more would fit beside what the attempt holds, for the controller to restart it larger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from trainers._internal.ray_private import available_resources_per_node, draining_nodes
from trainers._internal.workers.resources import bundles_that_fit, format_resources, label_matches
from trainers.config import ScalingConfig
from trainers.tuning import RELEASE_WAIT_S, WAIT_POLL_S

logger = logging.getLogger(__name__)

#: Node id -> resource name -> amount.
NodeResources = dict[str, dict[str, float]]


def free_per_node() -> NodeResources:
    """Free resources of every live node that is not being drained (a draining node takes no new
    workers), by node id."""
    import ray

    draining = set(draining_nodes())
    alive = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
    available = available_resources_per_node()
    return {node: dict(available.get(node, {})) for node in alive - draining}


def _node_labels() -> dict[str, dict[str, str]]:
    import ray

    return {node["NodeID"]: dict(node.get("Labels") or {}) for node in ray.nodes() if node.get("Alive")}


def count_workers(scaling: ScalingConfig, nodes: NodeResources, labels: dict[str, dict[str, str]] | None = None) -> int:
    """How many of ``scaling``'s workers ``nodes`` hold together, placed by its placement
    strategy, at most ``max_workers``; ``labels`` (node id -> labels): only on nodes a worker's
    label selector accepts."""
    bundle = scaling.worker_resources
    if not any(amount > 0 for amount in bundle.values()):
        return scaling.max_workers  # workers that need nothing fit anywhere
    selectors = scaling.label_selector_per_worker(scaling.max_workers) or []
    if selectors and labels is not None:
        nodes = {
            node: free
            for node, free in nodes.items()
            if any(label_matches(selector, labels.get(node, {})) for selector in selectors)
        }
    per_node = [bundles_that_fit(free, bundle) for free in nodes.values()]
    strategy = scaling.placement_strategy
    if strategy == "STRICT_PACK":
        fits = max(per_node, default=0)
    elif strategy == "STRICT_SPREAD":
        fits = sum(1 for k in per_node if k >= 1)
    else:
        fits = sum(per_node)
    fits = min(fits, scaling.max_workers)
    per_slice = scaling.tpu_workers_per_slice
    return fits - fits % per_slice if per_slice else fits  # TPU workers come in whole slices


def add(nodes: NodeResources, held: NodeResources) -> NodeResources:
    """``nodes`` plus what ``held`` holds on each of them (nodes not in ``nodes`` are gone)."""
    total = {node: dict(free) for node, free in nodes.items()}
    for node, amounts in held.items():
        if node in total:
            for name, amount in amounts.items():
                total[node][name] = total[node].get(name, 0.0) + amount
    return total


class ElasticSizer:
    """Decides the size of each attempt of an elastic run, and when a running one should grow.
    ``free`` (free resources per node) and ``labels`` (each node's) are parameters for tests."""

    def __init__(
        self,
        scaling: ScalingConfig,
        *,
        free: Callable[[], NodeResources] = free_per_node,
        labels: Callable[[], dict[str, dict[str, str]]] | None = _node_labels,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not scaling.elasticity_enabled:
            raise ValueError(f"ScalingConfig.num_workers={scaling.num_workers!r} is not a (min, max) range.")
        self.scaling = scaling
        self.free = free
        self.labels = labels
        self.clock = clock
        self._last_check = float("-inf")

    def _count(self, held: NodeResources | None = None) -> int:
        nodes = add(self.free(), held) if held else self.free()
        labels = self.labels() if self.labels is not None and self.scaling.label_selector else None
        return count_workers(self.scaling, nodes, labels)

    def size_to_start(self, deadline: float) -> int:
        """The size of the next attempt: as many workers as fit now, at most ``max_workers``.
        While fewer than ``min_workers`` fit, waits (saying so in a log line) until ``deadline``,
        then returns the fewer that fit (the caller fails)."""
        waiting = False
        while True:
            size, now = self._count(), self.clock()
            if size >= self.scaling.min_workers or now >= deadline:
                return size
            if not waiting:
                waiting = True
                logger.warning(
                    "Waiting up to %g s for the cluster to hold min_workers=%d worker(s) x %s of "
                    "ScalingConfig(num_workers=%r): it has room for %d now. The run starts once they "
                    "fit (nodes joining, other work ending).",
                    deadline - now,
                    self.scaling.min_workers,
                    format_resources(self.scaling.worker_resources),
                    self.scaling.num_workers,
                    size,
                )
            time.sleep(WAIT_POLL_S)

    def resize_to(self, current: int, held: NodeResources, started_at: float) -> int | None:
        """The larger size a running attempt of ``current`` workers should restart at, or None.
        Counts at most once per ``elastic_resize_monitor_interval_s`` (since the attempt's start or
        the last count), over the free resources plus ``held``, what its own workers hold per node."""
        now = self.clock()
        if now - max(started_at, self._last_check) < self.scaling.elastic_resize_monitor_interval_s:
            return None
        self._last_check = now
        size = self._count(held)
        return size if size > current else None


def wait_released(held: NodeResources, timeout_s: float = RELEASE_WAIT_S) -> None:
    """Wait (at most ``timeout_s``) until Ray's resource view shows what a stopped group ``held``
    as free again on the nodes still there, so the next attempt's count includes it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        free = free_per_node()
        if all(
            free[node].get(name, 0.0) + 1e-9 >= amount
            for node, amounts in held.items()
            if node in free
            for name, amount in amounts.items()
        ):
            return
        time.sleep(0.05)
