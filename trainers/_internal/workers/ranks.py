"""Rank assignment: workers on one node get consecutive ranks (a pure function, tested alone)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Ranks:
    """A worker's ranks."""

    world_rank: int
    local_rank: int
    node_rank: int
    local_world_size: int


def assign_ranks(
    node_ids: list[str], first_node: str | None = None, node_order: list[str] | None = None
) -> list[Ranks]:
    """Ranks for workers placed on ``node_ids`` (one entry per worker, in start order).

    Nodes in ``node_order`` come first (TPU hosts, slice by slice), then ``first_node`` (usually
    the driver's), then the others by their first worker; within a node workers keep their start
    order. So local ranks are 0..k-1 and a node's world ranks consecutive, as torch's launchers promise.
    """
    first = [first_node] if first_node in node_ids else []
    order = list(dict.fromkeys([*(node for node in node_order or [] if node in node_ids), *first, *node_ids]))
    sorted_workers = sorted(range(len(node_ids)), key=lambda i: (order.index(node_ids[i]), i))
    per_node = {node: node_ids.count(node) for node in order}
    result: list[Ranks | None] = [None] * len(node_ids)
    seen: dict[str, int] = {}
    for world_rank, worker in enumerate(sorted_workers):
        node = node_ids[worker]
        local_rank = seen.get(node, 0)
        seen[node] = local_rank + 1
        result[worker] = Ranks(world_rank, local_rank, order.index(node), per_node[node])
    return [r for r in result if r is not None]
