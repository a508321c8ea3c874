"""The chaos soak on hosts with their own addresses: ``python -m benchmarks.chaos --hosts N``.

The hosts are network namespaces on this machine (``benchmarks.hosts``), built as the namespace
cluster tests build theirs: a head host with 0 CPUs, where Ray's head and the drivers run (as under
Ray Jobs), a store host with the S3 server every run keeps its checkpoints on (moto, reached over the
bridge), and ``N`` hosts of one CPU each for the workers: the world size is ``N - 1``, one host spare.
Ray runs with its default health-check settings (nothing sets ``RAY_health_check_*``) and nobody sets
``GLOO_SOCKET_IFNAME``.

This process (the "outer" one) builds the hosts and starts Ray and S3 on them, then runs the soak
itself on the head host (``--inside``: a process there reaches Ray and S3 as a driver does) and,
whatever became of it, kills every process on the hosts and removes them; a process or namespace
left behind then is a broken invariant. The soak inside is ``chaos_soak.Soak`` with ``HostSoak``'s
cluster and checks and ``HostNemesis`` striking the host kinds (``chaos_schedule.HOST``), each in
a thread of its own so that they overlap: a host's link cut and healed, its raylet or every process
on it killed, its link slowed or made lossy, the path between it and the driver's host cut. The
kinds that end a host's Ray node are undone once the run has replaced the ranks (or has ended) and
Ray is started on the host again, one such fault at a time (the spare host holds one host's ranks).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from benchmarks import chaos_check, chaos_journal, chaos_storage
from benchmarks.chaos_schedule import HOST, KINDS, Fault, RunPlan
from benchmarks.chaos_soak import RunReport, Settings, Soak
from benchmarks.hosts import Host, RayHosts, can_make_namespaces

ROOT = pathlib.Path(__file__).resolve().parent.parent
S3_PORT = 9000
#: The hosts' subnet (inside their namespaces only).
SUBNET = "10.214.0"
#: Host kinds that end the struck host's Ray node (or may: a cut until Ray declares it dead).
NODE_ENDING = frozenset({"partition", "host-kill", "raylet-kill", "driver-cut"})
#: Host kinds that slow a host's link (through its relay: one at a time on a host).
SLOW_KINDS = frozenset({"link-slow", "link-lossy"})


@dataclasses.dataclass(frozen=True)
class HostSettings:
    """The soak on hosts' own options."""

    #: Hosts of one CPU each for the workers (the world size is one less).
    hosts: int = 3
    #: The bound a partitioned rank is to be found within (issue 61's second half); a link cut
    #: is drawn shorter (a blip) or longer than it.
    detect_s: float = 5.0
    #: The longest a cut or dead host waits for the run to replace its ranks before it is healed
    #: (and started again) all the same.
    partition_max_s: float = 180.0


def host_kinds() -> list[str]:
    """The kinds the soak on hosts draws by default: the host kinds and the old ones but for
    ``node-loss`` (``cluster_utils``'s; a host's loss is what the host kinds are)."""
    return [k for k, kind in KINDS.items() if not kind.opt_in and k != "node-loss"]


class HostSoak(Soak):
    """``Soak`` on the namespace hosts; runs on the head host (see the module's docstring)."""

    def __init__(
        self,
        settings: Settings,
        work: str,
        cluster: RayHosts,
        endpoint: str,
        host_settings: HostSettings,
        say: Callable[[str], None] = print,
    ) -> None:
        super().__init__(settings, work, say)
        self.hosts = cluster
        self.endpoint = endpoint
        self.host_settings = host_settings
        self.inner = chaos_storage.s3_filesystem(endpoint)
        workers = [h for h, cpus in zip(cluster.net.hosts, cluster.cpus, strict=True) if cpus]
        self.worker_hosts = workers
        #: Guards ``ending``, ``cuts`` and the hosts' relays.
        self.state = threading.Lock()
        #: Hosts a node-ending fault holds (until their Ray node is started again): no other
        #: fault strikes them meanwhile.
        self.ending: set[str] = set()
        #: Hosts a slow or lossy link's fault holds (one relay a host).
        self.slowed: set[str] = set()
        #: Link cuts in force per host: its link is healed when the last one ends.
        self.cuts: dict[str, int] = {}
        #: The spare hosts: that many node-ending faults at a time, so the run has hosts to go to.
        self.capacity = threading.Semaphore(max(1, len(workers) - settings.world_size))

    def __enter__(self) -> HostSoak:
        import ray

        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        ray.init(address=self.hosts.address, log_to_driver=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        import ray

        ray.shutdown()

    @property
    def ray_address(self) -> str:
        return self.hosts.address

    def nemesis(self, plan: RunPlan, folder: pathlib.Path, already: set[int]) -> HostNemesis:
        self.ensure_nodes()
        return HostNemesis(self, plan, folder, already)

    # -- bounds ----------------------------------------------------------------------------------

    def allowance_s(self, faults: list[Fault]) -> float:
        """What ``faults`` may add to a run's wall time: each kind's ``allow_s`` and its hold."""
        return sum(KINDS[f.kind].allow_s + f.hold_s for f in faults)

    def deadline_s(self, plan: RunPlan) -> float:
        """Past the wall-time bound (``run_checks``), so that a run that misses it still ends and
        is checked; a hang is found sooner by ``stall_for``."""
        return self.settings.deadline_s + 3 * self.unit_s + 1.5 * self.allowance_s(list(plan.faults))

    def stall_for(self, plan: RunPlan) -> float:
        """The longest two of ``plan``'s faults may hold the run, back to back, and time for a restart."""
        longest = sorted((KINDS[f.kind].allow_s + f.hold_s for f in plan.faults), reverse=True)[:2]
        return self.settings.deadline_s + 2 * self.unit_s + sum(longest)

    def run_bound_s(self, faults: list[Fault]) -> float:
        """A run's wall time may be its fault-free time (half as much again on a loaded machine)
        plus 30 s (a new driver) plus each fired fault's allowance."""
        return 1.5 * self.unit_s + self.settings.deadline_s + self.allowance_s(faults)

    # -- checks ----------------------------------------------------------------------------------

    def run_checks(self, plan: RunPlan, report: RunReport) -> list[str]:
        fired = [f for segment, _ in report.segments for f in segment.fired]
        wall = sum(segment.seconds for segment, _ in report.segments)
        bound = self.run_bound_s(fired)
        if wall <= bound:
            return []
        kinds = ", ".join(f"{f.kind}@{f.step}" for f in fired) or "none"
        return [
            f"wall time: {wall:.0f} s, over the bound of {bound:.0f} s (the fault-free run's {self.unit_s:.0f} s "
            f"and the allowances of {kinds})"
        ]

    def extra_checks(self, result: Any, journal: list[dict], rank_lines: list[list[dict]]) -> list[str]:
        return chaos_check.fenced(result, journal, rank_lines) + chaos_check.fenced_rounds(journal, rank_lines)

    def exempt_rounds(
        self, plan: RunPlan, folder: pathlib.Path, journal: list[dict], rank_lines: list[list[dict]]
    ) -> set[tuple[int, int]]:
        """A host fault followed by a restart may take with the attempt it ended the reports its
        cut or killed ranks had sent and not had acknowledged: the rounds of that attempt after
        the last one committed before the strike. (Such a rank's later reports belong to an ended
        attempt; ``fenced`` checks none was committed.)"""
        marks = str(folder / "marks")
        restarts = [line["t"] for line in journal if line["e"] == "restart"]
        commits = [line for line in journal if line["e"] == "commit"]
        starts = [line for lines in rank_lines for line in lines if line["e"] == "start"]
        exempt: set[tuple[int, int]] = set()
        for fault in plan.faults:
            struck = chaos_check.struck_at(marks, fault)
            if KINDS[fault.kind].by != HOST or struck is None:
                continue
            if not any(struck < t <= struck + fault.hold_s + KINDS[fault.kind].allow_s for t in restarts):
                continue
            attempt = max((line["attempt"] for line in starts if line["t"] <= struck), default=0)
            before = [line["step"] for line in commits if line["t"] <= struck]
            top = before[-1] if before else -1
            exempt |= {(attempt, step) for step in range(top + 1, self.settings.steps)}
        return exempt

    # -- hosts -----------------------------------------------------------------------------------

    def host_of_rank(self, folder: pathlib.Path, rank: int, journal: list[dict[str, Any]]) -> Host | None:
        """The host rank ``rank`` of the run in ``folder`` started on last; None while it has not
        started, or has not started again since a restart in ``journal`` (the driver's) moved it."""
        starts = [
            line for line in chaos_journal.read(str(folder / "logs" / f"rank{rank}.jsonl")) if line["e"] == "start"
        ]
        moving = any(
            line["e"] == "restart"
            and line["t"] > starts[-1]["t"]
            and (line.get("full_restart") or str(rank) in {str(r) for r in line.get("replaced") or ()})
            for line in journal
            if starts
        )
        return self.hosts.net.host_at(starts[-1]["node"]) if starts and not moving else None

    def node_alive(self, host: Host) -> bool:
        """Whether Ray has a live node at ``host``'s address."""
        import ray

        return any(n["Alive"] and n["NodeManagerAddress"] == host.address for n in ray.nodes())

    def restart_node(self, host: Host) -> None:
        """Start ``host`` again: every process on it killed, then ``ray start`` (a rebooted host,
        its link no longer slowed: the relay that slowed it was one of its processes)."""
        with self.state:
            if self.hosts.net.impaired(host):
                self.hosts.net.unimpair(host)
            self.hosts.net.kill_all(host)
        self.hosts.start_node(host)

    def ensure_nodes(self) -> None:
        """Every worker host has a live Ray node (one a fault ended is started again); called
        between segments, when no fault is in force."""
        for host in self.worker_hosts:
            if not self.node_alive(host):
                self.say(f"    {host.address}: no live Ray node; started again")
                self.restart_node(host)

    def cut(self, host: Host) -> None:
        """Cut ``host``'s link (another fault's cut may be in force already)."""
        with self.state:
            self.cuts[host.netns] = self.cuts.get(host.netns, 0) + 1
            if self.cuts[host.netns] == 1:
                self.hosts.net.partition(host)

    def heal(self, host: Host) -> None:
        """End one cut of ``host``'s link: the link is up once none is left."""
        with self.state:
            self.cuts[host.netns] -= 1
            if not self.cuts[host.netns]:
                self.hosts.net.heal(host)


class HostNemesis:
    """Strikes a segment's driver kill (at once) and host faults (each in a thread) when the run
    has committed their step; ``close`` undoes what is still in force."""

    def __init__(self, soak: HostSoak, plan: RunPlan, folder: pathlib.Path, already: set[int]) -> None:
        self.soak = soak
        self.folder = folder
        self.marks = str(folder / "marks")
        self.pending = [f for f in plan.faults if KINDS[f.kind].by in ("soak", HOST) and f.id not in already]
        self.lines: list[dict[str, Any]] = []
        self.closing = threading.Event()
        self.threads: list[threading.Thread] = []

    def step(self, lines: list[dict[str, Any]]) -> bool:
        self.lines = lines
        top = max((line["step"] for line in lines if line["e"] == "commit"), default=-1)
        while self.pending and top >= self.pending[0].step:
            fault = self.pending.pop(0)
            if fault.kind == "driver-kill":
                time.sleep(fault.detail)
                chaos_journal.fire(self.marks, fault.id)
                return True
            thread = threading.Thread(target=self._strike, args=(fault,), name=f"nemesis-{fault.id}", daemon=True)
            thread.start()
            self.threads.append(thread)
        return False

    def close(self) -> None:
        self.closing.set()
        for thread in self.threads:
            thread.join()

    def _strike(self, fault: Fault) -> None:
        try:
            self._strike_once(fault)
        except Exception as error:  # noqa: BLE001 - the soak's own failure: said, and the fault counts as not fired
            self.soak.say(f"    nemesis: {fault.kind}@{fault.step} failed: {type(error).__name__}: {error}")

    def _strike_once(self, fault: Fault) -> None:
        soak = self.soak
        time.sleep(fault.detail)
        ending = fault.kind in NODE_ENDING
        if ending and not self._acquire(soak.capacity):
            return
        try:
            host = self._claim_rank_host(fault)
            if host is None:  # the segment ended first: the fault did not fire
                return
            try:
                chaos_journal.fire(self.marks, fault.id)
                struck = time.time()
                note = self._do(fault, host, struck)
                soak.say(f"    {fault.kind}@{fault.step} on {host.address}: {note}")
            finally:
                with soak.state:
                    if ending:
                        soak.ending.discard(host.netns)
                    elif fault.kind in SLOW_KINDS:
                        soak.slowed.discard(host.netns)
        finally:
            if ending:
                soak.capacity.release()

    def _do(self, fault: Fault, host: Host, struck: float) -> str:
        """Strike ``fault`` on ``host``, wait, undo; what happened, in words."""
        soak, net = self.soak, self.soak.hosts.net
        kind = fault.kind
        if kind in ("link-blip", "link-cut"):
            soak.cut(host)
            self.closing.wait(fault.hold_s)
            soak.heal(host)
            return f"cut for {time.time() - struck:.1f} s"
        if kind in SLOW_KINDS:
            delay, loss = (fault.amount, 0.0) if kind == "link-slow" else (0.0, fault.amount)
            net.impair(host, delay_s=delay, loss=loss, seed=fault.id)
            self.closing.wait(fault.hold_s)
            with soak.state:
                counts = net.unimpair(host)
            return f"delay {delay * 1000:.0f} ms, loss {loss:.0%} for {time.time() - struck:.1f} s ({counts})"
        if kind == "partition":
            soak.cut(host)
            why = self._wait_replaced(struck, fault.rank)
            soak.heal(host)
            return f"cut for {time.time() - struck:.1f} s ({why}){self._repair_if_dead(host)}"
        if kind == "host-kill":
            soak.cut(host)
            with soak.state:  # its relay, if its link is slow, dies with it (restart_node removes its redirect)
                killed = net.kill_all(host)
            why = self._wait_replaced(struck, fault.rank)
            soak.heal(host)
            soak.restart_node(host)
            return f"{len(killed)} processes killed, down for {time.time() - struck:.1f} s ({why}); Ray started again"
        if kind == "raylet-kill":
            raylets = soak.hosts.raylet_pids(host)
            for pid in raylets:
                os.kill(pid, signal.SIGKILL)
            why = self._wait_replaced(struck, fault.rank)
            soak.restart_node(host)
            return f"raylet {raylets} killed ({why}); Ray started again after {time.time() - struck:.1f} s"
        if kind == "driver-cut":
            head = soak.hosts.head
            net.cut_between(head, host)
            why = self._wait_replaced(struck, fault.rank)
            net.join_between(head, host)
            return f"cut from {head.address} for {time.time() - struck:.1f} s ({why}){self._repair_if_dead(host)}"
        raise ValueError(f"not a host kind: {kind!r}")

    def _wait_replaced(self, struck: float, rank: int) -> str:
        """Wait until the run replaced rank ``rank`` after ``struck`` (or restarted every worker),
        ended, or ``partition_max_s`` passed; which."""
        deadline = struck + self.soak.host_settings.partition_max_s
        while True:
            for line in self.lines:
                if line["e"] == "restart" and line["t"] > struck:
                    replaced = {str(r) for r in line.get("replaced") or ()}
                    if line.get("full_restart") or str(rank) in replaced:
                        return f"rank {rank} replaced"
            if self.closing.is_set():
                return "the run ended"
            if time.time() > deadline:
                return f"rank {rank} not replaced in {self.soak.host_settings.partition_max_s:.0f} s"
            time.sleep(0.1)

    def _repair_if_dead(self, host: Host) -> str:
        """Once healed: when Ray declared the host's node dead meanwhile (its raylet then ends
        itself), start Ray on it again."""
        time.sleep(3)  # the health check that was under way when the link came back
        if self.soak.node_alive(host):
            return "; its node lived on"
        self.soak.restart_node(host)
        return "; Ray had declared its node dead: started again"

    def _acquire(self, lock: Any) -> bool:
        while not lock.acquire(timeout=0.2):
            if self.closing.is_set():
                return False
        return True

    def _claim_rank_host(self, fault: Fault) -> Host | None:
        """The host ``fault``'s rank runs on, once no node-ending fault holds it (the rank may
        move meanwhile) and, for a slow or lossy link, once no other one slows it; a node-ending
        fault claims it for itself. None when the segment ended first."""
        soak = self.soak
        while not self.closing.is_set():
            host = soak.host_of_rank(self.folder, fault.rank, self.lines)
            if host is None:  # not started (again) yet
                time.sleep(0.2)
                continue
            slows = fault.kind in SLOW_KINDS
            with soak.state:
                if host.netns not in soak.ending and not (slows and host.netns in soak.slowed):
                    if fault.kind in NODE_ENDING:
                        soak.ending.add(host.netns)
                    elif slows:
                        soak.slowed.add(host.netns)
                    return host
            time.sleep(0.2)
        return None


# -- the outer process -----------------------------------------------------------------------------


def known_pids(work: pathlib.Path) -> set[int]:
    """Every process the soak's journals name: drivers and workers."""
    pids = set()
    for log in work.glob("*/logs/rank*.jsonl"):
        pids |= {line["pid"] for line in chaos_journal.read(str(log)) if line["e"] == "start"}
    for log in work.glob("*/driver.jsonl"):
        pids |= {line["pid"] for line in chaos_journal.read(str(log)) if line["e"] == "driver"}
    return pids


def outer(args: argparse.Namespace, argv: list[str]) -> tuple[dict | None, list[str], pathlib.Path]:
    """Build the hosts, run the soak on the head host, tear everything down; the soak's table
    (None when it wrote none), what was left behind, and the work folder."""
    problem = can_make_namespaces()
    if problem is not None:
        raise SystemExit(f"--hosts: {problem}")
    work = pathlib.Path(tempfile.mkdtemp(prefix="flowtrain-chaos-hosts-"))
    cluster = RayHosts(work / "cluster", cpus=[0, None] + [1] * args.hosts, dashboard=False, subnet=SUBNET)
    names = [cluster.net.switch, *(h.netns for h in cluster.net.hosts)]
    print(f"namespaces: {' '.join(names)}", flush=True)

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    seen: set[int] = set()
    table: dict | None = None
    try:
        started = time.monotonic()
        cluster.start()
        store = cluster.net.hosts[1]
        cluster.start_s3(store, port=S3_PORT, bucket=chaos_storage.BUCKET, log=work / "s3.log")
        print(f"  {len(names) - 1} hosts, Ray and S3 up in {time.monotonic() - started:.1f} s", flush=True)
        (work / "cluster.json").write_text(json.dumps(cluster.to_json()))
        endpoint = f"{store.address}:{S3_PORT}"
        # What Ray tells every driver (a raylet's death, with its log) goes to a file, not between the soak's lines.
        with open(work / "soak-stderr.log", "w") as errors:
            inner = cluster.net.popen(
                cluster.head,
                [sys.executable, "-m", "benchmarks.chaos", "--inside", str(work), "--endpoint", endpoint, *argv],
                # The soak's detection bound is the drivers' (flowtrain's own, not Ray's health checks).
                env={**cluster.env, "RAY_ADDRESS": cluster.address, "FLOWTRAIN_UNREACHABLE_S": str(args.detect_s)},
                cwd=ROOT,
                stderr=errors,
            )
        try:
            inner.wait()
        finally:
            if inner.poll() is None:
                inner.kill()
                inner.wait()
        if (work / "table.json").exists():
            table = json.loads((work / "table.json").read_text())
        else:
            print((work / "soak-stderr.log").read_text()[-5000:], flush=True)
    finally:
        seen = known_pids(work) | {pid for h in cluster.net.hosts for pid in cluster.net.pids(h)}
        cluster.stop()
    left = cluster.net.leftovers()
    left += [f"process {pid}" for pid in sorted(seen) if chaos_check._alive(pid)]
    return table, left, work
