"""Why a worker group did not start, in words that name the nodes and the resources.

A group that cannot start shows up as a wait that runs out: the placement group stays pending
(resources busy or gone), or actors never answer (their node died, or their process cannot
start). These describe the cluster at that moment, so the error says where to look.
"""

from __future__ import annotations

from trainers._internal.ray_private import available_resources_per_node
from trainers._internal.workers.resources import format_resources


def _fmt(resources: dict[str, float]) -> str:
    # Ray's per-node and placement-group bookkeeping resources say nothing to the reader.
    hidden = ("node:", "bundle_group", "memory", "object_store_memory")
    return format_resources({k: v for k, v in resources.items() if not k.startswith(hidden) and "_group_" not in k})


def _nodes() -> dict[str, dict]:
    import ray

    return {node["NodeID"]: node for node in ray.nodes()}


def node_name(node_id: str, nodes: dict[str, dict] | None = None) -> str:
    """``node 1a2b3c4d (10.0.0.5)``, with ``, dead`` when Ray has marked it dead."""
    node = (nodes if nodes is not None else _nodes()).get(node_id)
    if node is None:
        return f"node {node_id[:8]} (gone)"
    dead = "" if node.get("Alive") else ", dead"
    return f"node {node_id[:8]} ({node.get('NodeManagerAddress', '?')}{dead})"


def describe_nodes() -> str:
    """Every live node with what it has free and in all: ``node 1a2b3c4d (10.0.0.5): free {CPU: 0.5} of {CPU: 2}``."""
    try:
        nodes = _nodes()
        available = available_resources_per_node()
    except Exception as error:  # noqa: BLE001 - a description must never hide the real failure
        return f"(the cluster's nodes could not be listed: {error})"
    lines = []
    for node_id, node in sorted(nodes.items()):
        if not node.get("Alive"):
            continue
        total = node.get("Resources") or {}
        free = {name: available.get(node_id, {}).get(name, 0.0) for name in total}
        lines.append(f"{node_name(node_id, nodes)}: free {_fmt(free)} of {_fmt(total)}")
    return "; ".join(lines) if lines else "no live nodes"


def describe_unstarted(
    placed: dict[int, str], bundles: list[int], silent: list[int], failed: dict[int, BaseException]
) -> str:
    """Which workers did not start and on which node: ``placed`` maps bundle index to the node it
    was reserved on (worker i sits in bundle ``bundles[i]``), ``silent`` lists the workers that
    never answered and ``failed`` maps workers whose actor died to the error."""
    try:
        nodes = _nodes()
    except Exception:  # noqa: BLE001
        nodes = {}

    def place(worker: int) -> str:
        node_id = placed.get(bundles[worker], "")
        return node_name(node_id, nodes) if node_id else "no node yet"

    by_place: dict[str, list[int]] = {}
    for worker in sorted(silent):
        by_place.setdefault(place(worker), []).append(bundles[worker])
    parts = [
        f"the worker(s) of bundle(s) {', '.join(map(str, workers))} on {where} never answered"
        for where, workers in by_place.items()
    ]
    for worker, error in sorted(failed.items()):
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        parts.append(f"the worker of bundle {bundles[worker]} on {place(worker)} died while starting: {cause}")
    return "; ".join(parts)
