"""The chaos soak's fault kinds and its seeded schedule: which fault strikes which run, at which
step, on which rank. Pure functions: the same seed gives the same schedule on any machine."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of fault and how the soak injects it."""

    name: str
    #: Who injects it: "loop" (the training loop, in a worker), "storage" (the soak's storage
    #: wrapper, in a worker or the driver), "road" (the event channel's fault hook, in the
    #: driver), "soak" (the soak itself: it kills the driver or removes a node).
    by: str
    #: Whether it strikes a checkpoint report (its step must be one that checkpoints).
    on_checkpoint: bool = False
    #: Restarts of the worker group it may cost (its run must not restart more).
    restarts: int = 0
    #: Whether the run's fit() ends with it: "killed" (the driver), "failed" (a permanent
    #: storage error fails the run), or "" (the run goes on).
    ends: str = ""
    #: What it is, for the table.
    about: str = ""
    #: Left out unless named in ``--kinds``: it breaks a promise flowtrain does not keep yet.
    opt_in: bool = False


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind("kill-step", "loop", restarts=1, about="SIGKILL of a worker between its optimizer step and report()"),
        Kind("kill-collective", "loop", restarts=1, about="SIGKILL of a worker waiting in DDP's all-reduce"),
        Kind("raise", "loop", restarts=1, about="the training loop raises on one rank before its report()"),
        Kind("kill-report", "storage", True, restarts=1, about="SIGKILL inside report(): files staged, event not sent"),
        Kind("kill-write", "storage", True, restarts=1, about="SIGKILL half way through writing a checkpoint file"),
        Kind(
            "driver-kill", "soak", ends="killed", about="SIGKILL of the driver, then a rerun of the same name at once"
        ),
        Kind("node-loss", "soak", restarts=1, about="the node of one rank removed, a new node added"),
        Kind("event-drop", "road", about="a rank's event connection closed by the controller"),
        Kind("event-half-open", "road", about="a rank's event connection left open but never read again"),
        Kind("storage-transient", "storage", True, about="two failed writes of a checkpoint file (upload or commit)"),
        Kind("storage-slow", "storage", True, about="a checkpoint file's write (upload or commit) held 1-2 s"),
        Kind(
            "storage-permanent",
            "storage",
            True,
            ends="failed",
            about="writes denied from a checkpoint on, till fit() ends",
        ),
        Kind("snapshot-transient", "storage", True, about="one failed write of run.json, a checkpoint's commit point"),
    )
}

#: Steps a run may take between the one the soak waits for and its strike (it polls the driver's
#: journal and waits a seeded moment), so the soak's faults are planned this far from the end.
SOAK_LAG_STEPS = 12

#: Kinds that need the soak's storage wrapper; a run without them uses the storage as it is.
WRAPPED = frozenset(name for name, kind in KINDS.items() if kind.by == "storage")


@dataclasses.dataclass(frozen=True)
class Fault:
    """One planned fault."""

    id: int
    kind: str
    #: The step whose report (or, for the soak's kinds, whose commit) it follows or strikes.
    step: int
    #: The rank it strikes (ignored by the soak's kinds: a driver has no rank, and the node
    #: removed is the one not hosting the head).
    rank: int
    #: "worker" or "driver": whose storage write a storage fault strikes (upload or commit).
    side: str = "worker"
    #: Seconds the soak waits after the step before it strikes (driver-kill, node-loss), or a
    #: slow write's hold; frames let through first (event faults).
    detail: float = 0.0


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """One training run (one name) and the faults planned for it, in step order."""

    name: str
    #: Whether its storage goes through the soak's wrapper (needed by the storage kinds; the
    #: others run on the storage as it is: on local disk, its atomic-rename commit).
    wrapped: bool
    faults: tuple[Fault, ...]


def checkpoint_steps(steps: int, every: int) -> list[int]:
    """The steps whose report carries a checkpoint: every ``every``-th, and the last."""
    return sorted({s for s in range(steps) if s % every == every - 1} | {steps - 1})


def group(kind: str, *, overlap: bool) -> str:
    """Which runs a fault of ``kind`` goes to: "storage" (those needing the storage wrapper),
    "road" (the event road's faults and the driver kill) or "kill" (the worker and node kills and
    the loop's exception: each ends an attempt, and its workers with it).

    The road's faults and the worker kills never share a run unless ``overlap``: their steps
    are milliseconds apart, and a worker whose attempt ends while its connection is broken,
    before it noticed, takes the reports it has not had acknowledged with it (an acknowledged
    road cannot keep what a dead process held). With ``overlap`` they share runs ("plain").
    """
    if kind in WRAPPED:
        return "storage"
    if overlap:
        return "plain"
    return "road" if kind.startswith("event-") or kind == "driver-kill" else "kill"


def make_schedule(
    num_faults: int,
    seed: int,
    kinds: Sequence[str],
    *,
    steps: int,
    every: int,
    per_run: int,
    world_size: int = 2,
    overlap: bool = False,
) -> list[RunPlan]:
    """``num_faults`` faults of ``kinds`` (each kind in turn, in a seeded order, so a short
    schedule covers them all), at most ``per_run`` to a run, at seeded steps at least two apart.
    Runs of each ``group`` take turns, the road's first."""
    rng = random.Random(seed)
    order = list(kinds)
    sequence: list[str] = []
    while len(sequence) < num_faults:
        rng.shuffle(order)
        sequence.extend(order)
    sequence = sequence[:num_faults]
    groups = [
        [k for k in sequence if group(k, overlap=overlap) == name] for name in ("road", "plain", "kill", "storage")
    ]
    chunks = [_chunk(members, per_run, world_size) for members in groups]
    interleaved = [chunk for turn in itertools.zip_longest(*chunks) for chunk in turn if chunk]
    plans, next_id = [], 0
    checkpoints = checkpoint_steps(steps, every)
    for index, chunk in enumerate(interleaved):
        faults = []
        taken: list[int] = []
        for name in chunk:
            if KINDS[name].on_checkpoint:
                domain = checkpoints[:-1]
            else:  # the soak strikes a little after the step it waits for: leave it steps to strike in
                domain = list(range(1, steps - (SOAK_LAG_STEPS if KINDS[name].by == "soak" else 1)))
            free = [s for s in domain if all(abs(s - t) >= 2 for t in taken)] or domain
            step = rng.choice(free)
            taken.append(step)
            faults.append(
                Fault(
                    id=next_id,
                    kind=name,
                    step=step,
                    rank=rng.randrange(world_size),
                    side=_side(name, rng),
                    detail=_detail(name, rng),
                )
            )
            next_id += 1
        faults = _place_road_faults(
            sorted(faults, key=lambda f: (f.step, f.id)), rng, world_size, half_open_last=not overlap
        )
        plans.append(
            RunPlan(name=f"run-{index:02d}", wrapped=any(f.kind in WRAPPED for f in faults), faults=tuple(faults))
        )
    return plans


def _chunk(kinds: list[str], per_run: int, world_size: int) -> list[list[str]]:
    """A group's faults in runs of at most ``per_run``, with at most one event-road fault per
    rank and one half-open connection among them.

    After an event-road fault a rank sends the rest of its attempt's events over Ray, so a second
    fault on its connection cannot fire; and a half-open connection holds the run's commits for
    the channel's ``ACK_TIMEOUT_S`` (15 s), by when the workers have trained to the end, so no
    fault planned after it finds a step left to strike (``_place_road_faults`` puts it last).
    """
    chunks: list[list[str]] = [[]]
    for kind in kinds:
        current = chunks[-1]
        road = [k for k in current if k.startswith("event-")]
        full = len(current) == per_run or (
            kind.startswith("event-") and (len(road) == world_size or (kind == "event-half-open" and kind in road))
        )
        if full:
            chunks.append([])
        chunks[-1].append(kind)
    return [chunk for chunk in chunks if chunk]


def _place_road_faults(
    faults: list[Fault], rng: random.Random, world_size: int, *, half_open_last: bool
) -> list[Fault]:
    """``faults`` (in step order) with the event-road faults on distinct ranks and, with
    ``half_open_last``, a half-open connection moved to the last step (see ``_chunk``; with
    ``overlap`` the faults after it are what it is to meet)."""
    half_open = next((i for i, f in enumerate(faults) if f.kind == "event-half-open"), None)
    if half_open_last and half_open is not None and half_open != len(faults) - 1:
        last, moved = faults[-1], faults[half_open]
        faults[half_open], faults[-1] = (
            dataclasses.replace(last, step=moved.step),
            dataclasses.replace(moved, step=last.step),
        )
    road = [i for i, f in enumerate(faults) if f.kind.startswith("event-")]
    for i, rank in zip(road, rng.sample(range(world_size), len(road)), strict=True):
        faults[i] = dataclasses.replace(faults[i], rank=rank)
    return faults


def _side(kind: str, rng: random.Random) -> str:
    if kind in ("storage-transient", "storage-slow", "storage-permanent"):
        return rng.choice(("worker", "driver"))
    return "driver" if kind == "snapshot-transient" else "worker"


def _detail(kind: str, rng: random.Random) -> float:
    if kind in ("driver-kill", "node-loss"):
        return round(rng.uniform(0.0, 0.2), 3)
    if kind == "storage-slow":
        return round(rng.uniform(1.0, 2.0), 3)
    if kind.startswith("event-"):
        return float(rng.randrange(2))
    return 0.0
