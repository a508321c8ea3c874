"""Whether a worker group's processes may serve again, and if not, why: the one home of that rule.

Processes are reused, reset first (``fresh_process``), within a run (a failed attempt's survivors
serve the next, ``FLOWTRAIN_REPLACE_RANKS``) and between runs (a clean run's CPU workers are parked
for the next ``fit()`` of the same shape, ``warm_workers``). ``refusal`` answers for a group, in the
driver; ``process_refusal`` for one process, in the worker (run.json: ``restarts``, ``workers_parked``).
"""

from __future__ import annotations

import dataclasses
import enum
import sys

from storage import settings

#: Libraries that remember, for the life of the process, the distributed setup they first saw
#: (DeepSpeed's communication backend, Accelerate's shared state, Lightning's and Transformers'
#: environment): a process that loaded one is not reused.
KEEPS_PROCESS_STATE = ("deepspeed", "accelerate", "lightning", "pytorch_lightning", "transformers", "torch_xla")

#: The resources a worker may reserve and still be parked between runs.
PARKABLE_RESOURCES = frozenset({"CPU", "memory"})


class Reuse(enum.Enum):
    """The two ways a group's processes serve again."""

    #: Survivors of a failed attempt serve the next attempt of the same run.
    WITHIN_RUN = "within a run"
    #: A clean run's workers are parked for the next ``fit()`` of the same shape.
    BETWEEN_RUNS = "between runs"


@dataclasses.dataclass(frozen=True)
class GroupFacts:
    """What decides whether one attempt's worker group can be reused."""

    #: The backend set ``Backend.reuses_workers``: its ``on_start`` can set up again in a process
    #: that ran it before (torch, and the plain data-parallel backend).
    backend_reuses: bool
    #: The backend's name, for the reason.
    backend_name: str
    #: ``ScalingConfig.num_workers=(min, max)``: each attempt is sized anew (the run's config says
    #: so; an attempt's group has a fixed size).
    elastic: bool = False
    #: The workers hold whole TPU slices (``SlicePlacementGroup``).
    tpu_slices: bool = False
    #: The group runs in, or beside, a Ray Tune trial's placement group (the trial's process ends
    #: with the trial, and parked workers would outlive it).
    in_tune_trial: bool = False
    #: Each worker's resources.
    resources: tuple[str, ...] = ("CPU",)


def refusal(facts: GroupFacts, reuse: Reuse) -> str | None:
    """Why the group described by ``facts`` cannot be reused ``reuse``-wise, or None when it can.

    Workers reusable between runs start beside their placement group, holding no resources, so
    they can outlive it (and have spares, ``FLOWTRAIN_SPARE_WORKERS``); a clean run then parks
    them unless ``FLOWTRAIN_KEEP_WORKERS_S`` is 0."""
    if not facts.backend_reuses:
        return (
            f"the {facts.backend_name} backend has not declared that it can set up again in a process that ran it "
            "(Backend.reuses_workers)"
        )
    if facts.tpu_slices:
        return "the workers hold whole TPU slices"
    if reuse is Reuse.WITHIN_RUN:
        if not settings.REPLACE_RANKS.read():
            return f"{settings.REPLACE_RANKS.name}=0"
        if facts.elastic:
            return "an elastic run sizes each attempt by what fits then"
        return None
    if facts.in_tune_trial:
        return "the workers run in a Ray Tune trial, whose resources end with the trial"
    held = sorted(set(facts.resources) - PARKABLE_RESOURCES)
    return f"the workers hold {', '.join(held)}, which a parked process could not give back" if held else None


def process_refusal() -> str | None:
    """Run in a worker: why this process cannot serve again, or None."""
    loaded = [name for name in KEEPS_PROCESS_STATE if name in sys.modules]
    return f"it loaded {', '.join(loaded)}, which keep process-wide distributed state" if loaded else None
