"""Can the cluster ever give this run its workers? Answered before anything is reserved."""

from __future__ import annotations

import dataclasses
import math
import warnings

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


def leave_cpu_for_data(scaling: ScalingConfig, nodes: list[dict[str, float]]) -> ScalingConfig:
    """Make room for the Ray Data pipeline beside the training workers.

    Ray Data's read and map tasks need a CPU each; when the workers hold every CPU, those tasks
    never run and training waits forever. With the default one CPU per worker, the workers here
    get a fraction of a CPU instead (a warning says so), which leaves one whole CPU to the
    pipeline; when you set the workers' CPUs yourself and none is left, this fails at once
    saying what to change.
    """
    total_cpu = sum(node.get("CPU", 0.0) for node in nodes)
    workers_cpu = scaling.worker_resources.get("CPU", 0.0) * scaling.num_workers
    if total_cpu - workers_cpu >= 1 or scaling.num_workers == 0:
        return scaling
    user_set = "CPU" in (scaling.resources_per_worker or {})
    per_worker = math.floor((total_cpu - 1) / scaling.num_workers * 100) / 100
    if user_set or per_worker <= 0:
        raise InsufficientResourcesError(
            f"Ray Data needs at least 1 CPU beside the training workers, but {scaling.num_workers} workers "
            f"take {workers_cpu:g} of the cluster's {total_cpu:g} CPUs, so the data pipeline would never run. "
            "Leave one free: lower ScalingConfig.num_workers or resources_per_worker['CPU'] "
            "(fractions such as 0.5 are fine), or add CPUs."
        )
    warnings.warn(
        f"Giving each of the {scaling.num_workers} training workers {per_worker:g} CPU (not 1) so that Ray Data "
        f"keeps 1 of the cluster's {total_cpu:g} CPUs for its pipeline; set ScalingConfig.resources_per_worker "
        "to choose yourself.",
        stacklevel=3,
    )
    resources = {**(scaling.resources_per_worker or {}), "CPU": per_worker}
    return dataclasses.replace(scaling, resources_per_worker=resources)


def enclosing_placement_group(scaling: ScalingConfig) -> tuple[object, int] | None:
    """The placement group this process places its children in, and the bundle of worker 0.

    A Ray Tune trial runs in a placement group that captures its children (Tune sets
    ``placement_group_capture_child_tasks``), built by ``trainers.tune.trial_resources``: the
    trial's own bundle first, then one bundle per worker. Reserving a second group of our own
    there would count every worker twice and can wait forever on a full cluster, so the workers
    take the last ``num_workers`` bundles of the trial's group instead. Returns None when this
    process captures into no group (the usual case: the workers get a group of their own).
    Raises ``InsufficientResourcesError`` before any worker starts when the group cannot hold them.
    """
    import ray
    from ray.util.placement_group import get_current_placement_group

    if not ray.get_runtime_context().should_capture_child_tasks_in_placement_group:
        return None
    group = get_current_placement_group()
    if group is None:
        return None
    bundles = [dict(b) for b in group.bundle_specs]
    n = scaling.num_workers
    worker = scaling.worker_resources
    first = len(bundles) - n
    # A process that holds resources sits in a bundle of its own (Tune uses the first one);
    # one that holds none (an empty trial bundle) takes no bundle, so every bundle can be a worker's.
    own = 1 if any(ray.get_runtime_context().get_assigned_resources().values()) else 0
    small = [i for i, b in enumerate(bundles[max(first, 0):], start=max(first, 0)) if bundles_that_fit(b, worker) < 1]
    if first < own or small:
        raise InsufficientResourcesError(
            f"This trainer runs inside a placement group (a Ray Tune trial) with bundles {[_fmt(b) for b in bundles]}, "
            f"which cannot hold ScalingConfig's {n} workers x {_fmt(worker)} (one bundle each, after the trial's own). "
            "Give the trial its resources with trainers.tune.with_resources(fn, scaling_config) "
            "(or trainers.tune.trial_resources(scaling_config)), passing the same ScalingConfig the trainer uses."
        )
    return group, first
