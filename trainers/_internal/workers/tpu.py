"""Multi-host TPU slices, placed as Ray Train places them (with Ray's own ``ray.util.tpu``).

With ``ScalingConfig(use_tpu=True, topology=..., accelerator_type=...)`` a worker takes a whole
TPU host by default, and the workers fill whole slices, reserved through their head host's
``TPU-<pod type>-head`` resource. Ranks follow the slices (by slice name, then host); across
several slices JAX learns the layout from the ``MEGASCALE_*`` variables.
"""

from __future__ import annotations

import math
from typing import Any

#: Ray's node labels naming a TPU host's slice and its index in the slice.
SLICE_NAME_LABEL = "ray.io/tpu-slice-name"
WORKER_ID_LABEL = "ray.io/tpu-worker-id"


def num_slices(num_workers: int, workers_per_slice: int) -> int:
    """How many slices ``num_workers`` workers span."""
    return max(1, math.ceil(num_workers / workers_per_slice))


def reserve_slices(
    topology: str,
    accelerator_type: str,
    *,
    num_workers: int,
    workers_per_slice: int,
    resources: dict[str, float],
    strategy: str,
    name: str,
    timeout_s: float,
) -> Any:
    """Reserve the slices ``num_workers`` workers fill: a ``ray.util.tpu.SlicePlacementGroup``
    whose ``placement_group`` holds one bundle of ``resources`` per worker, slice after slice.
    Raises ``TimeoutError`` when no free slice head turns up within ``timeout_s``."""
    from ray.util.tpu import SlicePlacementGroup, get_tpu_version_from_type

    return SlicePlacementGroup(
        topology=topology,
        accelerator_version=get_tpu_version_from_type(accelerator_type),
        resources_per_bundle=dict(resources),
        strategy=strategy,
        name=name,
        num_slices=num_slices(num_workers, workers_per_slice),
        head_reservation_timeout_s=timeout_s,
    )


def host_order(node_ids: list[str], labels: dict[str, dict[str, str]]) -> list[str]:
    """``node_ids`` by slice name, then host index in the slice: the order of the workers' ranks,
    so each slice's workers have consecutive ranks and rank 0 is the first slice's head host."""

    def key(node: str) -> tuple[str, int]:
        node_labels = labels.get(node, {})
        worker_id = node_labels.get(WORKER_ID_LABEL, "")
        return node_labels.get(SLICE_NAME_LABEL, ""), int(worker_id) if worker_id.isdigit() else 0

    return sorted(dict.fromkeys(node_ids), key=key)


def multislice_env(coordinator_ip: str, world_rank: int, num_workers: int, workers_per_slice: int) -> dict[str, str]:
    """The ``MEGASCALE_*`` variables of rank ``world_rank`` (Ray's values: rank 0's address, the
    slice count and this rank's slice); none when the workers fill a single slice."""
    from ray.util.tpu import get_tpu_coordinator_env_vars

    slices = num_slices(num_workers, workers_per_slice)
    if slices == 1:
        return {}
    slice_id = min(world_rank // workers_per_slice, slices - 1)
    return get_tpu_coordinator_env_vars(coordinator_address=coordinator_ip, num_slices=slices, slice_id=slice_id)
