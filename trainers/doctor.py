"""Check a Ray cluster from the driver before the first run on it: ``python -m trainers.doctor``.

One line per check (``ok``, ``FAIL`` or ``skip``), the fix under each failure, and a non-zero exit
status when any check failed; ``run_doctor()`` does the same from Python and returns a
``DoctorReport``. The checks, their options and their fixes: docs/doctor.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from storage.codec import Record
from storage.filesystem import resolve_filesystem
from trainers._internal.cluster_checks import (
    CheckResult,
    NodeFacts,
    NodeProbe,
    Status,
    auth_failure,
    auth_ok,
    clean_up,
    prefect_check,
    probe_node,
    process_facts,
    read_back,
    read_probes,
    remove_probes,
    resource_checks,
    storage_checks,
    tcp_problem,
    version_checks,
    write_probe,
)
from trainers._internal.ray_init import is_auth_failure
from trainers._internal.workers.resources import check_feasible
from trainers.config import ScalingConfig
from trainers.errors import InsufficientResourcesError

__all__ = ["CheckResult", "DoctorReport", "NodeFacts", "main", "run_doctor"]


@dataclasses.dataclass(frozen=True)
class DoctorReport(Record):
    """Everything one doctor run found: its checks in the order they ran, the driver's facts and
    each alive node's that answered."""

    checks: tuple[CheckResult, ...]
    driver: NodeFacts
    nodes: tuple[NodeFacts, ...]

    @property
    def failed(self) -> list[CheckResult]:
        """The checks that failed."""
        return [check for check in self.checks if check.status == "FAIL"]

    @property
    def exit_code(self) -> int:
        """``1`` when any check failed, else ``0``."""
        return 1 if self.failed else 0

    def lines(self) -> list[str]:
        """The report as a person reads it: a line per check, a fix under each failure, a summary."""
        text = [line for check in self.checks for line in check.lines()]
        count = len(self.failed)
        text.append(f"{count} check(s) failed" if count else "every check passed")
        return text

    def to_json(self) -> dict[str, Any]:
        """The report as ``--json`` prints it: its fields, and how many checks failed."""
        return {**super().to_json(), "failed": len(self.failed)}


def run_doctor(
    *,
    address: str | None = None,
    storage_path: str | None = None,
    prefect_api_url: str | None = None,
    scaling: ScalingConfig | None = None,
    timeout_s: float = 60.0,
) -> DoctorReport:
    """Run every check and return what it found; raises nothing for a failed check.

    ``address`` defaults to ``RAY_ADDRESS``; with neither, a local Ray is started and checked
    (there is no cluster to check). A process already connected to Ray is checked through that
    connection. ``prefect_api_url`` defaults to ``PREFECT_API_URL`` (skipped when neither is
    set). ``timeout_s`` bounds each round of node tasks and the network checks' waits.
    """
    address = address or os.environ.get("RAY_ADDRESS") or None
    prefect_api_url = prefect_api_url or os.environ.get("PREFECT_API_URL") or None
    driver = process_facts("driver")
    checks, joined = _connect(address, timeout_s=min(timeout_s, 5.0))
    nodes: tuple[NodeFacts, ...] = ()
    try:
        if joined is not None:
            nodes, node_checks = _check_nodes(storage_path, scaling, driver, timeout_s)
            checks.extend(node_checks)
        else:
            for name in ("node", "storage") + (("scaling",) if scaling else ()):
                checks.append(CheckResult(name=name, status="skip", found="not connected to a cluster"))
    finally:
        if joined:
            ray.shutdown()
    checks.append(prefect_check(prefect_api_url, timeout_s=min(timeout_s, 5.0)))
    return DoctorReport(checks=tuple(checks), driver=driver, nodes=nodes)


def _connect(address: str | None, *, timeout_s: float) -> tuple[list[CheckResult], bool | None]:
    """The ``connect`` and ``auth`` lines, and whether Ray was joined here (True: shut it down
    after), was joined already (False), or could not be joined (None)."""

    def lines(status: Status, found: str, auth: CheckResult | str, fix: str = "") -> list[CheckResult]:
        """The ``connect`` line and the ``auth`` line (a reason it was skipped, as text)."""
        if isinstance(auth, str):
            auth = CheckResult(name="auth", status="skip", found=auth)
        return [CheckResult(name="connect", status=status, found=found, fix=fix), auth]

    if ray.is_initialized():
        where = ray.get_runtime_context().gcs_address
        return lines("ok", f"this process is connected to Ray already ({where})", "joined before the doctor ran"), False
    if address is None:
        ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        found = "no --address and no RAY_ADDRESS: no cluster to check, so a local Ray was started and is checked"
        return lines("skip", found, "a local Ray trusts its own processes"), True
    fix = (
        "start the head there (ray start --head --port=...), or give the head's address (--address or RAY_ADDRESS, "
        "e.g. 10.0.0.1:6379), and open that port and Ray's node ports to this machine"
    )
    problem = tcp_problem(address, timeout_s)
    if problem:
        return lines("FAIL", problem, "nothing to join", fix), None
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except Exception as error:  # noqa: BLE001 - every way of failing to join is a finding
        if is_auth_failure(error):
            found = f"{address} refused this process for its token"
            token_fix = "give this process the cluster's token (the auth check below)"
            return lines("FAIL", found, auth_failure(address, error), token_fix), None
        return lines("FAIL", f"joining {address}: {type(error).__name__}: {error}", "not joined", fix), None
    alive = sum(1 for node in ray.nodes() if node.get("Alive"))
    return lines("ok", f"joined {address}: {alive} alive node(s)", auth_ok(address)), True


def _on_node(remote: Any, node_id: str) -> Any:
    return remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))


def _gather(refs: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    """Each node's task result, or the text of why it has none (an error, or no answer in time)."""
    if not refs:
        return {}
    done = set(ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)[0])
    out: dict[str, Any] = {}
    for node_id, ref in refs.items():
        if ref not in done:
            ray.cancel(ref, force=True)
            out[node_id] = f"its task did not run within {timeout_s:g} s (no worker process could start there?)"
            continue
        try:
            out[node_id] = ray.get(ref)
        except Exception as error:  # noqa: BLE001 - the node's failure is the finding
            cause = getattr(error, "cause", None) or error
            out[node_id] = f"its task failed: {type(cause).__name__}: {str(cause).strip().splitlines()[-1]}"
    return out


def _node_failure(label: str, why: str) -> CheckResult:
    missing = "No module named 'trainers'" in why or "No module named 'storage'" in why
    fix = (
        "install flowtrain on every node (the same version as the driver, e.g. in the nodes' image)"
        if missing
        else "read that node's Ray logs (/tmp/ray/session_latest/logs/raylet.err and worker-*.err on it)"
    )
    return CheckResult(name="node", status="FAIL", found=why, fix=fix, where=label)


def _check_nodes(
    storage_path: str | None, scaling: ScalingConfig | None, driver: NodeFacts, timeout_s: float
) -> tuple[tuple[NodeFacts, ...], list[CheckResult]]:
    alive = [node for node in ray.nodes() if node.get("Alive")]
    token = secrets.token_hex(4)
    names = {node["NodeID"]: f"{node['NodeID'][:12]}-{token}" for node in alive}
    storage_problem = _storage_path_problem(storage_path) if storage_path else None
    storage_path = None if storage_problem else storage_path
    # Who wrote which probe file (the driver first), and why one could not be written.
    written = {driver.label(): (driver, *write_probe(storage_path, f"driver-{token}"))} if storage_path else {}
    probes = _gather({n: _on_node(probe_node, n).remote(storage_path, names[n]) for n in names}, timeout_s)

    checks: list[CheckResult] = []
    facts: dict[str, NodeFacts] = {}
    for node in alive:
        probe = probes[node["NodeID"]]
        if not isinstance(probe, NodeProbe):
            label = f"node {node.get('NodeManagerAddress', '?')} ({node.get('NodeManagerHostname', '?')}, {node['NodeID'][:8]})"
            checks.append(_node_failure(label, probe))
            continue
        facts[node["NodeID"]] = dataclasses.replace(probe.facts, resources=dict(node["Resources"]))
        written[probe.facts.label()] = (probe.facts, probe.written, probe.write_error)
    found = tuple(facts.values())
    checks.extend(version_checks(driver, found))
    checks.extend(resource_checks(found))
    if scaling is not None:
        checks.append(_scaling_check(scaling, found))
    if storage_path:
        checks.extend(_storage_round_trip(storage_path, written, facts, timeout_s))
    else:
        checks.append(storage_problem or CheckResult(name="storage", status="skip", found="no --storage-path given"))
    return found, checks


def _storage_path_problem(storage_path: str) -> CheckResult | None:
    """A ``storage`` failure when the path names nothing a process could write to, else None."""
    try:
        resolve_filesystem(storage_path)
    except ValueError as error:  # a relative path, or a scheme nothing installed reads
        fix = "give an absolute path, or a URI that pyarrow.fs or an installed fsspec filesystem knows"
        return CheckResult(name="storage", status="FAIL", found=str(error), fix=fix)
    return None


def _scaling_check(scaling: ScalingConfig, nodes: Sequence[NodeFacts]) -> CheckResult:
    bundle = ", ".join(f"{name}: {amount:g}" for name, amount in sorted(scaling.worker_resources.items()))
    asked = f"{scaling.num_workers} worker(s) x {{{bundle}}}"
    try:
        check_feasible(scaling, [node.resources for node in nodes])
    except InsufficientResourcesError as error:
        fix = "lower --num-workers or --resources-per-worker, or add nodes with those resources"
        return CheckResult(name="scaling", status="FAIL", found=str(error).rsplit(". ", 1)[0], fix=fix)
    return CheckResult(name="scaling", status="ok", found=f"{asked} fit the {len(nodes)} node(s)")


def _storage_round_trip(
    storage_path: str,
    written: dict[str, tuple[NodeFacts, str, str]],
    facts: Mapping[str, NodeFacts],
    timeout_s: float,
) -> list[CheckResult]:
    """Every process reads back the files the others wrote; then the files are removed (by the
    driver where it sees them, by their node where only it does)."""
    paths = {label: path for label, (_, path, _) in written.items() if path}

    def others(label: str) -> list[str]:
        return [path for who, path in paths.items() if who != label]

    driver_label = next(iter(written))
    read_errors = {driver_label: read_probes(storage_path, others(driver_label))}
    labels = {node_id: node.label() for node_id, node in facts.items()}
    reads = _gather(
        {n: _on_node(read_back, n).remote(storage_path, others(label)) for n, label in labels.items()}, timeout_s
    )
    for node_id, errors in reads.items():
        read_errors[labels[node_id]] = errors if isinstance(errors, dict) else {"(every file)": errors}
    checks = storage_checks(storage_path, written, read_errors)

    left = set(remove_probes(storage_path, list(paths.values())))
    owners = {n: paths[label] for n, label in labels.items() if paths.get(label) in left}
    _gather({n: _on_node(clean_up, n).remote(storage_path, [path]) for n, path in owners.items()}, timeout_s)
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: print the report; return 1 when a check failed, 0 otherwise."""
    parser = argparse.ArgumentParser(
        prog="python -m trainers.doctor",
        description="Check a Ray cluster from the driver before the first flowtrain run on it.",
    )
    parser.add_argument("--address", help="the cluster's address (head:6379, ray://head:10001); default RAY_ADDRESS")
    parser.add_argument("--storage-path", help="the storage_path runs will use: an absolute path or a pyarrow.fs URI")
    parser.add_argument("--prefect-api-url", help="the Prefect API to check (default PREFECT_API_URL)")
    parser.add_argument("--num-workers", type=int, help="check that this many workers fit the cluster")
    parser.add_argument("--use-gpu", action="store_true", help="with --num-workers: one GPU per worker")
    parser.add_argument(
        "--resources-per-worker", type=json.loads, help='with --num-workers: JSON, e.g. \'{"CPU": 2, "GPU": 1}\''
    )
    parser.add_argument("--timeout-s", type=float, default=60.0, help="how long to wait for each round of node tasks")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (DoctorReport.to_json())")
    args = parser.parse_args(argv)
    scaling = None
    if args.num_workers is not None:
        try:
            scaling = ScalingConfig(
                num_workers=args.num_workers, use_gpu=args.use_gpu, resources_per_worker=args.resources_per_worker
            )
        except (TypeError, ValueError) as error:
            parser.error(str(error))
    elif args.use_gpu or args.resources_per_worker:
        parser.error("--use-gpu and --resources-per-worker describe workers: give --num-workers too")
    report = run_doctor(
        address=args.address,
        storage_path=args.storage_path,
        prefect_api_url=args.prefect_api_url,
        scaling=scaling,
        timeout_s=args.timeout_s,
    )
    print(json.dumps(report.to_json(), indent=2) if args.json else "\n".join(report.lines()))
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
