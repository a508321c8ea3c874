"""How a run's ranks fared while they trained, as run.json keeps it: each rank's peak memory
(``storage.memory_peak``, a module apart since every worker sends it) and every straggler
episode. Typed records written and read by ``storage.codec``; the workers measure and the
controller judges (``trainers/_internal/health/rank_health.py``,
``trainers/_internal/health/stragglers.py``); these are only what travels and is kept."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from storage.codec import Record, Round4, Round6
from storage.figures import number, seconds, share
from storage.filesystem import write_bytes
from storage.memory_peak import MemoryPeak

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from storage.layout import RunLayout


@dataclasses.dataclass(frozen=True)
class StragglerRecord(Record):
    """One episode of a rank training persistently slower than the others: named once, when it has
    been slower for ``steps`` reports in a row."""

    attempt: int
    rank: int
    #: The Ray node the rank runs on (its id), and its address when known.
    node: str
    #: The report (of this attempt) at which the rank was named.
    report_index: int
    #: Reports in a row the rank was slower for when it was named.
    steps: int
    #: Its step time over the median rank's, the median of those ``steps`` reports.
    ratio: float
    #: Its median step time and the median rank's, in seconds, over those reports.
    step_s: float
    median_step_s: float

    def describe(self) -> str:
        """One line, e.g. "rank 3 on node X: 1.8x the median step (0.41 s against 0.23 s) for 20 steps"."""
        return (
            f"rank {self.rank} on node {self.node}: {number(self.ratio)}x the median step "
            f"({seconds(self.step_s)} s against {seconds(self.median_step_s)} s) for {self.steps} steps"
        )


#: A run whose ranks waited for data at least this share of their training time (the waits
#: included) is input-bound: the data pipeline, not the model, sets its pace.
INPUT_BOUND_SHARE = 0.2


@dataclasses.dataclass(frozen=True)
class GoodputAccount(Record):
    """Where one ``fit()`` call's wall time went (from its controller's start to its end). The
    parts add up to ``wall_s``: training is what moved the model forward; the rest is the cost of
    starting, waiting for data, checkpoints, failures and the run's end."""

    wall_s: Round6
    #: The first attempt's workers starting (placement, processes, the backend), until they train.
    starting_s: Round6
    #: Training that counted: every step kept, less the time blocked on checkpoints and waiting for data.
    training_s: Round6
    #: Ranks blocked uploading checkpoints (``CheckpointUploadMode.SYNC``; the slowest rank's).
    checkpoint_s: Round6
    #: From a failure, preemption or resize until the next attempt trained (drain, stop, start).
    restarting_s: Round6
    #: Training since the latest committed checkpoint that a failure or resize threw away: those
    #: steps were trained again.
    rolled_back_s: Round6
    #: The run's end: the workers finishing (or a failed run's last moments).
    waiting_s: Round6
    #: Workers held over the wall time, and their GPUs (``ScalingConfig``'s GPUs per worker).
    worker_hours: Round6
    gpu_hours: Round6
    #: Ranks waiting for their next batch, timed on each rank around its dataset shards' and
    #: prepared loaders' iterators (each round's slowest rank's wait; 0 in accounts written
    #: before flowtrain measured it).
    data_wait_s: Round6 = 0.0

    @property
    def goodput(self) -> float:
        """The share of the wall time that trained the model (0 to 1)."""
        return self.training_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def input_bound(self) -> bool:
        """Whether the ranks waited for data at least ``INPUT_BOUND_SHARE`` of their training time."""
        return self.data_wait_s > 0 and self.data_wait_s >= INPUT_BOUND_SHARE * (self.training_s + self.data_wait_s)

    @property
    def parts(self) -> dict[str, float]:
        """The parts of the wall time by name, in seconds."""
        return {
            "starting": self.starting_s,
            "training": self.training_s,
            "waiting for data": self.data_wait_s,
            "checkpoints": self.checkpoint_s,
            "restarting": self.restarting_s,
            "rolled back": self.rolled_back_s,
            "waiting": self.waiting_s,
        }

    def describe(self) -> str:
        """One line, e.g. "goodput 81%: 40.2 s of 49.6 s trained; starting 5.1 s, ..." (figures as
        ``storage.figures`` writes them), ending with ``input_bound_note`` for an input-bound run."""
        others = ", ".join(f"{name} {seconds(s)} s" for name, s in self.parts.items() if name != "training")
        line = f"goodput {share(self.goodput)}: {seconds(self.training_s)} s of {seconds(self.wall_s)} s trained"
        return f"{line}; {others}; {self.held()}" + (f"; {self.input_bound_note()}" if self.input_bound else "")

    def held(self) -> str:
        """The workers held: "0.02031 worker-hours", with the GPU-hours when there were GPUs."""
        gpus = f", {number(self.gpu_hours)} GPU-hours" if self.gpu_hours else ""
        return f"{number(self.worker_hours)} worker-hours{gpus}"

    def input_bound_note(self) -> str:
        """What an input-bound run's account says of it: "input-bound: the ranks waited for ... 40% of ..."."""
        waited = share(self.data_wait_s / (self.training_s + self.data_wait_s))
        return f"input-bound: the ranks waited for their next batch {waited} of their training time"


@dataclasses.dataclass(frozen=True)
class PreflightRecord(Record):
    """The pre-flight check of one ``fit()`` call: how long it took, each worker's compute rate,
    the group's all-reduce bus bandwidth (None without a process group), and the network interface
    each worker's collectives use."""

    seconds: Round4
    #: GFLOP/s of each worker's matrix-multiply probe, by world rank.
    gflops: tuple[Round4, ...]
    bus_gbps: float | None = None
    #: By world rank: the interface gloo/NCCL use (``GLOO_SOCKET_IFNAME``), "" where none was set.
    interfaces: tuple[str, ...] = ()

    def describe(self) -> str:
        rates = f"{min(self.gflops):.3g}-{max(self.gflops):.3g} GFLOP/s per worker" if self.gflops else "no worker"
        bus = f", all-reduce {self.bus_gbps:.3g} GB/s bus bandwidth" if self.bus_gbps is not None else ""
        names = sorted(set(self.interfaces) - {""})
        over = f", collectives over {', '.join(names)}" if names else ""
        return f"pre-flight check passed in {seconds(self.seconds)} s: {rates}{bus}{over}"


@dataclasses.dataclass(frozen=True)
class RunHealth:
    """How a run's ranks fared, as ``Result.health`` gives it (flowtrain's own; Ray Train's
    ``Result`` has no such attribute)."""

    #: Each rank's peak memory over the run, by world rank (None: not reported).
    peak_memory: tuple[MemoryPeak | None, ...] = ()
    #: Every straggler episode, oldest first.
    stragglers: tuple[StragglerRecord, ...] = ()
    #: The goodput account of each ``fit()`` call on the run (a driver rerun adds one), oldest first.
    goodput: tuple[GoodputAccount, ...] = ()
    #: The pre-flight check of each ``fit()`` call that ran one, oldest first.
    preflight: tuple[PreflightRecord, ...] = ()


@dataclasses.dataclass(frozen=True)
class TimelineRound(Record):
    """One committed report round on the timeline: when (seconds since the ``fit()`` call's
    controller started), which, and each rank's step (None: not measured)."""

    JSON_AS_LIST = True  # thousands of rounds: [t, attempt, index, checkpoint, steps]

    t: float
    attempt: int
    index: int
    checkpoint: bool
    steps: tuple[float | None, ...]


@dataclasses.dataclass(frozen=True)
class TimelineMark(Record):
    """Something that happened to one rank: ``what`` is a failure's kind ("died", "error", ...) or
    "straggler"."""

    t: float
    attempt: int
    rank: int
    what: str


@dataclasses.dataclass(frozen=True)
class Timeline(Record):
    """What a ``fit()`` call's timeline picture is drawn from (``.health/timeline-attemptNNNN.json``
    in the run folder): the phases, the rounds, failures and stragglers, in seconds since the
    controller started."""

    run_name: str
    world_size: int
    #: (phase, start, end): "starting", "training", "restarting" or "waiting".
    phases: tuple[tuple[str, float, float], ...]
    #: (start, end) of the training a failure or resize threw away.
    rolled_back: tuple[tuple[float, float], ...]
    rounds: tuple[TimelineRound, ...]
    marks: tuple[TimelineMark, ...]

    @property
    def first_attempt(self) -> int:
        return min((r.attempt for r in self.rounds), default=0)

    @property
    def notable(self) -> bool:
        """Whether there is something to look at: a restart, a failure or a straggler."""
        return bool(self.marks) or any(phase == "restarting" for phase, _, _ in self.phases)


def write_health_file(filesystem: pafs.FileSystem, layout: RunLayout, name: str, data: bytes) -> str:
    """Write ``data`` as the file ``name`` of the run's ``.health/`` folder (made when missing);
    return its path there. The one writer of that folder: the driver's timeline and picture, a
    worker's memory summary."""
    filesystem.create_dir(layout.health_path(""), recursive=True)
    path = layout.health_path(name)
    write_bytes(filesystem, path, data)
    return path
