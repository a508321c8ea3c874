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
    #: Seconds a fault of this kind may add to its run's wall time on the soak on hosts (beside its
    #: own ``hold_s``): what today's code needs, with room for a loaded machine (``chaos_hosts``).
    allow_s: float = 45.0


#: A host kind: struck by the soak on hosts, on the host of a rank (or the path between it and
#: the driver's host); only ``benchmarks.chaos --hosts`` injects them.
HOST = "host"


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
        Kind(
            "link-blip",
            HOST,
            allow_s=30.0,
            about="a rank's host's link cut at the switch, healed after 0.2-0.8x the detection bound",
        ),
        Kind(
            "link-cut",
            HOST,
            restarts=1,
            allow_s=45.0,
            about="a rank's host's link cut at the switch, healed after 1.5-4x the detection bound",
        ),
        Kind(
            "partition",
            HOST,
            restarts=1,
            about="a rank's host's link cut until its ranks are replaced, then healed; Ray started there again",
        ),
        Kind(
            "host-kill",
            HOST,
            restarts=1,
            about="a rank's host cut off and every process on it killed (a power loss); Ray started there again",
        ),
        # Its rank's worker is found dead at once, and its node's raylet takes no connection: the
        # replacement is placed away from the node Ray has not declared dead yet.
        Kind(
            "raylet-kill",
            HOST,
            restarts=1,
            about="SIGKILL of a rank's host's raylet; Ray started there again once its ranks are replaced",
        ),
        Kind(
            "link-slow",
            HOST,
            allow_s=45.0,
            about="50-300 ms added to everything a rank's host sends, for 5-20 s",
        ),
        Kind(
            "link-lossy",
            HOST,
            allow_s=45.0,
            about="1-10% of what a rank's host sends dropped, for 5-20 s",
        ),
        Kind(
            "driver-cut",
            HOST,
            restarts=1,
            about="the path between the driver's host and a rank's host cut until its ranks are replaced",
        ),
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
    #: Seconds the soak waits after the step before it strikes (driver-kill, node-loss, the host
    #: kinds), or a slow write's hold; frames let through first (event faults).
    detail: float = 0.0
    #: Host kinds: how long the fault lasts before it is undone (0: until the run has replaced
    #: the ranks it struck, or has ended).
    hold_s: float = 0.0
    #: Host kinds: the added delay in seconds (link-slow) or the share of frames dropped (link-lossy).
    amount: float = 0.0


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
    "road" (the event road's faults and the driver kill) or "kill" (the worker and node kills,
    the loop's exception and the host kinds: each ends an attempt, and its workers with it, or
    holds a host's traffic up).

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
    detect_s: float = 5.0,
) -> list[RunPlan]:
    """``num_faults`` faults of ``kinds`` (each kind in turn, in a seeded order, so a short
    schedule covers them all), at most ``per_run`` to a run, at seeded steps at least two apart,
    but for a host kind, which a third of the time strikes at the step of a host fault before it
    in its run (together: the soak strikes them at once). Runs of each ``group`` take turns, the
    road's first. ``detect_s``: the detection bound a host link's cut is drawn shorter or longer
    than (``_hold``)."""
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
            by = KINDS[name].by
            if KINDS[name].on_checkpoint:
                domain = checkpoints[:-1]
            else:  # the soak strikes a little after the step it waits for: leave it steps to strike in
                domain = list(range(1, steps - (SOAK_LAG_STEPS if by in ("soak", HOST) else 1)))
            free = [s for s in domain if all(abs(s - t) >= 2 for t in taken)] or domain
            together = [f.step for f in faults if KINDS[f.kind].by == HOST]
            step = rng.choice(together) if by == HOST and together and rng.random() < 1 / 3 else rng.choice(free)
            taken.append(step)
            faults.append(
                Fault(
                    id=next_id,
                    kind=name,
                    step=step,
                    rank=rng.randrange(world_size),
                    side=_side(name, rng),
                    detail=_detail(name, rng),
                    hold_s=_hold(name, rng, detect_s),
                    amount=_amount(name, rng),
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
    if kind in ("driver-kill", "node-loss") or KINDS[kind].by == HOST:
        return round(rng.uniform(0.0, 0.2), 3)
    if kind == "storage-slow":
        return round(rng.uniform(1.0, 2.0), 3)
    if kind.startswith("event-"):
        return float(rng.randrange(2))
    return 0.0


def _hold(kind: str, rng: random.Random, detect_s: float) -> float:
    """How long a host fault lasts: a blip shorter than the detection bound, a cut longer, a slow
    or lossy link 5-20 s; 0 (until the run replaced the ranks struck) for the rest."""
    if kind == "link-blip":
        return round(rng.uniform(0.2, 0.8) * detect_s, 2)
    if kind == "link-cut":
        return round(rng.uniform(1.5, 4.0) * detect_s, 2)
    if kind in ("link-slow", "link-lossy"):
        return round(rng.uniform(5.0, 20.0), 2)
    return 0.0


def _amount(kind: str, rng: random.Random) -> float:
    if kind == "link-slow":
        return round(rng.uniform(0.05, 0.3), 3)
    if kind == "link-lossy":
        return round(rng.uniform(0.01, 0.1), 3)
    return 0.0
