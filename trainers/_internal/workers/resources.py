"""Can the cluster ever give this run its workers? Answered before anything is reserved."""

from __future__ import annotations

import collections
import dataclasses
import math
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING

from trainers.config import ScalingConfig
from trainers.errors import InsufficientResourcesError

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup


def format_resources(resources: Mapping[str, float]) -> str:
    """``{CPU: 2, GPU: 1}``: resources as every message shows them."""
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


def bundles_that_fit(node: dict[str, float], bundle: dict[str, float]) -> int:
    """How many copies of ``bundle`` fit on a node with ``node`` resources."""
    counts = [math.floor(node.get(name, 0.0) / amount + 1e-9) for name, amount in bundle.items() if amount > 0]
    return min(counts) if counts else 0


def check_feasible(scaling: ScalingConfig, nodes: list[dict[str, float]], *, held: str = "") -> None:
    """Raise ``InsufficientResourcesError`` (saying what was asked, what the cluster has and what to
    change) when ``nodes`` (each node's total resources) can never hold ``scaling``'s workers.

    Only total capacity counts: busy resources free up later. An elastic run waits for nodes to
    join, so it fails only when no node of a shape the cluster has could hold one of its workers.
    ``held`` says what ``nodes`` already leave out (e.g. the Tune trial this runs in).
    """
    may_grow = scaling.elasticity_enabled
    elastic = f" (min_workers of num_workers={scaling.num_workers!r})" if may_grow else ""
    if may_grow:
        # An elastic run can start once min_workers fit; that is what must be possible.
        scaling = scaling.with_num_workers(scaling.min_workers)
    bundle = scaling.worker_resources
    n = scaling.max_workers  # a fixed size by now: num_workers, or an elastic run's min_workers
    total = {name: sum(node.get(name, 0.0) for node in nodes) for name in set().union(*nodes)}
    shown = {name: total.get(name, 0.0) for name in sorted(set(bundle) | {"CPU", "GPU"})}
    request = f"{n} workers{elastic} x {format_resources(bundle)} = {format_resources(scaling.total_resources)}"
    have = f"the cluster has {format_resources(shown)} on {len(nodes)} node(s){held}"
    fix = "Lower ScalingConfig.num_workers or resources_per_worker, or add nodes (RAY_ADDRESS)."

    unknown = [name for name in bundle if total.get(name, 0) <= 0]
    if unknown:
        raise InsufficientResourcesError(
            f"ScalingConfig asks for {request}, but no node has {', '.join(repr(u) for u in unknown)}; {have}. {fix}"
        )
    per_node = [bundles_that_fit(node, bundle) for node in nodes]
    if scaling.placement_strategy == "STRICT_PACK":
        fits = any(bundles_that_fit(node, scaling.total_resources) >= 1 for node in nodes) if n else True
        why = "STRICT_PACK needs every worker on one node"
    elif may_grow:
        fits = any(k >= 1 for k in per_node)
        why = "no node holds one worker, so no node that joins with the same resources would either"
    elif scaling.placement_strategy == "STRICT_SPREAD":
        fits = sum(1 for k in per_node if k >= 1) >= n
        why = "STRICT_SPREAD needs one node per worker"
    else:
        fits = sum(per_node) >= n
        why = "the workers cannot be packed onto the nodes"
    if not fits:
        raise InsufficientResourcesError(f"ScalingConfig asks for {request}, but {have} ({why}). {fix}")


def cluster_nodes() -> list[dict[str, float]]:
    """Total resources of every live node of the connected Ray cluster."""
    return list(_live_nodes().values())


def leave_cpu_for_data(scaling: ScalingConfig, nodes: list[dict[str, float]]) -> ScalingConfig:
    """Make room for the Ray Data pipeline beside the training workers.

    Ray Data's tasks need a CPU each; when the workers hold every CPU, training waits forever. With
    the default one CPU per worker, the workers get a fraction instead (with a warning), leaving one
    CPU to the pipeline; when you set the workers' CPUs yourself and none is left, this fails at once.
    """
    total_cpu = sum(node.get("CPU", 0.0) for node in nodes)
    num_workers = scaling.max_workers  # an elastic run may grow to max_workers: leave the CPU beside them too
    workers_cpu = scaling.worker_resources.get("CPU", 0.0) * num_workers
    if total_cpu - workers_cpu >= 1 or num_workers == 0:
        return scaling
    user_set = "CPU" in (scaling.resources_per_worker or {})
    per_worker = math.floor((total_cpu - 1) / num_workers * 100) / 100
    if user_set or per_worker <= 0:
        raise InsufficientResourcesError(
            f"Ray Data needs at least 1 CPU beside the training workers, but {num_workers} workers "
            f"take {workers_cpu:g} of the cluster's {total_cpu:g} CPUs, so the data pipeline would never run. "
            "Leave one free: lower ScalingConfig.num_workers or resources_per_worker['CPU'] "
            "(fractions such as 0.5 are fine), or add CPUs."
        )
    warnings.warn(
        f"Giving each of the {num_workers} training workers {per_worker:g} CPU (not 1) so that Ray Data "
        f"keeps 1 of the cluster's {total_cpu:g} CPUs for its pipeline; set ScalingConfig.resources_per_worker "
        "to choose yourself.",
        stacklevel=3,
    )
    resources = {**(scaling.resources_per_worker or {}), "CPU": per_worker}
    return dataclasses.replace(scaling, resources_per_worker=resources)


def enclosing_placement_group(scaling: ScalingConfig) -> tuple[PlacementGroup, int] | None:
    """The placement group this process places its children in, and the bundle of worker 0.

    A Ray Tune trial's group captures its children. When ``trainers.tune.trial_resources`` built
    it (the trial's bundle, then one per worker), the workers take the last ``num_workers``
    bundles: a second group would count every worker twice. None when nothing is captured, or the
    group holds only the trial's process (``tune.with_resources(fn, {"CPU": 1})``): the workers then
    get a group of their own, as in Ray Train. Raises ``InsufficientResourcesError`` when the
    group's worker bundles cannot hold the workers.
    """
    import ray

    group = capturing_placement_group()
    if group is None:
        return None
    bundles = [dict(b) for b in group.bundle_specs]
    n = scaling.max_workers  # an elastic run inside a trial trains at max_workers (see RayWorkers)
    worker = scaling.worker_resources
    first = len(bundles) - n
    # A process that holds resources sits in a bundle of its own (Tune uses the first one);
    # one that holds none (an empty trial bundle) takes no bundle, so every bundle can be a worker's.
    own = 1 if any(ray.get_runtime_context().get_assigned_resources().values()) else 0
    if len(bundles) <= own:
        return None  # the trial reserved only its own process (tune.with_resources(fn, {"CPU": 1})): a group of our own
    small = [i for i, b in enumerate(bundles[max(first, 0) :], start=max(first, 0)) if bundles_that_fit(b, worker) < 1]
    if first < own or small:
        raise InsufficientResourcesError(
            f"This trainer runs inside a placement group (a Ray Tune trial) with bundles {[format_resources(b) for b in bundles]}, "
            f"which cannot hold ScalingConfig's {n} workers x {format_resources(worker)} (one bundle each, after the trial's own). "
            "Give the trial its resources with trainers.tune.with_resources(fn, scaling_config) "
            "(or trainers.tune.trial_resources(scaling_config)), passing the same ScalingConfig the trainer uses."
        )
    return group, first


def capturing_placement_group() -> PlacementGroup | None:
    """The placement group this process's children would be placed in (a Tune trial's), or None."""
    import ray
    from ray.util.placement_group import get_current_placement_group

    if not ray.get_runtime_context().should_capture_child_tasks_in_placement_group:
        return None
    return get_current_placement_group()


#: The name prefix of the placement groups trainers reserve for their workers.
WORKER_GROUP_PREFIX = "flowtrain-workers-"


def _live_nodes() -> dict[str, dict[str, float]]:
    import ray

    return {node["NodeID"]: dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")}


def _take(nodes: dict[str, dict[str, float]], table: dict) -> dict[str, float]:
    """Subtract one placement group's bundles from the nodes they sit on; return what it holds."""
    where = table.get("bundles_to_node_id") or {}
    held: dict[str, float] = {}
    for index, bundle in (table.get("bundles") or {}).items():
        node = nodes.get(where.get(index, ""))
        for name, amount in bundle.items():
            held[name] = held.get(name, 0.0) + amount
            if node is not None:
                node[name] = max(0.0, node.get(name, 0.0) - amount)
    return held


def nodes_beside(group: PlacementGroup) -> tuple[list[dict[str, float]], str]:
    """Every live node's total resources less what ``group`` (a Tune trial's, reserved while it
    runs) holds on it: all a worker group beside it can ever use; and a note saying so, for errors."""
    from ray.util import placement_group_table

    nodes = _live_nodes()
    held = _take(nodes, placement_group_table(group))
    return list(nodes.values()), f" beside the {format_resources(held)} this Tune trial holds for itself"


def stuck_beside_other_groups(scaling: ScalingConfig, own: PlacementGroup) -> str | None:
    """Why ``scaling``'s workers (group ``own``, still pending) can never be placed, or None.

    They can when some trainer's worker group is placed (it frees its resources when done), or when
    they fit beside every other group (the rest is tasks and actors, which end). Otherwise groups
    such as other Tune trials' hold the resources and themselves wait for workers: nobody moves.
    """
    from ray.util import placement_group_table

    nodes = _live_nodes()
    held: collections.Counter[str] = collections.Counter()
    others = 0
    for group_id, table in placement_group_table().items():
        if table.get("state") != "CREATED" or group_id == own.id.hex():
            continue
        if str(table.get("name", "")).startswith(WORKER_GROUP_PREFIX):
            return None
        others += 1
        held.update(_take(nodes, table))
    try:
        check_feasible(scaling, list(nodes.values()))
    except InsufficientResourcesError:
        return f"{others} other placement group(s) (Tune trials' own included) hold {format_resources(held)} and no trainer is training"
    return None


# -- label selectors ------------------------------------------------------------------------------

#: The label every Ray node carries with its own id (left out of messages: it says nothing new).
NODE_ID_LABEL = "ray.io/node-id"


def label_matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Whether a node with ``labels`` satisfies ``selector``, read as Ray's scheduler reads it:
    ``"v"`` (the label is v), ``"!v"`` (it is not v, or absent), ``"in(a,b)"`` (one of them) and
    ``"!in(a,b)"`` (none of them, or absent)."""
    for key, wanted in selector.items():
        negated = wanted.startswith("!")
        text = wanted[1:] if negated else wanted
        values = {v.strip() for v in text[3:-1].split(",")} if text.startswith("in(") and text.endswith(")") else {text}
        inside = key in labels and labels[key] in values
        if inside == negated:
            return False
    return True


def _user_labels(node: dict) -> dict[str, str]:
    return {k: v for k, v in sorted((node.get("Labels") or {}).items()) if k != NODE_ID_LABEL}


def check_label_selector(scaling: ScalingConfig, nodes: list[dict] | None = None) -> None:
    """Raise ``InsufficientResourcesError`` when ``ScalingConfig.label_selector`` leaves some worker
    no live node, or too few for the workers that need it: each distinct selector is checked with
    its workers over the nodes it matches (``check_feasible``). ``nodes``: ``ray.nodes()`` by default.
    """
    selectors = scaling.label_selector_per_worker(scaling.min_workers)
    if not selectors:
        return
    if nodes is None:
        import ray

        nodes = ray.nodes()
    live = [node for node in nodes if node.get("Alive")]
    groups: dict[str, tuple[dict[str, str], list[int]]] = {}
    for rank, selector in enumerate(selectors):
        groups.setdefault(repr(sorted(selector.items())), (selector, []))[1].append(rank)
    for selector, workers in groups.values():
        matching = [node for node in live if label_matches(selector, node.get("Labels") or {})]
        who = "every worker" if len(workers) == len(selectors) else f"worker(s) {', '.join(map(str, workers))}"
        if not matching:
            described = "; ".join(
                f"node {node['NodeID'][:8]} ({node.get('NodeManagerAddress', '?')}) has {_user_labels(node)}"
                for node in live
            )
            raise InsufficientResourcesError(
                f"ScalingConfig.label_selector {selector!r} (for {who}) matches none of the cluster's {len(live)} "
                f"live node(s): {described}. Start nodes with those labels (ray start --labels=...), or change "
                "label_selector."
            )
        # An elastic run keeps its range: matching nodes may still join.
        count = (len(workers), scaling.max_workers) if scaling.elasticity_enabled else len(workers)
        check_feasible(
            dataclasses.replace(scaling, num_workers=count, label_selector=None),
            [dict(node["Resources"]) for node in matching],
            held=f" matching label_selector {selector!r}",
        )
