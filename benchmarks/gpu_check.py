"""``make gpu-check``: run flowtrain's GPU paths on the CUDA GPUs of this machine.

    python -m benchmarks.gpu_check --out DIR              # every check, in under 8 minutes
    python -m benchmarks.gpu_check --out DIR --only nccl fsdp

Checks, each a PASS, FAIL or SKIP line: TorchTrainer with ``use_gpu=True`` over nccl (one worker
per GPU), two half-GPU workers over gloo (one-GPU machines), ``get_device``/``prepare_model``
placement, a checkpoint of GPU tensors resumed after a worker's SIGKILL, FSDP and AMP steps,
DeepSpeed ZeRO-2 (SKIP when deepspeed does not import) and a throughput comparison of the same
loop under raw torch, flowtrain and ``ray.train``. Writes ``gpu_check.json`` (every check) and
``throughput.json`` (samples/s and ratios) into DIR and exits 1 when any check failed.

Without a GPU it says so and exits 0. Each check runs in a process of its own (a Ray driver of
its own on one shared local Ray), under a time limit: a check that hangs is killed and failed,
and its Ray actors go with it before the next check starts.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback

from benchmarks.gpu_workloads import CHECKS

NO_GPU_MESSAGE = "gpu-check: no CUDA GPU found (torch.cuda.is_available() is False); nothing to check."
#: Default time for the whole run; the issue asks for under 8 minutes.
BUDGET_S = 450
#: A check that would get less time than this is not started.
MIN_CHECK_S = 20
#: CPU workers (--allow-cpu, 2 shared cores) are far slower than a GPU machine: limits stretch by this.
CPU_SLOWDOWN = 4
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_check_results", help="folder for gpu_check.json and throughput.json")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(CHECKS),
        metavar="CHECK",
        help=f"run only these checks, in the usual order ({', '.join(CHECKS)})",
    )
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="training seconds per implementation in the throughput comparison"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=BUDGET_S,
        help="time for the whole run; checks that no longer fit fail as not run",
    )
    # Testing only: without a GPU, run the same checks on CPU workers over gloo instead of exiting.
    parser.add_argument("--allow-cpu", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpu-workers", type=int, default=2, choices=(1, 2), help=argparse.SUPPRESS)
    # Internal: run one check in this process (the parent starts one such process per check).
    parser.add_argument("--child", choices=list(CHECKS), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--num-gpus", type=int, default=0, help=argparse.SUPPRESS)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: values that make no sense end the program with a usage error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error(f"--seconds {args.seconds}: must be > 0")
    if args.budget_s <= 0:
        parser.error(f"--budget-s {args.budget_s}: must be > 0")
    if args.child and not args.workdir:
        parser.error("--child needs --workdir")
    return args


# -- results: ratios, summary, JSON (pure; unit-tested) ----------------------------------------

#: Throughput ratios reported, as (numerator, denominator): above 1 means the numerator is faster.
RATIO_PAIRS = (
    ("flowtrain", "raw"),
    ("flowtrain", "ray.train"),
    ("ray.train", "raw"),
    ("raw", "raw_single"),
    ("flowtrain", "raw_single"),
)


def throughput_ratios(samples_per_s: dict[str, float]) -> dict[str, float]:
    """``"a/b"``: a's samples/s over b's, for each pair in RATIO_PAIRS where both were measured."""
    return {
        f"{a}/{b}": round(samples_per_s[a] / samples_per_s[b], 4)
        for a, b in RATIO_PAIRS
        if samples_per_s.get(a) and samples_per_s.get(b)
    }


def throughput_report(details: dict) -> dict:
    """The throughput check's details as written to throughput.json: samples/s, ratios, errors."""
    measured = details.get("measured", {})
    samples = {impl: round(m["samples_per_s"], 1) for impl, m in measured.items()}
    return {
        "samples_per_s": samples,
        "ratios": throughput_ratios(samples),
        "measured": measured,
        "errors": details.get("errors", {}),
        "seconds_per_run": details.get("seconds_per_run"),
    }


def summary_lines(results: list[dict], elapsed_s: float) -> list[str]:
    """One line per check, then the counts."""
    lines = [
        f"  {r['status']:<4}  {r['name']:<18} {r['seconds']:7.1f} s  {r.get('error') or ''}".rstrip() for r in results
    ]
    counts = {status: sum(r["status"] == status for r in results) for status in ("PASS", "FAIL", "SKIP")}
    lines.append(
        f"gpu-check: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped in {elapsed_s:.1f} s"
    )
    return lines


def exit_code(results: list[dict]) -> int:
    """1 when any check failed (or none ran), else 0; a SKIP is not a failure."""
    if not results or any(r["status"] == "FAIL" for r in results):
        return 1
    return 0


def write_reports(out: str, environment: dict, results: list[dict]) -> list[str]:
    """gpu_check.json (environment and every check) and, when the throughput check ran,
    throughput.json. Returns the paths written."""
    os.makedirs(out, exist_ok=True)
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "environment": environment,
        "checks": results,
    }
    paths = [os.path.join(out, "gpu_check.json")]
    with open(paths[0], "w") as f:
        json.dump(report, f, indent=2, default=str)
    for result in results:
        if result["name"] == "throughput" and result.get("details"):
            paths.append(os.path.join(out, "throughput.json"))
            with open(paths[-1], "w") as f:
                json.dump(
                    {
                        "date": report["date"],
                        "environment": environment,
                        "status": result["status"],
                        **throughput_report(result["details"]),
                    },
                    f,
                    indent=2,
                )
    return paths


# -- the child: one check in this process ----------------------------------------------------


def _result_path(workdir: str, name: str) -> str:
    return os.path.join(workdir, f"result-{name}.json")


def run_child(args: argparse.Namespace) -> int:
    """Run check ``args.child`` and write its result where the parent reads it."""
    from benchmarks.gpu_workloads import CheckFailed, Setup, Skipped

    setup = Setup(
        use_gpu=args.num_gpus > 0,
        num_gpus=args.num_gpus,
        workdir=args.workdir,
        seconds=args.seconds,
        cpu_workers=args.cpu_workers,
    )
    check, _ = CHECKS[args.child]
    started = time.perf_counter()
    result: dict = {"name": args.child, "details": {}}
    try:
        import ray

        from trainers.worker_output import install

        ray.init(address=os.environ.get("RAY_ADDRESS") or None, log_to_driver=True)  # the parent's Ray
        install()  # as fit() does when it starts Ray: worker lines go to the check's captured output
        result.update(status="PASS", details=check(setup))
    except Skipped as skipped:
        result.update(status="SKIP", error=str(skipped))
    except CheckFailed as failed:
        result.update(status="FAIL", error=str(failed), details=failed.details)
    except Exception as error:  # noqa: BLE001 - any failure of a check is its FAIL row, with the traceback
        result.update(status="FAIL", error=f"{type(error).__name__}: {error}", traceback=traceback.format_exc()[-6000:])
    result["seconds"] = round(time.perf_counter() - started, 1)
    with open(_result_path(args.workdir, args.child), "w") as f:
        json.dump(result, f, default=str)
    return 0


# -- the parent: Ray, one process per check, the report --------------------------------------


def environment(num_gpus: int) -> dict:
    """What ran the checks: Python, torch and CUDA, the GPUs, Ray, DeepSpeed."""
    import torch

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(num_gpus)],
        "cpus": os.cpu_count(),
        "ray": version("ray"),
        "deepspeed": version("deepspeed"),
    }


def _wait_for_idle_ray(timeout_s: float = 30.0) -> None:
    """Until the previous check's actors are gone (every CPU and GPU free again), at most ``timeout_s``."""
    import ray

    total = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        free = ray.available_resources()
        if all(free.get(k, 0) >= v for k, v in total.items()):
            return
        time.sleep(0.2)
    print(
        f"[gpu-check] note: Ray still holds resources after {timeout_s:.0f} s: {ray.available_resources()} of {total}",
        flush=True,
    )


def _first_sentence(doc: str | None) -> str:
    text = " ".join((doc or "").split())
    return text.split(". ")[0].rstrip(".") + "."


def _run_one(
    name: str, limit_s: float, args: argparse.Namespace, num_gpus: int, workdir: str, ray_address: str
) -> dict:
    """Run check ``name`` in a child process; kill it (and fail the check) after ``limit_s``."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.gpu_check",
        "--child",
        name,
        "--workdir",
        workdir,
        "--num-gpus",
        str(num_gpus),
        "--seconds",
        str(args.seconds),
        "--cpu-workers",
        str(args.cpu_workers),
    ]
    env = dict(
        os.environ,
        RAY_ADDRESS=ray_address,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p),
    )
    started = time.perf_counter()
    child = subprocess.Popen(command, env=env, cwd=REPO_ROOT, start_new_session=True)
    try:
        code = child.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the check and anything it started (torch.multiprocessing)
        child.wait()
        return {
            "name": name,
            "status": "FAIL",
            "seconds": round(time.perf_counter() - started, 1),
            "error": f"timed out after {limit_s:.0f} s and was killed",
            "details": {},
        }
    path = _result_path(workdir, name)
    if not os.path.exists(path):
        return {
            "name": name,
            "status": "FAIL",
            "seconds": round(time.perf_counter() - started, 1),
            "error": f"the check's process exited with code {code} without a result",
            "details": {},
        }
    with open(path) as f:
        return json.load(f)


def run_checks(args: argparse.Namespace, num_gpus: int) -> list[dict]:
    """Start Ray once, then every selected check in a process of its own, within the budget."""
    import ray

    use_gpu = num_gpus > 0
    names = [name for name in CHECKS if not args.only or name in args.only]
    deadline = time.monotonic() + args.budget_s
    results = []
    workdir = tempfile.mkdtemp(prefix="gpu-check-")
    started = time.perf_counter()
    # A small object store: the checks pass no data through it, and it need not fit /dev/shm's default.
    ray.init(
        address="local",
        num_cpus=max(4, os.cpu_count() or 1),
        num_gpus=num_gpus,
        object_store_memory=2 * 2**30,
        include_dashboard=False,
        log_to_driver=False,
    )
    address = ray.get_runtime_context().gcs_address
    print(
        f"[gpu-check] Ray started in {time.perf_counter() - started:.1f} s at {address}: {ray.cluster_resources()}",
        flush=True,
    )
    try:
        for name in names:
            check, limit_s = CHECKS[name]
            limit_s = min(limit_s * (1 if use_gpu else CPU_SLOWDOWN), deadline - time.monotonic())
            if limit_s < MIN_CHECK_S:
                result = {
                    "name": name,
                    "status": "FAIL",
                    "seconds": 0.0,
                    "details": {},
                    "error": f"not run: the time budget (--budget-s {args.budget_s:.0f}) was used up",
                }
            else:
                print(f"[gpu-check] ---- {name}: {_first_sentence(check.__doc__)} (limit {limit_s:.0f} s)", flush=True)
                result = _run_one(name, limit_s, args, num_gpus, workdir, address)
                _wait_for_idle_ray()
            results.append(result)
            detail = result.get("error") or json.dumps(result.get("details"), default=str)[:400]
            print(f"[gpu-check] {result['status']} {name} ({result['seconds']:.1f} s): {detail}", flush=True)
            if result.get("traceback"):
                print(result["traceback"], flush=True)
    finally:
        ray.shutdown()
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return run_child(args)
    import torch

    if torch.cuda.is_available():
        num_gpus = torch.cuda.device_count()
    elif args.allow_cpu:
        num_gpus = 0
        print("gpu-check: no CUDA GPU found; --allow-cpu: running the checks on CPU workers over gloo.", flush=True)
    else:
        print(NO_GPU_MESSAGE, flush=True)
        return 0
    env = environment(num_gpus)
    print(f"[gpu-check] {json.dumps(env)}", flush=True)
    started = time.perf_counter()
    results = run_checks(args, num_gpus)
    elapsed = time.perf_counter() - started
    paths = write_reports(args.out, env, results)
    print("\n".join(summary_lines(results, elapsed)), flush=True)
    print(f"gpu-check: wrote {', '.join(paths)}", flush=True)
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
