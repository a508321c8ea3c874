"""One measurement of the scale benchmark: one implementation, one topology, one variant, N workers.

The training function is written once (``_loop``); ``loop_flowtrain`` and ``loop_ray`` only hand
it a different ``train`` module, so both implementations run the same source. Everything the
benchmark measures is recorded with ``time.time()``: on one machine the wall clock is shared by
the driver, Ray Train's controller actor and every worker process, so times taken in different
processes can be subtracted.

Run on its own as ``python -m benchmarks.scale_run SPEC.json OUT.json``: that starts a fresh Ray
for the topology named in the spec, measures, shuts Ray down and writes the numbers.
``benchmarks.scale`` starts one such process per measurement.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: flowtrain with its defaults; flowtrain_spare: spare workers from the first report
#: (FLOWTRAIN_SPARE_AFTER_S=0), so a recovery finds one warm; flowtrain_full: every worker
#: restarted after a failure (FLOWTRAIN_REPLACE_RANKS=0, what flowtrain did before issue 46);
#: ray_train: the installed ray.train.
IMPLS = ("flowtrain", "flowtrain_spare", "flowtrain_full", "ray_train")
#: The environment each flowtrain variant runs with (read by every fit()).
IMPL_ENV = {
    "flowtrain": {},
    "flowtrain_spare": {"FLOWTRAIN_SPARE_AFTER_S": "0"},
    "flowtrain_full": {"FLOWTRAIN_REPLACE_RANKS": "0"},
}
TOPOLOGIES = ("single", "multi")
#: metrics: metrics-only reports. ckpt: every ``ckpt_every``-th report carries a checkpoint from
#: every rank. upload_sync / upload_async: the same with bigger files, uploaded SYNC or ASYNC.
#: recovery: ckpt, plus one rank SIGKILLed after a few reports (FailureConfig(max_failures=1)).
VARIANTS = ("metrics", "ckpt", "upload_sync", "upload_async", "recovery")

#: CPUs of the one-node Ray, and what each training worker asks for: 64 workers fit in 0.96 CPU.
SINGLE_NODE_CPUS = 2
CPU_PER_WORKER = 0.015


@dataclasses.dataclass
class Spec:
    """What one measurement runs. Plain data, so it travels to a child process as JSON."""

    impl: str
    topology: str
    variant: str
    workers: int
    reports: int = 20
    ckpt_every: int = 5
    ckpt_mb: float = 1.0
    fit_timeout_s: float = 300.0
    #: multi topology: how many Ray nodes (head included) and logical CPUs each.
    nodes: int = 4
    node_cpus: float = 1.0
    #: recovery: the step after whose round the driver side kills one rank.
    kill_after_step: int = 7
    #: recovery: seconds the driver side waits, every rank held at the next step, before the kill
    #: (time for spare workers to start and warm up; the same for every implementation).
    kill_delay_s: float = 0.0
    #: seconds each rank sleeps after a report (0: the trivial loop reports as fast as it can).
    step_s: float = 0.0
    #: keep the run folder and the rank files (for debugging) instead of deleting them.
    keep: bool = False

    @property
    def upload_mode(self) -> str:
        """How checkpoints are uploaded: ASYNC in the upload_async variant, SYNC otherwise."""
        return "ASYNC" if self.variant == "upload_async" else "SYNC"

    @property
    def checkpoints(self) -> bool:
        """Whether this variant reports checkpoints at all."""
        return self.variant != "metrics"


# -- the training function (runs on every worker) ---------------------------------------------


def _loop(train: Any, config: dict) -> None:
    """The workload: ``config["reports"]`` reports; every ``ckpt_every``-th carries a checkpoint
    folder this rank wrote (its own files only, so the committed checkpoint holds every rank's).
    ``train`` is ``trainers`` or ``ray.train``: nothing else differs between the two runs."""
    import ray

    entry = time.time()
    entry_cpu = time.process_time()  # what this process cost before the loop (its start, when new)
    context = train.get_context()
    rank = context.get_world_rank()
    pid = os.getpid()
    node = ray.get_runtime_context().get_node_id()
    start = 1
    resumed_from = train.get_checkpoint()
    if resumed_from is not None:
        with resumed_from.as_directory() as folder:
            with open(os.path.join(folder, _rank_file(0, "json"))) as f:
                start = json.load(f)["step"] + 1
    mode = getattr(train.CheckpointUploadMode, config["upload_mode"])
    steps = []
    for step in range(start, config["reports"] + 1):
        if config["gate_step"] and start == 1 and step == config["gate_step"]:
            # Recovery: hold every rank of the first attempt here until the driver side has killed
            # one, so the victim is alive when it is killed and no later checkpoint can commit.
            _wait_for_file(config["gate"], timeout_s=config["gate_timeout_s"])
        checkpoint, folder = None, None
        if config["ckpt_every"] and step % config["ckpt_every"] == 0:
            folder = tempfile.mkdtemp(prefix=f"rank{rank}-step{step}-", dir=config["scratch"])
            _write_rank_files(folder, rank, step, config["ckpt_bytes"])
            checkpoint = train.Checkpoint.from_directory(folder)
        metrics = {"step": step, "start": start, "pid": pid}
        if step == start:
            metrics.update(entry=entry, node=node, entry_cpu=entry_cpu)
        metrics["pre"] = pre = time.time()
        if checkpoint is None:
            train.report(metrics)
        else:
            train.report(metrics, checkpoint=checkpoint, checkpoint_upload_mode=mode)
        post = time.time()
        if folder is not None and config["upload_mode"] == "SYNC":
            # A SYNC report keeps the reported folder (ASYNC deletes it once uploaded).
            shutil.rmtree(folder, ignore_errors=True)
        steps.append([step, pre, post, checkpoint is not None])
        if config["step_s"]:
            time.sleep(config["step_s"])
    record = {"rank": rank, "pid": pid, "node": node, "entry": entry, "start": start, "steps": steps}
    with open(os.path.join(config["ranks_dir"], f"rank{rank:05d}-start{start:03d}-pid{pid}.json"), "w") as f:
        json.dump(record, f)


def loop_flowtrain(config: dict) -> None:
    """The workload under flowtrain."""
    import trainers as train

    _loop(train, config)


def loop_ray(config: dict) -> None:
    """The workload under ray.train."""
    import ray.train as train

    _loop(train, config)


def _rank_file(rank: int, suffix: str) -> str:
    return f"rank_{rank:05d}.{suffix}"


def _write_rank_files(folder: str, rank: int, step: int, size: int) -> None:
    block = os.urandom(min(size, 1 << 20)) if size else b""
    with open(os.path.join(folder, _rank_file(rank, "bin")), "wb") as f:
        left = size
        while left > 0:
            f.write(block[:left])
            left -= len(block)
    with open(os.path.join(folder, _rank_file(rank, "json")), "w") as f:
        json.dump({"rank": rank, "step": step}, f)


def _wait_for_file(path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


# -- the driver side: a callback that writes what it sees to a file ---------------------------


class _RecorderLogic:
    """Appends one JSON line per round to ``events`` with the time the round reached the driver
    side, the CPU seconds of the process the callback runs in (flowtrain: the driver; ray.train:
    its controller actor) and of the driver, and what every rank put in its metrics. With
    ``kill_after_step`` set it SIGKILLs one rank right after that round and opens the gate the
    ranks wait at. Ray Train runs callbacks in another process, so state goes to files."""

    def __init__(
        self, events: str, driver_pid: int, kill_after_step: int = 0, gate: str = "", kill_delay_s: float = 0.0
    ) -> None:
        self.events = events
        self.driver_pid = driver_pid
        self.kill_after_step = kill_after_step
        self.kill_delay_s = kill_delay_s
        self.gate = gate
        self.killed = False
        self.resumed_seen = False
        self.last_committed_step = 0

    def after_report(self, run_context, metrics, checkpoint):
        """Record the round (and, in the recovery variant, kill a rank once)."""
        now = time.time()
        cpu = time.process_time()
        cpu_driver = None
        if os.getpid() != self.driver_pid:
            import psutil

            try:
                times = psutil.Process(self.driver_pid).cpu_times()
                cpu_driver = times.user + times.system
            except psutil.Error:
                pass
        step = metrics[0].get("step")
        if checkpoint is not None:
            self.last_committed_step = step
        event = {
            "kind": "round",
            "t": now,
            # After a kill, until the first resumed round: the CPU of every process of the run.
            "tree_cpu": _tree_cpu(self.driver_pid) if self.killed and not self.resumed_seen else None,
            "process": self._process_title(),
            "cpu": cpu,
            "cpu_driver": cpu_driver,
            "pid": os.getpid(),
            "checkpoint": getattr(checkpoint, "path", None) if checkpoint is not None else None,
            "ranks": [
                [
                    m.get("step"),
                    m.get("pre"),
                    m.get("start"),
                    m.get("pid"),
                    m.get("entry"),
                    m.get("node"),
                    m.get("entry_cpu"),
                ]
                for m in metrics
            ],
        }
        if self.killed and any(m.get("start") != 1 for m in metrics):
            self.resumed_seen = True
        self._append(event)
        if self.kill_after_step and not self.killed and step == self.kill_after_step:
            self.killed = True
            time.sleep(self.kill_delay_s)
            victim = len(metrics) - 1
            victim_pid = metrics[victim]["pid"]
            tree_cpu = _tree_cpu(self.driver_pid)
            killed_at = time.time()
            os.kill(victim_pid, signal.SIGKILL)
            self._append(
                {
                    "kind": "kill",
                    "t": killed_at,
                    "tree_cpu": tree_cpu,
                    "rank": victim,
                    "pid": victim_pid,
                    "after_step": step,
                    "last_committed_step": self.last_committed_step,
                }
            )
            pathlib.Path(self.gate).touch()

    def _process_title(self) -> str | None:
        # Which process the callback runs in: the driver's python, or ray::TrainController.run.
        if getattr(self, "_title", None) is None:
            try:
                with open("/proc/self/cmdline", "rb") as f:
                    self._title = f.read().split(b"\0")[0].decode(errors="replace")[:80]
            except OSError:
                self._title = ""
            return self._title
        return None

    def _append(self, event: dict) -> None:
        with open(self.events, "a") as f:
            f.write(json.dumps(event) + "\n")


def _tree_cpu(root: int) -> dict[str, float] | None:
    """CPU seconds (user + system) used so far by process ``root`` and by each process under it
    (the measurement's driver: every Ray process of the run is its descendant), keyed by pid and
    start time, so that a later reading can tell what each process used in between."""
    import psutil

    try:
        processes = [psutil.Process(root)]
        processes += processes[0].children(recursive=True)
    except psutil.Error:
        return None
    found = {}
    for process in processes:
        try:
            times = process.cpu_times()
            found[f"{process.pid}@{process.create_time()}"] = times.user + times.system
        except psutil.Error:
            pass
    return found


def cpu_between(before: dict[str, float], after: dict[str, float]) -> float:
    """CPU seconds the processes of ``after`` used since ``before`` (all of it for a process that
    started in between; a process that ended in between is not counted: its last moments are lost)."""
    return sum(cpu - before.get(key, 0.0) for key, cpu in after.items())


def recorder(impl: str, **kwargs: Any) -> Any:
    """A callback of ``impl``'s own ``UserCallback`` class that records every round."""
    base = _api(impl)["UserCallback"]
    cls = type("ScaleRecorder", (_RecorderLogic, base), {})
    return cls(**kwargs)


def _api(impl: str) -> dict:
    """The driver-side names, from ``trainers`` or from ``ray.train`` 2.60 (V2 API)."""
    if impl in IMPL_ENV:
        import trainers as api
        from trainers import DataParallelTrainer
    elif impl == "ray_train":
        import ray.train as api
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    else:
        raise ValueError(f"unknown implementation {impl!r}: one of {IMPLS}")
    return {
        "DataParallelTrainer": DataParallelTrainer,
        "ScalingConfig": api.ScalingConfig,
        "RunConfig": api.RunConfig,
        "CheckpointConfig": api.CheckpointConfig,
        "FailureConfig": api.FailureConfig,
        "UserCallback": api.UserCallback,
    }


# -- Ray, one node or several on this machine -------------------------------------------------


class RayTopology:
    """Starts and stops the Ray a measurement runs on: ``single`` is ``ray.init(address="local")``
    with 2 CPUs; ``multi`` is ``nodes`` raylets on this machine (``ray.cluster_utils.Cluster``)."""

    def __init__(self, topology: str, nodes: int = 4, node_cpus: float = 1.0) -> None:
        if topology not in TOPOLOGIES:
            raise ValueError(f"unknown topology {topology!r}: one of {TOPOLOGIES}")
        self.topology, self.nodes, self.node_cpus = topology, nodes, node_cpus
        self.cluster = None
        self.start_s = None

    def start(self) -> RayTopology:
        """Start Ray and connect this process to it; ``start_s`` says how long that took."""
        import ray

        began = time.perf_counter()
        if self.topology == "single":
            ray.init(address="local", num_cpus=SINGLE_NODE_CPUS, include_dashboard=False, log_to_driver=False)
        else:
            from ray.cluster_utils import Cluster

            self.cluster = Cluster(
                initialize_head=True, head_node_args={"num_cpus": self.node_cpus, "include_dashboard": False}
            )
            for _ in range(self.nodes - 1):
                self.cluster.add_node(num_cpus=self.node_cpus)
            self.cluster.wait_for_nodes()
            ray.init(address=self.cluster.address, log_to_driver=False)
        self.start_s = time.perf_counter() - began
        return self

    def stop(self) -> None:
        """Disconnect and stop every Ray process this topology started."""
        import ray

        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None


# -- one measurement ----------------------------------------------------------------------------


def measure(spec: Spec) -> dict:
    """Run one fit() as ``spec`` says, on the Ray this process is connected to, and return its
    numbers (see ``DEFINITIONS`` in ``benchmarks.scale``) plus a structure check. A fit that does
    not finish within ``spec.fit_timeout_s`` comes back as ``{"missing": True, ...}``."""
    import ray

    assert ray.is_initialized(), "measure() runs on a connected Ray"
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"flowtrain-scale-{spec.impl}-"))
    for sub in ("ranks", "scratch", "storage"):
        (work / sub).mkdir()
    events = work / "events.jsonl"
    gate = work / "gate"
    recovery = spec.variant == "recovery"
    if recovery and spec.reports < spec.kill_after_step + 2:
        raise ValueError(f"recovery needs at least {spec.kill_after_step + 2} reports, got {spec.reports}")
    config = {
        "reports": spec.reports,
        "ckpt_every": spec.ckpt_every if spec.checkpoints else 0,
        "ckpt_bytes": int(spec.ckpt_mb * 2**20),
        "upload_mode": spec.upload_mode,
        "scratch": str(work / "scratch"),
        "ranks_dir": str(work / "ranks"),
        "gate": str(gate),
        "gate_step": spec.kill_after_step + 1 if recovery else 0,
        "gate_timeout_s": spec.fit_timeout_s,
        "step_s": spec.step_s,
    }
    api = _api(spec.impl)
    callback = recorder(
        spec.impl,
        events=str(events),
        driver_pid=os.getpid(),
        kill_after_step=spec.kill_after_step if recovery else 0,
        kill_delay_s=spec.kill_delay_s,
        gate=str(gate),
    )
    scaling = api["ScalingConfig"](
        num_workers=spec.workers,
        resources_per_worker={"CPU": CPU_PER_WORKER},
        # SPREAD puts the workers on as many nodes as it can; the run records where they landed.
        placement_strategy="SPREAD" if spec.topology == "multi" else "PACK",
    )
    run_config = api["RunConfig"](
        name=f"scale-{spec.variant}-{spec.workers}",
        storage_path=str(work / "storage"),
        callbacks=[callback],
        failure_config=api["FailureConfig"](max_failures=1 if recovery else 0),
        # Every checkpoint is kept, so each can be checked for every rank's files, except with
        # 50 MB per rank, where keeping 2 bounds the disk a 64-worker run takes.
        checkpoint_config=api["CheckpointConfig"](num_to_keep=2 if spec.variant.startswith("upload") else None),
    )
    loop = loop_flowtrain if spec.impl in IMPL_ENV else loop_ray
    trainer = api["DataParallelTrainer"](loop, train_loop_config=config, scaling_config=scaling, run_config=run_config)

    outcome: dict = {}

    def fit() -> None:
        outcome["called"] = time.time()
        try:
            outcome["result"] = trainer.fit()
        except BaseException as error:  # noqa: BLE001 - recorded, the measurement goes on to the next
            outcome["error"] = error
        outcome["returned"] = time.time()

    # In a thread, so a fit() that never returns can be given up on after the timeout.
    saved_env = {name: os.environ.get(name) for name in IMPL_ENV.get(spec.impl, {})}
    os.environ.update(IMPL_ENV.get(spec.impl, {}))
    thread = threading.Thread(target=fit, name="scale-fit", daemon=True)
    try:
        thread.start()
        thread.join(spec.fit_timeout_s)
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if thread.is_alive():
        return {"missing": True, "reason": f"fit() did not return within {spec.fit_timeout_s:.0f} s", "work": str(work)}
    numbers = analyse(spec, outcome["called"], outcome["returned"], events, work / "ranks")
    error = outcome.get("error") or getattr(outcome.get("result"), "error", None)
    if error is not None:
        numbers["error"] = f"{type(error).__name__}: {error}"[:2000]
        numbers["structure"]["problems"].append("fit() failed")
        numbers["structure"]["ok"] = False
    else:
        check_result_checkpoints(spec, outcome["result"], numbers["structure"])
    if not spec.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        numbers["work"] = str(work)
    return numbers


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def analyse(
    spec: Spec, fit_called: float, fit_returned: float, events_path: pathlib.Path, ranks_dir: pathlib.Path
) -> dict:
    """Turn the driver-side events and the ranks' own timings into the run's numbers."""
    events = [json.loads(line) for line in events_path.read_text().splitlines()] if events_path.exists() else []
    rounds = [e for e in events if e["kind"] == "round"]
    kills = [e for e in events if e["kind"] == "kill"]
    rank_records = [json.loads(p.read_text()) for p in sorted(ranks_dir.glob("rank*.json"))]
    if kills:
        # flowtrain's reports do not wait for the driver, so ranks of the killed attempt may have
        # run to the end before it was torn down: only the attempt that started after the kill counts.
        rank_records = [r for r in rank_records if r["entry"] > kills[0]["t"]]
    n = spec.workers
    problems: list[str] = []
    numbers: dict = {"fit_s": fit_returned - fit_called, "rounds": len(rounds)}

    # Which round belongs to which attempt: every rank says the step its attempt started at.
    first_attempt = [r for r in rounds if all(m[2] == 1 for m in r["ranks"])]
    resumed = [r for r in rounds if any(m[2] != 1 for m in r["ranks"])]

    for index, event in enumerate(rounds):
        ranks = event["ranks"]
        steps = {m[0] for m in ranks}
        if len(ranks) != n:
            problems.append(f"round {index}: {len(ranks)} ranks reported, not {n}")
        if len(steps) != 1:
            problems.append(f"round {index}: ranks at different steps {sorted(steps)}")
    seen_steps = [r["ranks"][0][0] for r in rounds]
    expected_steps = list(range(1, spec.reports + 1))
    if spec.variant != "recovery" and seen_steps != expected_steps:
        problems.append(f"steps seen at the driver {seen_steps}, expected {expected_steps}")

    if first_attempt:
        entries = [m[4] for m in first_attempt[0]["ranks"]]
        if None not in entries:
            numbers["all_ranks_in_s"] = max(entries) - fit_called
        nodes = [m[5] for m in first_attempt[0]["ranks"]]
        numbers["nodes_used"] = len(set(nodes))
        numbers["ranks_per_node"] = sorted((nodes.count(node) for node in set(nodes)), reverse=True)
    if rounds:
        numbers["callback_process"] = rounds[0].get("process")
        numbers["first_report_s"] = rounds[0]["t"] - fit_called
        round_ms = [1000 * (r["t"] - max(m[1] for m in r["ranks"])) for r in rounds]
        numbers["round_ms_p50"] = statistics.median(round_ms)
        numbers["round_ms_p90"] = _quantile(round_ms, 0.9)
        numbers["driver_cpu_ms_per_round"] = _driver_cpu_per_round(first_attempt or rounds)

    # What report() cost the loop, from the ranks' own clocks (the attempt that finished).
    blocked_metrics = [1000 * (post - pre) for r in rank_records for _, pre, post, ckpt in r["steps"] if not ckpt]
    blocked_ckpt = [1000 * (post - pre) for r in rank_records for _, pre, post, ckpt in r["steps"] if ckpt]
    if blocked_metrics:
        numbers["report_blocked_ms_p50"] = statistics.median(blocked_metrics)
        numbers["report_blocked_ms_p90"] = _quantile(blocked_metrics, 0.9)
    if blocked_ckpt:
        numbers["ckpt_blocked_ms_p50"] = statistics.median(blocked_ckpt)
        numbers["ckpt_blocked_ms_max"] = max(blocked_ckpt)

    committed = [r for r in rounds if r["checkpoint"]]
    if spec.checkpoints:
        returned_at: dict[int, list[float]] = {}
        for record in rank_records:
            for step, _, post, ckpt in record["steps"]:
                if ckpt:
                    returned_at.setdefault(step, []).append(post)
        commit_ms = [
            1000 * (r["t"] - max(returned_at[r["ranks"][0][0]]))
            for r in committed
            if len(returned_at.get(r["ranks"][0][0], ())) == n
        ]
        round_ms = [1000 * (r["t"] - max(m[1] for m in r["ranks"])) for r in committed]
        if commit_ms:
            numbers["ckpt_commit_ms_p50"] = statistics.median(commit_ms)
        if round_ms:
            numbers["ckpt_round_ms_p50"] = statistics.median(round_ms)
        ckpt_steps = [r["ranks"][0][0] for r in committed]
        expected = [
            s for s in (seen_steps if spec.variant == "recovery" else expected_steps) if s % spec.ckpt_every == 0
        ]
        if ckpt_steps != expected:
            problems.append(f"committed checkpoints at steps {ckpt_steps}, expected {expected}")
        numbers["checkpoints_committed"] = len(committed)
        numbers["checkpoint_paths"] = [r["checkpoint"] for r in committed]
    elif committed:
        problems.append(f"{len(committed)} checkpoint(s) committed in a metrics-only run")

    if len(rank_records) != n:
        problems.append(f"{len(rank_records)} ranks finished the train function, expected {n}")
    for record in rank_records:
        done = [s[0] for s in record["steps"]]
        if done != list(range(record["start"], spec.reports + 1)):
            problems.append(f"rank {record['rank']} reported steps {done}")

    if spec.variant == "recovery":
        numbers.update(_recovery(spec, kills, rounds, resumed, rank_records, problems))

    numbers["structure"] = {"ok": not problems, "problems": problems}
    numbers["structure"]["checked_checkpoints"] = _check_checkpoint_folders(
        [r["checkpoint"] for r in committed], n, spec, problems, missing_ok=spec.variant.startswith("upload")
    )
    numbers["structure"]["ok"] = not problems
    return numbers


def _driver_cpu_per_round(rounds: list[dict]) -> float | None:
    """CPU milliseconds per round of the driver-side processes, first to last round: the process
    the callback runs in, plus the driver when that is another process (ray.train)."""
    if len(rounds) < 2:
        return None

    def cpu(event: dict) -> float:
        return event["cpu"] + (event["cpu_driver"] or 0.0)

    return 1000 * (cpu(rounds[-1]) - cpu(rounds[0])) / (len(rounds) - 1)


def _recovery(spec: Spec, kills, rounds, resumed, rank_records, problems) -> dict:
    out: dict = {}
    if not kills:
        problems.append("no rank was killed")
        return out
    kill = kills[0]
    out.update(
        killed_rank=kill["rank"], killed_after_step=kill["after_step"], last_committed_step=kill["last_committed_step"]
    )
    after = [r for r in resumed if r["t"] >= kill["t"]]
    if not after:
        problems.append("no report of a resumed attempt reached the driver")
        return out
    first = after[0]
    starts = {m[2] for m in first["ranks"]}
    out["resumed_at_step"] = min(starts)
    out["recovery_s"] = first["t"] - kill["t"]
    entries = [m[4] for m in first["ranks"] if m[4] is not None]
    if len(entries) == spec.workers:
        out["recovery_all_ranks_in_s"] = max(entries) - kill["t"]
    # Which ranks the resumed attempt ran in new processes, and what the fault cost in CPU: every
    # process of the run, from the kill to the first resumed report, against what one worker's
    # start cost (the first attempt's ranks, before their loop).
    before = {m[3] for r in rounds[:1] for m in r["ranks"]}
    out["new_processes"] = sum(1 for m in first["ranks"] if m[3] not in before)
    if kill.get("tree_cpu") is not None and first.get("tree_cpu") is not None:
        out["recovery_cpu_s"] = cpu_between(kill["tree_cpu"], first["tree_cpu"])
    starts_cpu = [m[6] for m in rounds[0]["ranks"] if len(m) > 6 and m[6] is not None] if rounds else []
    if starts_cpu:
        out["worker_start_cpu_s"] = statistics.median(starts_cpu)
    if starts != {kill["last_committed_step"] + 1}:
        problems.append(
            f"resumed at step(s) {sorted(starts)}, expected {kill['last_committed_step'] + 1} "
            f"(the last committed checkpoint was step {kill['last_committed_step']})"
        )
    steps = [r["ranks"][0][0] for r in rounds]
    expected = list(range(1, kill["after_step"] + 1)) + list(range(kill["last_committed_step"] + 1, spec.reports + 1))
    if steps != expected:
        problems.append(f"steps seen at the driver {steps}, expected {expected}")
    return out


def _check_checkpoint_folders(paths: list[str], n: int, spec: Spec, problems: list[str], missing_ok: bool) -> int:
    """Every committed checkpoint folder holds every rank's two files, the data at full size;
    returns how many folders were checked (retention may have deleted some when ``missing_ok``)."""
    checked = 0
    size = int(spec.ckpt_mb * 2**20)
    for path in paths:
        folder = pathlib.Path(path)
        if not folder.exists():
            if not missing_ok:
                problems.append(f"committed checkpoint {path} is gone")
            continue
        checked += 1
        problems.extend(_folder_problems(folder, n, size))
    return checked


def _folder_problems(folder: pathlib.Path, n: int, size: int) -> list[str]:
    problems = []
    missing = [r for r in range(n) if not (folder / _rank_file(r, "json")).exists()]
    short = [r for r in range(n) if r not in missing and (folder / _rank_file(r, "bin")).stat().st_size != size]
    if missing:
        problems.append(f"{folder.name}: no files from rank(s) {missing[:10]}{'...' if len(missing) > 10 else ''}")
    if short:
        problems.append(f"{folder.name}: rank(s) {short[:10]} wrote a file that is not {size} bytes")
    return problems


def check_result_checkpoints(spec: Spec, result: Any, structure: dict) -> None:
    """``Result.checkpoint`` and every one of ``Result.best_checkpoints`` hold every rank's files,
    and the latest is the last step's."""
    problems = structure["problems"]
    if not spec.checkpoints:
        if result.checkpoint is not None:
            problems.append("a metrics-only run has a Result.checkpoint")
    else:
        size = int(spec.ckpt_mb * 2**20)
        if result.checkpoint is None:
            problems.append("Result.checkpoint is None")
        else:
            folder = pathlib.Path(result.checkpoint.path)
            problems.extend(f"Result.checkpoint {p}" for p in _folder_problems(folder, spec.workers, size))
            last = max(s for s in range(1, spec.reports + 1) if s % spec.ckpt_every == 0)
            step_file = folder / _rank_file(0, "json")
            if step_file.exists() and json.loads(step_file.read_text())["step"] != last:
                problems.append(f"Result.checkpoint is not the last step's ({last})")
        best = result.best_checkpoints or []
        if not best:
            problems.append("Result.best_checkpoints is empty")
        for checkpoint, _ in best:
            problems.extend(
                f"best checkpoint {p}" for p in _folder_problems(pathlib.Path(checkpoint.path), spec.workers, size)
            )
        structure["best_checkpoints"] = len(best)
    structure["ok"] = not problems


# -- memory: the peak PSS of a process tree ---------------------------------------------------


class TreeSampler:
    """Samples, in a thread, the summed PSS (``memory_full_info().pss``) of process ``root`` and
    all its descendants (the driver, and under it every Ray process it started: GCS, raylets,
    agents, workers, controller actors) and keeps the peak and the process count at the peak.

    One sample reads the memory map of every process (a few ms each, so 0.1-0.2 s at 70
    processes): the wait between samples is ``interval_s`` but at least 3 times the last sample's
    cost, so sampling never takes more than a quarter of a core from the run it measures.
    """

    def __init__(self, root: int, interval_s: float = 0.2) -> None:
        self.root = root
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.procs_at_peak = 0
        self.samples = 0
        self.sample_cost_s = 0.0
        #: (pid, create_time) of every process seen: what is still alive after the run is a leak.
        self.seen: set[tuple[int, float]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scale-pss", daemon=True)
        self._began = 0.0

    def _run(self) -> None:
        wait = 0.0
        while not self._stop.wait(wait):
            began = time.perf_counter()
            self.sample()
            cost = time.perf_counter() - began
            self.sample_cost_s += cost
            wait = max(self.interval_s, 3 * cost)

    def sample(self) -> None:
        """Take one sample now."""
        import psutil

        try:
            root = psutil.Process(self.root)
            processes = [root] + root.children(recursive=True)
        except psutil.Error:
            return
        total, count = 0, 0
        for process in processes:
            try:
                total += process.memory_full_info().pss
                self.seen.add((process.pid, process.create_time()))
                count += 1
            except psutil.Error:
                pass
        self.samples += 1
        if total > self.peak_bytes:
            self.peak_bytes, self.procs_at_peak = total, count

    def start(self) -> TreeSampler:
        """Start sampling in the background."""
        self._began = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> dict:
        """Stop sampling; the peak and how the sampling went."""
        self._stop.set()
        self._thread.join()
        elapsed = time.perf_counter() - self._began
        return {
            "peak_pss_mb": self.peak_bytes / 2**20,
            "procs_at_peak": self.procs_at_peak,
            "pss_samples": self.samples,
            "pss_mean_interval_s": elapsed / self.samples if self.samples else None,
            "pss_sample_cost_s": self.sample_cost_s / self.samples if self.samples else None,
        }


# -- the child process: fresh Ray, one measurement, Ray down ----------------------------------


def main(argv: list[str]) -> int:
    """``python -m benchmarks.scale_run SPEC.json OUT.json``."""
    spec = Spec(**json.loads(pathlib.Path(argv[0]).read_text()))
    out = pathlib.Path(argv[1])
    topology = RayTopology(spec.topology, spec.nodes, spec.node_cpus).start()
    numbers: dict = {"ray_start_s": topology.start_s}
    try:
        numbers.update(measure(spec))
    except Exception as error:  # noqa: BLE001 - one broken measurement must not stop the benchmark
        numbers.update(missing=True, reason=f"{type(error).__name__}: {error}"[:2000])
    out.write_text(json.dumps(numbers))
    if numbers.get("missing"):
        # The fit thread may still hold Ray and hang a shutdown: give it a minute, then leave;
        # the parent kills whatever is left of this process tree.
        stopper = threading.Thread(target=topology.stop, daemon=True)
        stopper.start()
        stopper.join(60)
        os._exit(0)
    topology.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
