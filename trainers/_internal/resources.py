"""Can the cluster ever give this run its workers? Answered before anything is reserved."""

from __future__ import annotations

import math

from trainers.config import ScalingConfig
from trainers.errors import InsufficientResourcesError


def _fmt(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


def bundles_that_fit(node: dict[str, float], bundle: dict[str, float]) -> int:
    """How many copies of ``bundle`` fit on a node with ``node`` resources."""
    counts = [math.floor(node.get(name, 0.0) / amount + 1e-9) for name, amount in bundle.items() if amount > 0]
    return min(counts) if counts else 0


def check_feasible(scaling: ScalingConfig, nodes: list[dict[str, float]]) -> None:
    """Raise ``InsufficientResourcesError`` when ``nodes`` (each node's total resources) can never
    hold ``scaling.num_workers`` workers placed by ``scaling.placement_strategy``.

    Only total capacity counts here: resources busy now are free later. The message lists what was
    requested and what the cluster has, and what to change.
    """
    bundle = scaling.worker_resources
    n = scaling.num_workers
    total: dict[str, float] = {}
    for node in nodes:
        for name, amount in node.items():
            total[name] = total.get(name, 0.0) + amount
    shown = {name: total.get(name, 0.0) for name in sorted(set(bundle) | {"CPU", "GPU"})}
    request = f"{n} workers x {_fmt(bundle)} = {_fmt(scaling.total_resources)}"
    have = f"the cluster has {_fmt(shown)} on {len(nodes)} node(s)"
    fix = "Lower ScalingConfig.num_workers or resources_per_worker, or add nodes (RAY_ADDRESS)."

    unknown = [name for name in bundle if total.get(name, 0) <= 0]
    if unknown:
        raise InsufficientResourcesError(
            f"ScalingConfig asks for {request}, but no node has {', '.join(repr(u) for u in unknown)}; "
            f"{have}. {fix}"
        )
    per_node = [bundles_that_fit(node, bundle) for node in nodes]
    strategy = scaling.placement_strategy
    if strategy == "STRICT_PACK":
        fits = any(bundles_that_fit(node, scaling.total_resources) >= 1 for node in nodes) if n else True
        why = "STRICT_PACK needs every worker on one node"
    elif strategy == "STRICT_SPREAD":
        fits = sum(1 for k in per_node if k >= 1) >= n
        why = "STRICT_SPREAD needs one node per worker"
    else:
        fits = sum(per_node) >= n
        why = "the workers cannot be packed onto the nodes"
    if not fits:
        raise InsufficientResourcesError(f"ScalingConfig asks for {request}, but {have} ({why}). {fix}")


def cluster_nodes() -> list[dict[str, float]]:
    """Total resources of every live node of the connected Ray cluster."""
    import ray

    return [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]
