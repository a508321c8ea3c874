"""The chaos soak's invariants, checked when each segment of a run ends (a segment: one driver's
``fit()``, ended by itself, by a permanent storage error, by the soak killing the driver, or by
its deadline). Each check returns the invariants it found broken, one line each (none: it holds).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Collection
from typing import Any

import pyarrow.fs as pafs

from benchmarks import chaos_storage
from benchmarks.chaos_loop import score, state_file, weights_hash
from benchmarks.chaos_schedule import KINDS, Fault, checkpoint_steps
from storage.layout import HEALTH, METRICS, SNAPSHOT, SNAPSHOT_PREVIOUS


@dataclasses.dataclass(frozen=True)
class Reference:
    """The fault-free run of the same seeded loop: the weights hash and loss after each step."""

    weights: dict[int, str]
    loss: dict[int, float]
    final: str


@dataclasses.dataclass
class Segment:
    """One driver's ``fit()`` of a run, as the soak saw it end."""

    run: str
    index: int
    #: "finished", "failed" (fit() raised), "killed" (by the soak), "deadline", "crashed" (the
    #: driver exited without an outcome).
    ended: str
    outcome: dict[str, Any] | None
    #: The faults that fired while it ran.
    fired: list[Fault]
    #: The driver's journal lines of this segment.
    journal: list[dict[str, Any]]
    #: Attempts whose reports may be lost (the driver died under them).
    exempt: set[int]
    seconds: float = 0.0
    #: Why it hung, or the end of the driver's output when it crashed.
    tail: str = ""
    #: When its driver started (``time.time()``, as the journals' ``t``).
    started_t: float = 0.0


def ending(segment: Segment) -> list[str]:
    """Ended as its faults say: killed by a driver kill, failed with the injected denial after a
    permanent storage error, finished otherwise."""
    kinds = {f.kind for f in segment.fired}
    if segment.ended == "deadline":
        return [f"hung: {segment.tail}"]
    if segment.ended == "crashed":
        return [f"the driver exited without fit() returning or raising: {segment.tail}"]
    if segment.ended == "killed":
        return [] if "driver-kill" in kinds else ["the driver was killed, but no driver-kill fault fired"]
    if "storage-permanent" in kinds:
        if segment.ended != "failed":
            return ["a permanent storage error fired, yet fit() finished"]
        if not any(chaos_storage.PERMANENT in line for line in segment.outcome["error"]):
            return [
                f"fit() failed with the wrong error after a permanent storage error: {segment.outcome['error'][0][:300]}"
            ]
        return []
    if segment.ended == "failed":
        return [f"fit() failed: {' <- '.join(segment.outcome['error'])[:600]}"]
    return []


def history(result: Any, reference: Reference, *, steps: int, finished: bool, outcome: dict | None) -> list[str]:
    """Every committed round once, in order, as the fault-free run reported it; the Result that
    ``fit()`` returned agrees with ``Result.from_path``."""
    frame = result.metrics_dataframe
    rows = frame.to_dict("records") if len(frame) else []
    found = [int(row["step"]) for row in rows]
    broken = []
    if found != list(range(len(found))):
        repeated = sorted({s for s in found if found.count(s) > 1})
        broken.append(f"history: steps not each once in order (repeated {repeated}): {found}")
    if finished and len(found) != steps:
        broken.append(f"history: {len(found)} rounds after a finished run of {steps} steps")
    for row in rows:
        step = int(row["step"])
        if reference.weights.get(step) != row["weights"] or reference.loss.get(step) != row["loss"]:
            broken.append(f"history: step {step} reported other weights or loss than the fault-free run")
            break
    if outcome is not None and outcome.get("history") is not None:
        returned = [(int(r["step"]), r["weights"]) for r in outcome["history"]]
        if returned != [(int(r["step"]), r["weights"]) for r in rows]:
            broken.append("history: fit()'s Result.metrics_dataframe differs from Result.from_path's")
    return broken


def committed(result: Any, journal: list[dict[str, Any]]) -> list[str]:
    """Every round the driver committed with a checkpoint is in the history (restarts rewind
    only past the latest checkpoint)."""
    frame = result.metrics_dataframe
    present = set(int(s) for s in frame["step"]) if len(frame) else set()
    return [
        f"committed round lost: step {line['step']} of attempt {line['attempt']} ({line['checkpoint']}) is not in the history"
        for line in journal
        if line["e"] == "commit" and line["checkpoint"] is not None and line["step"] not in present
    ]


def lost_reports(
    rank_lines: list[list[dict[str, Any]]],
    journal: list[dict[str, Any]],
    exempt: set[int],
    exempt_rounds: Collection[tuple[int, int]] = (),
) -> list[str]:
    """No round whose ``report()`` returned on every rank went uncommitted (except in attempts
    the driver died under, and ``exempt_rounds``: (attempt, step) a rank's host took with it)."""
    returned: dict[tuple[int, int], int] = {}
    checkpointed = set()
    for lines in rank_lines:
        for line in lines:
            if line["e"] == "returned" and line["checkpoint"]:
                checkpointed.add((line["attempt"], line["step"]))
        for key in {(line["attempt"], line["step"]) for line in lines if line["e"] == "returned"}:
            returned[key] = returned.get(key, 0) + 1
    done = {(line["attempt"], line["step"]) for line in journal if line["e"] == "commit"}
    lost = sorted(
        key
        for key, count in returned.items()
        if count == len(rank_lines) and key not in done and key[0] not in exempt and key not in exempt_rounds
    )
    return [
        f"report lost: step {step}{' (with its checkpoint)' if (attempt, step) in checkpointed else ''} returned on every "
        f"rank in attempt {attempt} but was never committed"
        for attempt, step in lost
    ]


def checkpoints(result: Any, reference: Reference, world_size: int) -> list[str]:
    """Every kept checkpoint holds one file per rank, each loading the state of its own report."""
    import torch

    broken = []
    for checkpoint, metrics in result.best_checkpoints:
        step = metrics["step"]
        name = os.path.basename(checkpoint.path.rstrip("/"))
        entries = checkpoint.filesystem.get_file_info(pafs.FileSelector(checkpoint.path, allow_not_found=True))
        files = {e.base_name for e in entries if e.type == pafs.FileType.File} - {".committed"}
        wanted = {state_file(rank, step) for rank in range(world_size)}
        if files != wanted:
            broken.append(f"checkpoint {name} (step {step}) holds {sorted(files)}, not {sorted(wanted)}")
            continue
        with checkpoint.as_directory() as folder:
            for rank in range(world_size):
                try:
                    state = torch.load(os.path.join(folder, state_file(rank, step)))
                except Exception as error:  # noqa: BLE001 - a half-written file fails in many ways
                    broken.append(
                        f"checkpoint {name}: rank {rank}'s file does not load ({type(error).__name__}: {error})"
                    )
                    continue
                own = state.get("step") == step and state.get("weights") == metrics["weights"] == reference.weights.get(
                    step
                )
                if rank == 0 and own:
                    own = weights_hash(state["model"]) == metrics["weights"]
                if not own:
                    broken.append(
                        f"checkpoint {name}: rank {rank}'s file does not hold the state of step {step}'s report"
                    )
    return broken


def retention(
    result: Any, fs: pafs.FileSystem, run_path: str, *, steps: int, every: int, num_to_keep: int, tidy: bool
) -> list[str]:
    """The kept checkpoints are the best ``num_to_keep`` by score plus the latest; with ``tidy``
    (fit() has finished), the run folder holds nothing else: no orphaned folder, no ``.staging``,
    no lease.

    Without ``tidy`` (a driver killed, or storage that denies writes), the history may end with a
    checkpoint's report whose checkpoint was not committed: the metrics log is written before
    run.json, the commit point, and the driver died between the two (the next ``fit()`` rewinds
    past it). Then the kept ones are those of the checkpoints before it."""
    from storage.config import CheckpointConfig
    from storage.retention import select_kept

    frame = result.metrics_dataframe
    reported = [int(s) for s in frame["step"]] if len(frame) else []
    made = [s for s in checkpoint_steps(steps, every) if s in reported]
    config = CheckpointConfig(num_to_keep=num_to_keep, checkpoint_score_attribute="score")
    wanted = select_kept([(s, {"score": score(s)}) for s in made], config)
    kept = {int(metrics["step"]) for _, metrics in result.best_checkpoints}
    if not tidy and kept != wanted and made and reported[-1] == made[-1] and made[-1] not in kept:
        wanted = select_kept([(s, {"score": score(s)}) for s in made[:-1]], config)
    broken = []
    if kept != wanted:
        broken.append(f"retention: keeps the checkpoints of steps {sorted(kept)}, not {sorted(wanted)}")
    if tidy:
        names = {os.path.basename(c.path.rstrip("/")) for c, _ in result.best_checkpoints}
        entries = fs.get_file_info(pafs.FileSelector(run_path, allow_not_found=True))
        own = {SNAPSHOT, SNAPSHOT_PREVIOUS, HEALTH, METRICS}  # flowtrain's: run.json, the health and metrics folders
        extra = sorted(e.base_name for e in entries if e.base_name not in names | own)
        if extra:
            broken.append(
                f"retention: the run folder holds {extra} beside its kept checkpoints, run.json, .health/ and .metrics/"
            )
    return broken


def restarts(segment: Segment) -> list[str]:
    """No more restarts than the faults that fired can explain (a kill or a lost node: one each)."""
    made = [line for line in segment.journal if line["e"] == "restart"]
    allowed = sum(KINDS[f.kind].restarts for f in segment.fired)
    if len(made) <= allowed:
        return []
    why = "; ".join(f"{f['kind']} {f['type']}: {f['message'][:160]}" for line in made for f in line["failures"][:1])
    return [f"{len(made)} restarts, but the faults that fired explain {allowed}: {why}"]


def leaks(pids: list[int], timeout_s: float = 20.0) -> list[str]:
    """No worker actor, placement group or process of the run is left (teardown is asynchronous
    in Ray, so this waits up to ``timeout_s``)."""
    import ray
    from ray.util import placement_group_table

    deadline = time.monotonic() + timeout_s
    while True:
        actors = [
            a
            for a in ray._private.state.actors().values()
            if "TrainWorker" in a.get("ActorClassName", "") and a.get("State") != "DEAD"
        ]
        groups = [g for g in placement_group_table().values() if g.get("state") != "REMOVED"]
        alive = [pid for pid in pids if _alive(pid)]
        if not (actors or groups or alive):
            return []
        if time.monotonic() > deadline:
            return [f"left behind: {len(actors)} worker actor(s), {len(groups)} placement group(s), processes {alive}"]
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"  # a zombie is gone but unreaped
    except (OSError, IndexError):
        return False


def fenced(result: Any, journal: list[dict[str, Any]], rank_lines: list[list[dict[str, Any]]]) -> list[str]:
    """Nothing committed came from a process the run had replaced: every file of a kept
    checkpoint was written in the attempt that committed it, by the process (and on the node)
    that rank started in that attempt. A rank cut off and replaced may live on and send its
    reports when its link is back; they belong to an ended attempt."""
    import torch

    attempt_of = {line["checkpoint"]: line["attempt"] for line in journal if line["e"] == "commit"}
    started = {
        (line["attempt"], line["rank"]): (line["pid"], line.get("node"))
        for lines in rank_lines
        for line in lines
        if line["e"] == "start"
    }
    broken = []
    for checkpoint, _ in result.best_checkpoints:
        name = os.path.basename(checkpoint.path.rstrip("/"))
        attempt = attempt_of.get(name)
        with checkpoint.as_directory() as folder:
            for file in sorted(os.listdir(folder)):
                if not file.endswith(".pt"):
                    continue
                try:
                    state = torch.load(os.path.join(folder, file))
                except Exception:  # noqa: BLE001 - ``checkpoints`` names a file that does not load
                    continue
                if "attempt" not in state:
                    continue
                writer = (state["attempt"], state["rank"])
                if attempt is not None and state["attempt"] != attempt:
                    broken.append(
                        f"fencing: checkpoint {name}, committed in attempt {attempt}, holds rank {state['rank']}'s "
                        f"file from attempt {state['attempt']} (node {state['node']}, pid {state['pid']})"
                    )
                elif started.get(writer, (state["pid"], state["node"])) != (state["pid"], state["node"]):
                    broken.append(
                        f"fencing: checkpoint {name}: rank {state['rank']}'s file was written by pid {state['pid']} "
                        f"on {state['node']}, not by the process that rank started in attempt {state['attempt']} "
                        f"({started[writer]})"
                    )
    return broken


def fenced_rounds(journal: list[dict[str, Any]], rank_lines: list[list[dict[str, Any]]]) -> list[str]:
    """Nothing a replaced process reported was committed, checkpoint or not: every rank's report
    in a round the driver committed comes from the attempt it committed the round in, and from
    the process (and node) the rank started in that attempt."""
    started = {
        (line["attempt"], line["rank"]): [line["pid"], line.get("node")]
        for lines in rank_lines
        for line in lines
        if line["e"] == "start"
    }
    broken = []
    for line in journal:
        if line["e"] != "commit" or not line.get("by"):
            continue
        for rank, (attempt, pid, node) in enumerate(line["by"]):
            if attempt != line["attempt"]:
                broken.append(
                    f"fencing: step {line['step']} committed in attempt {line['attempt']} holds rank {rank}'s report "
                    f"from attempt {attempt} (pid {pid} on {node})"
                )
            elif started.get((attempt, rank), [pid, node]) != [pid, node]:
                broken.append(
                    f"fencing: step {line['step']}: rank {rank}'s report came from pid {pid} on {node}, not from the "
                    f"process that rank started in attempt {attempt} ({started[(attempt, rank)]})"
                )
    return broken


def step_seconds(journal: list[dict[str, Any]]) -> float:
    """A step's time in a run's journal: from its first commit to its last, per step (0 with
    fewer than two; the driver often commits several rounds at once, so not the median gap)."""
    times = [line["t"] for line in journal if line["e"] == "commit"]
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0


def struck_at(marks: str, fault: Fault) -> float | None:
    """When ``fault`` fired (its marker's time), or None when it did not."""
    from benchmarks.chaos_journal import marker

    try:
        return os.path.getmtime(marker(marks, fault.id, "fired"))
    except FileNotFoundError:
        return None


def time_lost(faults: list[Fault], marks: str, journal: list[dict[str, Any]], step_s: float) -> dict[int, float | None]:
    """What each fired fault cost its run in wall time, as the pace of its commits shows: at the
    run's first commit past the step it had committed when the fault struck, once the fault is
    over (its ``hold_s``; for a kind that restarts the group and holds for no set time, once the
    run restarted), the time since the strike less what the steps gained take without faults
    (``step_s`` each). It holds the wait for the failure to be found, the restart, the steps
    trained again, any new driver, and a slow link's slower steps. Faults that overlap share
    their stall; None: the run committed nothing past that step after it."""
    commits = [line for line in journal if line["e"] == "commit"]
    restarts = [line["t"] for line in journal if line["e"] == "restart"]
    lost: dict[int, float | None] = {}
    for fault in faults:
        struck = struck_at(marks, fault)
        if struck is None:
            continue
        before = [line for line in commits if line["t"] <= struck]
        top = before[-1]["step"] if before else -1
        over = struck + fault.hold_s
        if KINDS[fault.kind].restarts and not fault.hold_s:
            over = next((t for t in restarts if t > struck), struck)
        past = [line for line in commits if line["t"] > struck and line["step"] > top]
        # Its first commit once the fault is over; or, when the run ended first, its last.
        resumed = next((line for line in past if line["t"] > over), past[-1] if past else None)
        lost[fault.id] = (
            None if resumed is None else round(max(0.0, resumed["t"] - struck - (resumed["step"] - top) * step_s), 2)
        )
    return lost


def restart_causes(faults: list[Fault], marks: str, journal: list[dict[str, Any]]) -> list[tuple[str | None, dict]]:
    """Each restart of a run's journal with the kind of the fault that caused it (None when no
    fired fault can have), by a rule of thumb: of the faults struck before it that may still
    restart the group (a kind's ``restarts`` each), the latest that struck a rank the restart
    names as failed or replaced, else the latest not matched yet, else the latest. (A restart may
    name only the rank that saw its peer's connection close, not the peer that was killed.) Each
    restart line comes with ``after_s``: seconds from its cause's strike to it."""
    struck = {f.id: struck_at(marks, f) for f in faults}
    matched = {f.id: 0 for f in faults}
    causes: list[tuple[str | None, dict]] = []
    for line in (line for line in journal if line["e"] == "restart"):
        failed = {failure["rank"] for failure in line.get("failures", [])}
        failed |= {int(rank) for rank in line.get("replaced") or ()}
        before = sorted(
            (
                f
                for f in faults
                if struck[f.id] is not None and struck[f.id] < line["t"] and matched[f.id] < KINDS[f.kind].restarts
            ),
            key=lambda f: struck[f.id],
        )
        named = [f for f in before if f.rank in failed and not matched[f.id]]
        fresh = [f for f in before if not matched[f.id]]
        cause = (named or fresh or before or [None])[-1]
        if cause is not None:
            matched[cause.id] += 1
            line = {**line, "after_s": round(line["t"] - (struck[cause.id] or line["t"]), 2)}
        causes.append((cause.kind if cause is not None else None, line))
    return causes
