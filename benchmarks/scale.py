"""flowtrain and ray.train side by side as the worker count grows (issue 28).

    python -m benchmarks.scale                                   # everything (long: ray.train at N=64)
    python -m benchmarks.scale --workers 2 4 --topologies single multi --quick
    make bench-scale BENCH_ARGS="--impls flowtrain --workers 2 8 32"

The workload is a trivial training function doing 20 reports, written once and run by both
implementations (only its imports differ; see ``benchmarks.scale_run``). Variants: ``metrics``
(metrics-only reports), ``ckpt`` (every 5th report carries a checkpoint from every rank),
``upload_sync`` / ``upload_async`` (the same with 50 MB per rank, uploaded SYNC or ASYNC) and
``recovery`` (ckpt at N=32, one rank SIGKILLed after round 7, FailureConfig(max_failures=1)).
Topologies: ``single`` (one Ray node, 2 CPUs) and ``multi`` (4 Ray nodes on this machine,
placement SPREAD).

Every measurement runs in a process of its own with a fresh Ray, so what one run leaves behind
(idle workers, ray.train's controller actors) does not weigh on the next; this process samples
that process tree's memory. The implementations take turns going first (flowtrain, ray; ray,
flowtrain; ...). A fit() that does not finish within --fit-timeout is recorded as missing.
Writes benchmarks/results/scale-<date>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable

import psutil

from benchmarks.bench import machine, rotated
from benchmarks.scale_report import DEFINITIONS, markdown, per_extra_worker, plot, summarise
from benchmarks.scale_run import IMPLS, ROOT, TOPOLOGIES, VARIANTS, RayTopology, Spec, TreeSampler, measure

RESULTS = pathlib.Path(__file__).with_name("results")
DEFAULT_WORKERS = [2, 4, 8, 16, 32, 64]
#: The 50 MB-per-rank upload runs write N x 50 MB per checkpoint: measured at these N by default.
DEFAULT_UPLOAD_WORKERS = [2, 8, 32]
#: Seconds a measurement process gets on top of --fit-timeout to start and stop its Ray.
PROCESS_ALLOWANCE_S = 240.0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--help`` lists it)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--impls",
        nargs="+",
        choices=IMPLS,
        default=["flowtrain", "ray_train"],
        help="flowtrain_spare and flowtrain_full are for the recovery variant (issue 46)",
    )
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--topologies", nargs="+", choices=TOPOLOGIES, default=list(TOPOLOGIES))
    parser.add_argument("--workers", nargs="+", type=int, default=DEFAULT_WORKERS, help="the N to measure")
    parser.add_argument(
        "--upload-workers",
        nargs="+",
        type=int,
        default=None,
        help=f"the N of the upload variants (default: those of --workers among {DEFAULT_UPLOAD_WORKERS}, else the smallest)",
    )
    parser.add_argument("--reports", type=int, default=20, help="reports per rank")
    parser.add_argument("--ckpt-every", type=int, default=5, help="every k-th report carries a checkpoint")
    parser.add_argument("--ckpt-mb", type=float, default=1.0, help="checkpoint MB per rank (ckpt, recovery)")
    parser.add_argument("--upload-mb", type=float, default=50.0, help="checkpoint MB per rank (upload variants)")
    parser.add_argument("--recovery-n", type=int, default=32, help="N of the recovery variant (0: skip it)")
    parser.add_argument("--recovery-topologies", nargs="+", choices=TOPOLOGIES, default=["single"])
    parser.add_argument(
        "--recovery-workers",
        nargs="+",
        type=int,
        default=None,
        help="the N of the recovery variant, several at once (default: --recovery-n alone)",
    )
    parser.add_argument(
        "--kill-delay-s",
        type=float,
        default=0.0,
        help="recovery: seconds every rank waits before the kill (time for flowtrain_spare's spare to warm up)",
    )
    parser.add_argument("--fit-timeout", type=float, default=300.0, help="seconds before a fit() counts as missing")
    parser.add_argument("--nodes", type=int, default=4, help="Ray nodes of the multi topology (head included)")
    parser.add_argument("--node-cpus", type=float, default=1.0, help="logical CPUs of each multi-topology node")
    parser.add_argument("--repeats", type=int, default=1, help="measurements per (impl, topology, variant, N)")
    parser.add_argument("--step-s", type=float, default=0.0, help="seconds each rank sleeps after a report")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="measure in this process on one Ray per topology (quicker, less isolated; what the test uses)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 10 reports, 10 MB uploads at the smallest N only, recovery at the largest N given",
    )
    parser.add_argument("--keep", action="store_true", help="keep each run's folders (for debugging)")
    parser.add_argument(
        "--out", type=pathlib.Path, default=None, help="output stem (default benchmarks/results/scale-<date>)"
    )
    parser.add_argument(
        "--render",
        type=pathlib.Path,
        default=None,
        help="only rewrite the markdown and plot of this result JSON (no runs)",
    )
    args = parser.parse_args(argv)
    # Tables put flowtrain first and divide by ray.train, whatever order the command named them in.
    args.impls = [impl for impl in IMPLS if impl in args.impls]
    if args.quick:
        args.reports = min(args.reports, 10)
        args.upload_mb = min(args.upload_mb, 10.0)
        args.recovery_n = min(args.recovery_n, max(args.workers))
        if args.upload_workers is None:
            args.upload_workers = [min(args.workers)]
    if args.upload_workers is None:
        args.upload_workers = [n for n in args.workers if n in DEFAULT_UPLOAD_WORKERS] or [min(args.workers)]
    if args.ckpt_every < 1 or args.reports < args.ckpt_every:
        parser.error("--ckpt-every must be between 1 and --reports")
    return args


def plan(args: argparse.Namespace) -> list[Spec]:
    """Every measurement in the order they run: by topology, then N, then variant; within each,
    every implementation, the order turned by one each time so none always goes first."""
    common = dict(
        reports=args.reports,
        ckpt_every=args.ckpt_every,
        fit_timeout_s=args.fit_timeout,
        nodes=args.nodes,
        node_cpus=args.node_cpus,
        step_s=args.step_s,
        keep=args.keep,
        kill_after_step=args.ckpt_every + 2,
        kill_delay_s=args.kill_delay_s,
    )
    groups: list[tuple[str, str, int, float]] = []
    for topology in args.topologies:
        for n in sorted(set(args.workers) | set(args.upload_workers)):
            for variant in args.variants:
                if variant in ("metrics", "ckpt") and n in args.workers:
                    groups.append((topology, variant, n, args.ckpt_mb))
                elif variant.startswith("upload") and n in args.upload_workers:
                    groups.append((topology, variant, n, args.upload_mb))
    if "recovery" in args.variants and args.recovery_n > 0:
        groups += [
            (t, "recovery", n, args.ckpt_mb)
            for t in args.recovery_topologies
            if t in args.topologies
            for n in (args.recovery_workers or [args.recovery_n])
        ]
    specs = []
    turn = 0
    for _ in range(args.repeats):
        for topology, variant, n, mb in groups:
            for impl in rotated(tuple(args.impls), turn):
                specs.append(Spec(impl=impl, topology=topology, variant=variant, workers=n, ckpt_mb=mb, **common))
            turn += 1
    return specs


def _child_env() -> dict:
    env = dict(os.environ)
    env.update(RAY_USAGE_STATS_ENABLED="0", DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    # Ray workers inherit this, so they import the training function from benchmarks.scale_run.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    )
    return env


def run_in_subprocess(spec: Spec) -> dict:
    """One measurement in a fresh process with a fresh Ray; this process samples its tree's memory.
    A process that outlives its deadline is killed with everything it started."""
    with tempfile.TemporaryDirectory(prefix="flowtrain-scale-run-") as folder:
        spec_path, out_path, log_path = (pathlib.Path(folder) / name for name in ("spec.json", "out.json", "log.txt"))
        spec_path.write_text(json.dumps(dataclasses.asdict(spec)))
        with open(log_path, "w") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.scale_run", str(spec_path), str(out_path)],
                cwd=ROOT,
                env=_child_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            sampler = TreeSampler(child.pid).start()
            try:
                child.wait(timeout=spec.fit_timeout_s + PROCESS_ALLOWANCE_S)
            except subprocess.TimeoutExpired:
                _kill_tree(child.pid)
                child.wait()
            memory = sampler.stop()
        result = json.loads(out_path.read_text()) if out_path.exists() else {"missing": True, "reason": "no result"}
        if result.get("missing"):
            result["log_tail"] = log_path.read_text()[-3000:]
    _reap(sampler.seen)
    if result.get("missing") and result.get("work") and not spec.keep:
        # The run folder of a fit that was cut short: nothing uses it now that its processes are gone.
        shutil.rmtree(result.pop("work"), ignore_errors=True)
    if not result.get("missing"):
        result.update(memory)
    return result


def _kill_tree(pid: int) -> None:
    try:
        root = psutil.Process(pid)
        processes = root.children(recursive=True) + [root]
    except psutil.Error:
        return
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass


def _reap(seen: Iterable[tuple[int, float]], grace_s: float = 15.0) -> None:
    """Wait for every process the measurement started to exit; kill those still there after
    ``grace_s`` (identified by pid and start time, so a reused pid is never touched)."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = []
        for pid, created in seen:
            try:
                process = psutil.Process(pid)
                if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
            except psutil.Error:
                pass
        if not alive:
            return
        if time.monotonic() > deadline:
            for process in alive:
                try:
                    process.kill()
                except psutil.Error:
                    pass
            return
        time.sleep(0.5)


class InProcessRunner:
    """Measurements in this process, one Ray per topology kept across them (started here unless
    ``start_ray`` is False and a Ray is already connected). Quicker than a process per run, but the
    runs share Ray's leftovers, and the memory sampler's thread shares the driver's CPU time."""

    def __init__(self, start_ray: bool = True) -> None:
        self.start_ray = start_ray
        self.topology: RayTopology | None = None
        self._key: tuple | None = None

    def __call__(self, spec: Spec) -> dict:
        key = (spec.topology, spec.nodes, spec.node_cpus)
        if self.start_ray and (self.topology is None or self._key != key):
            self.close()
            os.environ["PYTHONPATH"] = _child_env()["PYTHONPATH"]
            self.topology = RayTopology(spec.topology, spec.nodes, spec.node_cpus).start()
            self._key = key
        sampler = TreeSampler(os.getpid()).start()
        try:
            result = measure(spec)
        finally:
            memory = sampler.stop()
        if result.get("missing"):
            self.close()  # a fit still running holds this Ray: the next run gets a new one
        else:
            result.update(memory)
        return result

    def close(self) -> None:
        """Stop the Ray this runner started."""
        if self.topology is not None:
            self.topology.stop()
            self.topology = None


def versions() -> dict:
    """The versions that matter for these numbers (read without importing the packages)."""
    out = {}
    for name in ("ray", "torch", "psutil", "matplotlib"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def run(args: argparse.Namespace, runner: Callable[[Spec], dict], command: str) -> dict:
    """Every planned measurement through ``runner``, then the summary: the report as written to JSON."""
    started = datetime.datetime.now()
    report: dict = {
        "command": command,
        "date": started.date().isoformat(),
        "started": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(),
        "options": {
            "impls": args.impls,
            "variants": args.variants,
            "topologies": args.topologies,
            "workers": args.workers,
            "upload_workers": args.upload_workers,
            "reports": args.reports,
            "ckpt_every": args.ckpt_every,
            "ckpt_mb": args.ckpt_mb,
            "upload_mb": args.upload_mb,
            "recovery_n": args.recovery_n,
            "recovery_workers": args.recovery_workers,
            "kill_delay_s": args.kill_delay_s,
            "fit_timeout_s": args.fit_timeout,
            "nodes": args.nodes,
            "node_cpus": args.node_cpus,
            "repeats": args.repeats,
            "step_s": args.step_s,
            "mode": "in-process, one Ray per topology (driver CPU includes the memory sampler)"
            if args.in_process
            else "a process and a fresh Ray per measurement",
        },
        "definitions": DEFINITIONS,
        "runs": [],
    }
    specs = plan(args)
    for index, spec in enumerate(specs, 1):
        began = time.perf_counter()
        result = runner(spec)
        report["runs"].append(
            {"spec": dataclasses.asdict(spec), "result": result, "wall_s": time.perf_counter() - began}
        )
        print(f"[{index}/{len(specs)}] {_line(spec, result)}", flush=True)
    report["took_s"] = (datetime.datetime.now() - started).total_seconds()
    report["summary"] = summarise(report["runs"])
    report["per_extra_worker_mb"] = per_extra_worker(report["summary"])
    report["recovery"] = [
        {
            **r["spec"],
            **{
                k: r["result"].get(k)
                for k in (
                    "recovery_s",
                    "recovery_all_ranks_in_s",
                    "resumed_at_step",
                    "last_committed_step",
                    "new_processes",
                    "recovery_cpu_s",
                    "worker_start_cpu_s",
                    "missing",
                )
            },
        }
        for r in report["runs"]
        if r["spec"]["variant"] == "recovery"
    ]
    return report


def _line(spec: Spec, result: dict) -> str:
    head = f"{spec.impl} {spec.topology} {spec.variant} N={spec.workers}:"
    if result.get("missing"):
        return f"{head} missing ({result.get('reason')})"
    keys = (
        "all_ranks_in_s",
        "first_report_s",
        "round_ms_p50",
        "ckpt_blocked_ms_p50",
        "recovery_s",
        "new_processes",
        "recovery_cpu_s",
        "peak_pss_mb",
        "nodes_used",
    )
    shown = " ".join(f"{k}={result[k]:.4g}" for k in keys if isinstance(result.get(k), (int, float)))
    return f"{head} {shown} structure={'ok' if result['structure']['ok'] else result['structure']['problems'][:2]}"


def write(report: dict, stem: pathlib.Path) -> list[pathlib.Path]:
    """``<stem>.json``, ``<stem>.md`` and ``<stem>.png``."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".json"), stem.with_suffix(".md"), stem.with_suffix(".png")]
    paths[0].write_text(json.dumps(report, indent=1))
    paths[1].write_text(markdown(report))
    plot(report, str(paths[2]))
    return paths


def main(argv: list[str] | None = None, runner: Callable[[Spec], dict] | None = None) -> dict:
    """Run the benchmark from a command line; ``runner`` overrides how one measurement runs."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.render is not None:
        report = json.loads(args.render.read_text())
        report["summary"] = summarise(report["runs"])
        report["per_extra_worker_mb"] = per_extra_worker(report["summary"])
        for path in write(report, args.out or args.render.with_suffix("")):
            print(f"wrote {path}")
        return report
    for name, value in (
        ("RAY_USAGE_STATS_ENABLED", "0"),
        ("DO_NOT_TRACK", "1"),
        ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"),
    ):
        os.environ.setdefault(name, value)
    command = "python -m benchmarks.scale " + " ".join(shlex.quote(a) for a in argv)
    own_runner = None
    if runner is None:
        runner = own_runner = InProcessRunner() if args.in_process else run_in_subprocess
    try:
        report = run(args, runner, command)
    finally:
        if isinstance(own_runner, InProcessRunner):
            own_runner.close()
    stem = args.out or RESULTS / f"scale-{report['date']}{'-quick' if args.quick else ''}"
    for path in write(report, stem):
        print(f"wrote {path}")
    return report


if __name__ == "__main__":
    main()
    sys.exit(0)
