"""The chaos soak's conductor: a two-node Ray on this machine, the storage, and the runs.

Each run of the schedule is trained by a driver in a process of its own
(``benchmarks.chaos_driver``), so the soak can SIGKILL it and rerun the same name at once; the
soak also removes the node of one rank and adds a new one. The other faults strike from inside
the run (the loop, the storage wrapper, the event channel's hook), each once. Every segment (one
driver's ``fit()``) is checked when it ends, against the fault-free run of the same loop.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import pyarrow.fs as pafs

from benchmarks import chaos_check, chaos_journal, chaos_storage
from benchmarks.chaos_check import Reference, Segment
from benchmarks.chaos_schedule import KINDS, RunPlan

ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Settings:
    """How the soak runs (the command line's options)."""

    storage: str = "local"
    seed: int = 0
    steps: int = 48
    every: int = 4
    #: Seconds each step of the loop sleeps, as real work would take (see ``chaos_loop``).
    pace_s: float = 0.02
    num_to_keep: int = 2
    world_size: int = 2
    #: A segment's deadline: this many seconds, plus the fault-free run's time (which says how
    #: fast this machine is now) times two plus one per fault planned in its run (three for a
    #: fault that restarts the group; see ``Soak.deadline_s``).
    deadline_s: float = 30.0
    #: A defect of the soak's own to plant: "lose-file" (``chaos_storage.ChaosFS``) or "lost-events"
    #: (``chaos_road.ConnectionFaults``).
    plant: str | None = None
    #: How long a worker waits for the event road's acknowledgement, in the drivers (None: 15 s).
    ack_timeout_s: float | None = None


class Nemesis(Protocol):
    """What strikes the faults the soak injects itself (not the loop, storage or road) during
    one segment of a run, as its driver commits."""

    def step(self, lines: list[dict[str, Any]]) -> bool:
        """Strike what the segment's journal ``lines`` so far make due; True: kill the driver now."""
        ...

    def close(self) -> None:
        """The segment ended: undo what is still in force, before its invariants are checked."""
        ...


class NodeLoss:
    """The soak's kinds on one machine, one at a time in step order: a driver kill, or the node
    of a rank removed (``Soak.lose_node``), once the run has committed the fault's step."""

    def __init__(self, soak: Soak, plan: RunPlan, marks: str, already: set[int]) -> None:
        self.soak = soak
        self.marks = marks
        self.ours = [f for f in plan.faults if KINDS[f.kind].by == "soak" and f.id not in already]

    def step(self, lines: list[dict[str, Any]]) -> bool:
        top = max((line["step"] for line in lines if line["e"] == "commit"), default=-1)
        if self.ours and top >= self.ours[0].step:
            fault = self.ours.pop(0)
            time.sleep(fault.detail)
            chaos_journal.fire(self.marks, fault.id)
            if fault.kind == "driver-kill":
                return True
            self.soak.lose_node()
        return False

    def close(self) -> None:
        pass


@dataclasses.dataclass
class RunReport:
    """What became of one run: its segments and the invariants each broke."""

    plan: RunPlan
    segments: list[tuple[Segment, list[str]]] = dataclasses.field(default_factory=list)
    #: Each fired fault's cost in wall time (``chaos_check.time_lost``), by fault id.
    lost: dict[int, float | None] = dataclasses.field(default_factory=dict)
    #: Each restart of the run with the kind of the fault that caused it (``chaos_check.restart_causes``).
    restarts: list[tuple[str | None, dict]] = dataclasses.field(default_factory=list)

    @property
    def broken(self) -> list[str]:
        return [line for _, lines in self.segments for line in lines]


class Soak:
    """The cluster and storage every run of one soak uses (a context manager)."""

    def __init__(self, settings: Settings, work: str, say: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.work = pathlib.Path(work)
        self.say = say
        self.cluster: Any = None
        self.spare: Any = None
        self._stack: list[Any] = []
        self.endpoint: str | None = None
        self.inner: pafs.FileSystem = pafs.LocalFileSystem()
        #: Seconds the fault-free run took (driver start to end); the unit of the deadlines.
        self.unit_s = 300.0
        #: Seconds between two of its commits (the median), what a step costs without faults.
        self.step_s = 0.0

    def __enter__(self) -> Soak:
        import ray
        from ray.cluster_utils import Cluster

        os.environ.update(RAY_USAGE_STATS_ENABLED="0", DO_NOT_TRACK="1")
        # Ray's workers start with the raylets' environment: they must import benchmarks.chaos_loop.
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        if self.settings.storage == "s3":
            moto = chaos_storage.moto_s3()
            self.inner, self.endpoint = moto.__enter__()
            self._stack.append(moto)
        # Two nodes of one CPU each: each rank on its own node, so removing the second loses a rank.
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        self.spare = self.cluster.add_node(num_cpus=1)
        ray.init(address=self.cluster.address, log_to_driver=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        import ray

        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
        for context in reversed(self._stack):
            context.__exit__(None, None, None)

    # -- where a run lives -----------------------------------------------------------------------

    def storage_path(self) -> str:
        return f"s3://{chaos_storage.BUCKET}/runs" if self.settings.storage == "s3" else str(self.work / "storage")

    def run_path(self, name: str) -> str:
        """The run folder inside ``self.inner`` (the storage without the wrapper)."""
        return (
            f"{chaos_storage.BUCKET}/runs/{name}"
            if self.settings.storage == "s3"
            else str(self.work / "storage" / name)
        )

    # -- runs ------------------------------------------------------------------------------------

    def reference(self) -> Reference:
        """Train the loop once without faults; what every run must end up reporting."""
        from trainers import Result

        report = self.run(RunPlan(name="reference", wrapped=False, faults=()), None)
        if report.broken:
            raise RuntimeError(f"the fault-free run failed: {report.broken}")
        history = Result.from_path(self.run_path("reference"), self.inner).metrics_dataframe.to_dict("records")
        segment = report.segments[-1][0]
        outcome = segment.outcome
        self.unit_s = segment.seconds
        self.step_s = chaos_check.step_seconds(segment.journal)
        return Reference(
            weights={int(r["step"]): r["weights"] for r in history},
            loss={int(r["step"]): r["loss"] for r in history},
            final=outcome["return_value"]["weights"],
        )

    def run(self, plan: RunPlan, reference: Reference | None) -> RunReport:
        """Train ``plan``'s run to its end through as many segments as its faults make."""
        folder = self.work / plan.name
        for sub in ("logs", "marks"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        report = RunReport(plan)
        exempt: set[int] = set()
        for index in range(1 + sum(1 for f in plan.faults if KINDS[f.kind].ends)):
            segment = self._segment(plan, index, folder, exempt)
            broken = self._check(plan, segment, folder, reference)
            report.segments.append((segment, broken))
            fired = ", ".join(f"{f.kind}@{f.step}" for f in segment.fired) or "none"
            self.say(
                f"  {plan.name} segment {index}: {segment.ended} in {segment.seconds:.1f} s; fired: {fired}; broken: {len(broken)}"
            )
            for line in broken:
                self.say(f"    BROKEN {line}")
            (folder / "marks" / chaos_storage.DENIED).unlink(missing_ok=True)  # the storage recovers once fit() ended
            if segment.ended not in ("killed", "failed") or broken and segment.ended == "failed":
                break  # the run finished, or it broke in a way a rerun would not mend
        fired = [f for segment, _ in report.segments for f in segment.fired]
        journal = chaos_journal.read(str(folder / "driver.jsonl"))
        report.lost = chaos_check.time_lost(fired, str(folder / "marks"), journal, self.step_s)
        report.restarts = chaos_check.restart_causes(fired, str(folder / "marks"), journal)
        if report.segments and reference is not None:
            late = self.run_checks(plan, report)
            report.segments[-1][1].extend(late)
            for line in late:
                self.say(f"    BROKEN {line}")
        return report

    def run_checks(self, plan: RunPlan, report: RunReport) -> list[str]:
        """Invariants of a whole run, checked once its last segment ended (none here)."""
        return []

    def _segment(self, plan: RunPlan, index: int, folder: pathlib.Path, exempt: set[int]) -> Segment:
        settings = self.settings
        marks, driver_log = str(folder / "marks"), str(folder / "driver.jsonl")
        faults = [dataclasses.asdict(f) for f in plan.faults]
        spec = {
            "name": plan.name,
            "storage": {
                "kind": settings.storage,
                "wrapped": plan.wrapped or settings.plant == "lose-file",
                "path": self.storage_path(),
                "endpoint": self.endpoint,
            },
            "marks": marks,
            "faults": faults,
            "plant": settings.plant,
            "ack_timeout_s": settings.ack_timeout_s,
            "driver_log": driver_log,
            "outcome": str(folder / f"outcome-{index}.json"),
            "num_workers": settings.world_size,
            "num_to_keep": settings.num_to_keep,
            "loop": {
                "seed": settings.seed,
                "steps": settings.steps,
                "every": settings.every,
                "pace_s": settings.pace_s,
                "log_dir": str(folder / "logs"),
                "marks": marks,
                "faults": faults,
            },
        }
        spec_path = folder / f"spec-{index}.json"
        spec_path.write_text(json.dumps(spec))
        already = {f.id for f in plan.faults if chaos_journal.fired(marks, f.id)}
        skip = len(chaos_journal.read(driver_log))
        nemesis = self.nemesis(plan, folder, already)
        deadline_s = self.deadline_s(plan)
        env = {**os.environ, "RAY_ADDRESS": self.ray_address}
        start, start_t = time.monotonic(), time.time()
        with open(folder / f"driver-{index}.log", "w") as output:  # the driver keeps its own copy of the handle
            driver = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.chaos_driver", str(spec_path)],
                cwd=ROOT,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        ended, progress, seen, hung = None, start, 0, ""
        try:
            while driver.poll() is None:
                lines = chaos_journal.read(driver_log)[skip:]
                if len(lines) > seen:
                    progress, seen = time.monotonic(), len(lines)
                stall_s = self.stall_for(plan)
                if time.monotonic() - start > deadline_s or time.monotonic() - progress > stall_s:
                    ended = "deadline"
                    hung = (
                        f"ran past its deadline of {deadline_s:.0f} s"
                        if time.monotonic() - start > deadline_s
                        else f"committed nothing for {stall_s:.0f} s"
                    )
                    break
                if nemesis.step(lines):
                    ended = "killed"
                    break
                time.sleep(0.02)
        finally:
            if driver.poll() is None:
                driver.kill()
            driver.wait()
            nemesis.close()
        seconds = time.monotonic() - start
        outcome_path = folder / f"outcome-{index}.json"
        outcome = json.loads(outcome_path.read_text()) if outcome_path.exists() else None
        if ended is None:
            ended = outcome["status"] if outcome is not None else "crashed"
        if ended in ("killed", "deadline", "failed"):  # the driver died, or gave up the run, under its last attempt
            started = [
                line["attempt"]
                for r in range(settings.world_size)
                for line in chaos_journal.read(str(folder / "logs" / f"rank{r}.jsonl"))
            ]
            exempt.add(max(started, default=0))
        fired = [f for f in plan.faults if f.id not in already and chaos_journal.fired(marks, f.id)]
        tail = (folder / f"driver-{index}.log").read_text()[-1500:] if ended == "crashed" else hung
        journal = chaos_journal.read(driver_log)[skip:]
        return Segment(plan.name, index, ended, outcome, fired, journal, set(exempt), seconds, tail, start_t)

    @property
    def ray_address(self) -> str:
        """The address the drivers join Ray at."""
        return str(self.cluster.address)

    def nemesis(self, plan: RunPlan, folder: pathlib.Path, already: set[int]) -> Nemesis:
        """What strikes the soak's own kinds of ``plan`` in a segment (those not ``already`` fired)."""
        return NodeLoss(self, plan, str(folder / "marks"), already)

    def deadline_s(self, plan: RunPlan) -> float:
        """How long one segment of ``plan``'s run may take before it counts as hung.

        A fault that restarts the worker group costs a new group (and a node-loss a new node):
        on 2 loaded cores that took up to three fault-free runs, so it counts three units. A
        real hang is found sooner by ``stall_s``; this only bounds a run that keeps restarting.
        """
        units = sum(3 if KINDS[fault.kind].restarts else 1 for fault in plan.faults)
        return self.settings.deadline_s + self.unit_s * (2 + units)

    def stall_for(self, plan: RunPlan) -> float:
        """How long a segment of ``plan``'s run may go without a commit (``stall_s`` here)."""
        return self.stall_s

    @property
    def stall_s(self) -> float:
        """How long a segment may go without its driver committing anything (or restarting)
        before it counts as hung: time for a new driver, or a restart, twice over."""
        return self.settings.deadline_s + 2 * self.unit_s

    def lose_node(self) -> None:
        """Remove the node of one rank (the rank dies with it) and add a new one, which the
        restarted group needs: one CPU is left without it."""
        self.cluster.remove_node(self.spare)
        self.spare = self.cluster.add_node(num_cpus=1)

    def _check(self, plan: RunPlan, segment: Segment, folder: pathlib.Path, reference: Reference | None) -> list[str]:
        from trainers import Result

        settings = self.settings
        broken = chaos_check.ending(segment)
        rank_lines = [chaos_journal.read(str(folder / "logs" / f"rank{r}.jsonl")) for r in range(settings.world_size)]
        if segment.ended != "killed":  # a killed driver is rerun at once: its leftovers are counted after the rerun
            pids = [line["pid"] for lines in rank_lines for line in lines if line["e"] == "start"]
            broken += chaos_check.leaks(pids)
        if reference is None:
            return broken
        try:
            result = Result.from_path(self.run_path(plan.name), self.inner)
        except Exception as error:  # noqa: BLE001 - the run's folder itself is damaged
            return broken + [f"Result.from_path fails: {type(error).__name__}: {error}"]
        finished = segment.ended == "finished"
        broken += chaos_check.history(
            result, reference, steps=settings.steps, finished=finished, outcome=segment.outcome
        )
        broken += chaos_check.committed(result, chaos_journal.read(str(folder / "driver.jsonl")))
        journal = chaos_journal.read(str(folder / "driver.jsonl"))
        broken += chaos_check.lost_reports(
            rank_lines, journal, segment.exempt, self.exempt_rounds(plan, folder, journal, rank_lines)
        )
        broken += chaos_check.checkpoints(result, reference, settings.world_size)
        broken += chaos_check.retention(
            result,
            self.inner,
            self.run_path(plan.name),
            steps=settings.steps,
            every=settings.every,
            num_to_keep=settings.num_to_keep,
            tidy=finished,  # a killed driver, or storage that denies writes, may leave what the next fit() tidies
        )
        broken += chaos_check.restarts(segment)
        if finished and segment.outcome["return_value"]["weights"] != reference.final:
            broken.append("the final weights differ from the fault-free run's")
        return broken + self.extra_checks(result, journal, rank_lines)

    def exempt_rounds(
        self, plan: RunPlan, folder: pathlib.Path, journal: list[dict], rank_lines: list[list[dict]]
    ) -> set[tuple[int, int]]:
        """Rounds (attempt, step) whose reports a fault may have taken with it (none here)."""
        return set()

    def extra_checks(self, result: Any, journal: list[dict], rank_lines: list[list[dict]]) -> list[str]:
        """Invariants of a segment beside the ones every soak checks (none here)."""
        return []
