"""Hosts with their own addresses on one machine, a Ray cluster on them, and faults between them.

Each host is a network namespace with one interface (``eth0``) and its own address; a further
namespace holds the bridge (the switch), so nothing is added to the machine's own network and no
address of these reaches outside them (no route, no NAT). Needs root and ``ip``/``tc`` (iproute2).

Faults between hosts (``NamespaceCluster``):

- ``partition(host)``/``heal(host)``: the host's link cut at the switch: its processes live on,
  reaching no other host, and none reaches them;
- ``cut_between(a, b)``/``join_between(a, b)``: only the path between two hosts cut (each drops
  what it sends the other, silently: a ``clsact`` egress filter redirecting it to a veth whose
  peer is down; ``cut_frames`` counts them), the rest of their links up;
- ``impair(host, delay_s, loss)``/``unimpair(host)``: a slow or lossy link, what
  ``tc netem delay D loss L`` on the host's ``eth0`` does (``benchmarks.link_relay``: kernels
  without ``sch_netem`` exist);
- ``kill_all(host)``: every process in the host's namespace killed, as a host that loses power
  (cut its link first and it falls silent as one does).

``down()`` kills every process in the namespaces and removes them (the bridge, the veth pairs and
every filter go with them); ``leftovers()`` says what of it is still there. Nothing outside the
namespaces this object made is touched.

``RayHosts``: a Ray cluster on such hosts, as a user starts one (``ray start --head`` on the
first, ``ray start --address`` on the others, token authentication), with the CPUs each host
advertises, and a moto S3 server on a host, reached over the bridge. The namespace cluster tests
(``tests/test_namespace_cluster.py``) and the chaos soak on hosts (``benchmarks.chaos_hosts``)
build their hosts with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

#: The relay's filter on a host's egress (``impair``); a cut between two hosts uses 1 + the
#: peer's index, so each cut is a filter of its own, tried first.
_RELAY_PRIO = 100
#: Each host's sink for what it must not send (``cut_between``): a veth whose peer stays down.
_SINK = "ftsink0"


def can_make_namespaces() -> str | None:
    """None when this process can build the cluster, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2's `ip` and `tc` are not installed"
    probe = f"ftprobe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


def _tc(netns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    command = ["ip", "netns", "exec", netns, "tc", *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done


def wait_until(condition: Callable[[], Any], *, timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    """``condition()``'s first truthy value, asked every ``interval_s``; TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        time.sleep(interval_s)


@dataclasses.dataclass(frozen=True)
class Host:
    """One host: its namespace, its address, and the name of its link's end at the switch."""

    netns: str
    address: str
    switch_port: str


class NamespaceCluster:
    """``count`` hosts on ``<subnet>.0/24``, the first at .1; see the module's docstring.

    ``private``: folders each host has its own copy of (a real host's /tmp is its own; Ray keeps a
    node's address and sockets under its temp folder, and a process that found the head's there
    would attach to the head's raylet from another host). Every process started on a host sees
    ``<folder>-<host>`` at ``<folder>``; the rest of the disk is shared, as a network file system is.
    """

    def __init__(self, count: int, subnet: str = "10.213.0", private: Sequence[str] = ()) -> None:
        tag = uuid.uuid4().hex[:5]
        self.switch = f"ftsw{tag}"
        self.hosts = [Host(f"fth{tag}{i}", f"{subnet}.{i + 1}", f"p{tag}{i}") for i in range(count)]
        self.private = list(private)
        #: The namespaces this object made (and so removes); empty in a copy made by ``from_json``.
        self._made: list[str] = []
        self._relays: dict[str, subprocess.Popen] = {}

    def to_json(self) -> dict:
        return {"switch": self.switch, "hosts": [dataclasses.asdict(h) for h in self.hosts], "private": self.private}

    @classmethod
    def from_json(cls, data: dict) -> NamespaceCluster:
        """The cluster ``to_json`` described, to run processes and faults on; it owns nothing, so
        its ``down()`` removes nothing (the one that made the namespaces does)."""
        cluster = cls.__new__(cls)
        cluster.switch = data["switch"]
        cluster.hosts = [Host(**h) for h in data["hosts"]]
        cluster.private = list(data["private"])
        cluster._made = []
        cluster._relays = {}
        return cluster

    def up(self) -> NamespaceCluster:
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("link", "add", "br0", "type", "bridge", netns=self.switch)
        _ip("link", "set", "br0", "up", netns=self.switch)
        for host in self.hosts:
            _ip("netns", "add", host.netns)
            self._made.append(host.netns)
            _ip("link", "set", "lo", "up", netns=host.netns)
            # The pair is made inside the host's namespace, its other end moved to the switch's.
            _ip("link", "add", "eth0", "type", "veth", "peer", "name", host.switch_port, netns=host.netns)
            _ip("link", "set", host.switch_port, "netns", self.switch, netns=host.netns)
            _ip("addr", "add", f"{host.address}/24", "dev", "eth0", netns=host.netns)
            _ip("link", "set", "eth0", "up", netns=host.netns)
            _ip("link", "set", host.switch_port, "master", "br0", netns=self.switch)
            _ip("link", "set", host.switch_port, "up", netns=self.switch)
        return self

    def on(self, host: Host, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` on ``host``: in its network namespace, with its own
        copy of each private folder mounted over the shared one."""
        mounts = []
        for folder in self.private:
            own = f"{folder}-{host.netns}"
            os.makedirs(own, exist_ok=True)
            os.makedirs(folder, exist_ok=True)
            mounts.append(f"mount --bind {own} {folder}")
        if not mounts:
            return ["ip", "netns", "exec", host.netns, *argv]
        script = " && ".join([*mounts, 'exec "$@"'])
        return [
            "ip",
            "netns",
            "exec",
            host.netns,
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            *argv,
        ]

    def popen(self, host: Host, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` on ``host``."""
        return subprocess.Popen(self.on(host, argv), **kwargs)

    def run(self, host: Host, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``host`` to its end."""
        return subprocess.run(self.on(host, argv), **kwargs)

    def host_at(self, address: str) -> Host:
        """The host whose address is ``address``."""
        return next(h for h in self.hosts if h.address == address)

    # -- faults ----------------------------------------------------------------------------------

    def partition(self, host: Host) -> None:
        """Cut ``host``'s link at the switch: its processes live on and reach no other host."""
        _ip("link", "set", host.switch_port, "down", netns=self.switch)

    def heal(self, host: Host) -> None:
        _ip("link", "set", host.switch_port, "up", netns=self.switch)

    def cut_between(self, a: Host, b: Host) -> None:
        """Cut the path between ``a`` and ``b`` only: each drops, silently, what it sends the other."""
        for one, other in ((a, b), (b, a)):
            self._egress_hooks(one)
            _tc(
                one.netns,
                *("filter", "add", "dev", "eth0", "egress", "protocol", "ip", "prio", str(self._cut_prio(other))),
                *("u32", "match", "ip", "dst", f"{other.address}/32", "action", "mirred", "egress", "redirect"),
                *("dev", _SINK),
            )

    def cut_frames(self, host: Host, peer: Host) -> int:
        """How many frames for ``peer`` the cut between them has kept from ``host`` (0: none cut)."""
        shown = _tc(host.netns, "-s", "filter", "show", "dev", "eth0", "egress", "prio", str(self._cut_prio(peer)))
        found = re.search(r"Sent \d+ bytes (\d+) pkt", shown.stdout)
        return int(found.group(1)) if found else 0

    def join_between(self, a: Host, b: Host) -> None:
        """Undo ``cut_between(a, b)``."""
        for one, other in ((a, b), (b, a)):
            _tc(one.netns, "filter", "del", "dev", "eth0", "egress", "prio", str(self._cut_prio(other)), check=False)

    def impair(self, host: Host, *, delay_s: float, loss: float, seed: int = 0) -> None:
        """Delay every frame ``host`` sends by ``delay_s`` and drop a share ``loss`` of them, until
        ``unimpair``."""
        if host.netns in self._relays:
            raise RuntimeError(f"{host.address} is impaired already")
        self._egress_hooks(host)
        relay = subprocess.Popen(
            [
                "ip",
                *("netns", "exec", host.netns),
                *(sys.executable, "-m", "benchmarks.link_relay", "eth0", str(delay_s), str(loss), str(seed)),
            ],
            cwd=pathlib.Path(__file__).resolve().parent.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._relays[host.netns] = relay
        assert relay.stdout is not None
        ready = relay.stdout.readline().split()
        if ready[:1] != ["ready"]:
            relay.kill()
            raise RuntimeError(f"the link relay on {host.address} did not start: {ready} {relay.stdout.read()[-2000:]}")
        _tc(
            host.netns,
            *("filter", "add", "dev", "eth0", "egress", "protocol", "all", "prio", str(_RELAY_PRIO)),
            *("u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", ready[1]),
        )

    def unimpair(self, host: Host) -> str:
        """Undo ``impair``: what is held goes out at its time; the relay's count of frames sent and dropped."""
        _tc(host.netns, "filter", "del", "dev", "eth0", "egress", "prio", str(_RELAY_PRIO), check=False)
        relay = self._relays.pop(host.netns, None)
        if relay is None:
            return ""
        relay.send_signal(signal.SIGTERM)
        try:
            out, _ = relay.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            relay.kill()
            out, _ = relay.communicate()
        return out.strip()

    def impaired(self, host: Host) -> bool:
        return host.netns in self._relays

    def kill_all(self, host: Host) -> list[int]:
        """SIGKILL every process in ``host``'s namespace, until none is left; the pids killed."""
        killed: list[int] = []
        for _ in range(100):
            alive = self.pids(host)
            if not alive:
                return killed
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"processes on {host.address} outlive SIGKILL: {self.pids(host)}")

    def _egress_hooks(self, host: Host) -> None:
        """The host's ``clsact`` qdisc and its sink, made once."""
        shown = _tc(host.netns, "qdisc", "show", "dev", "eth0").stdout
        if "clsact" not in shown:
            _tc(host.netns, "qdisc", "add", "dev", "eth0", "clsact")
            _ip("link", "add", _SINK, "type", "veth", "peer", "name", f"{_SINK}p", netns=host.netns)
            _ip("link", "set", _SINK, "up", netns=host.netns)  # its peer stays down: what it is sent is dropped

    def _cut_prio(self, peer: Host) -> int:
        return 1 + self.hosts.index(peer)

    # -- the end ---------------------------------------------------------------------------------

    def pids(self, host: Host) -> list[int]:
        found = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True)
        return [int(pid) for pid in found.stdout.split()]

    def down(self) -> None:
        """Kill every process in the hosts' namespaces, then remove the namespaces."""
        for relay in self._relays.values():
            relay.kill()
            relay.wait()
        self._relays.clear()
        for _ in range(50):
            alive = [pid for host in self.hosts if host.netns in self._made for pid in self.pids(host)]
            if not alive:
                break
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._made.clear()

    def leftovers(self) -> list[str]:
        """What of this cluster is still there: its namespaces still listed, processes still in them."""
        listed = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
        names = [self.switch, *(h.netns for h in self.hosts)]
        left = [f"namespace {name}" for name in names if name in listed]
        left += [f"process {pid} on {h.address}" for h in self.hosts if h.netns in listed for pid in self.pids(h)]
        return left


REPO = pathlib.Path(__file__).resolve().parent.parent


def ray_cli() -> str:
    return str(pathlib.Path(sys.executable).with_name("ray"))


class RayHosts:
    """Namespace hosts with a Ray cluster on them, and how to run a process on one.

    ``cpus``: one entry per host, the CPUs its Ray node advertises (``None``: the host runs no Ray
    node, e.g. a store's). The first host is the head. ``env``: added to every process's
    environment (Ray's own settings, e.g. ``RAY_health_check_*``); ``pythonpath``: folders every
    process imports from. ``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME`` and ``RAY_ADDRESS`` are
    never passed on from this process, nor any ``RAY_health_check_*`` that ``env`` does not set.
    """

    def __init__(
        self,
        root: pathlib.Path,
        *,
        cpus: Sequence[int | None],
        env: dict[str, str] | None = None,
        pythonpath: Sequence[str] = (),
        dashboard: bool = True,
        subnet: str = "10.213.0",
    ) -> None:
        self.root = root
        self.home = root / "home"  # each host's ~/.ray/auth_token, one file here as all share a disk
        self.home.mkdir(parents=True, exist_ok=True)
        # Ray's sockets live under its temp folder, and a socket's path must stay under 107 bytes:
        # a short folder of its own (under pytest-xdist, tmp paths are long), removed in stop().
        self.ray_root = pathlib.Path(tempfile.mkdtemp(prefix="ftray", dir="/tmp"))
        self.net = NamespaceCluster(len(cpus), subnet=subnet, private=[str(self.ray_root / "ray")])
        self.cpus = list(cpus)
        self.dashboard = dashboard
        dropped = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "RAY_ADDRESS", "PYTHONPATH")
        environ = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("RAY_health_check_")}
        self.env = {
            **environ,
            "HOME": str(self.home),
            "RAY_AUTH_MODE": "token",
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONPATH": os.pathsep.join([*pythonpath, str(REPO)]),
            **(env or {}),
        }

    @property
    def head(self) -> Host:
        return self.net.hosts[0]

    @property
    def address(self) -> str:
        return f"{self.head.address}:6379"

    def to_json(self) -> dict:
        return {
            "net": self.net.to_json(),
            "ray_root": str(self.ray_root),
            "cpus": self.cpus,
            "root": str(self.root),
            "dashboard": self.dashboard,
            "env": self.env,
        }

    @classmethod
    def from_json(cls, data: dict) -> RayHosts:
        """The cluster ``to_json`` described (one that owns nothing: see ``NamespaceCluster.from_json``)."""
        hosts = cls.__new__(cls)
        hosts.net = NamespaceCluster.from_json(data["net"])
        hosts.ray_root = pathlib.Path(data["ray_root"])
        hosts.cpus = list(data["cpus"])
        hosts.root = pathlib.Path(data["root"])
        hosts.dashboard = data["dashboard"]
        hosts.home = hosts.root / "home"
        hosts.env = dict(data["env"])
        return hosts

    def start(self) -> RayHosts:
        self.net.up()
        subprocess.run([ray_cli(), "get-auth-token", "--generate"], env=self.env, check=True, capture_output=True)
        for host, cpus in zip(self.net.hosts, self.cpus, strict=True):
            if cpus is not None:
                self.start_node(host)
        return self

    def start_node(self, host: Host) -> None:
        """``ray start`` on ``host``: the head, or a node joining it (a host started again too)."""
        cpus = self.cpus[self.net.hosts.index(host)]
        common = [f"--num-cpus={cpus}", "--object-store-memory=150000000", "--disable-usage-stats"]
        if host == self.head:
            args = [
                "--head",
                "--port=6379",
                f"--include-dashboard={'true' if self.dashboard else 'false'}",  # Ray Jobs go through the dashboard
                *([f"--dashboard-host={self.head.address}"] if self.dashboard else []),
                f"--temp-dir={self.ray_root / 'ray'}",
            ]
        else:
            args = [f"--address={self.address}"]
        done = self.net.run(
            host,
            [ray_cli(), "start", f"--node-ip-address={host.address}", *args, *common],
            env=self.env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"ray start on {host.address}: {done.stdout[-3000:]}{done.stderr[-3000:]}")

    def raylet_pids(self, host: Host) -> list[int]:
        """The pids of the raylets running on ``host`` (none once its node has ended)."""
        found = []
        for pid in self.net.pids(host):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                    argv0 = cmdline.read().split(b"\0", 1)[0]
            except OSError:
                continue
            if argv0.endswith(b"/raylet"):
                found.append(pid)
        return found

    def python(self, host: Host, args: list[str], log: pathlib.Path, **env: str) -> subprocess.Popen:
        """Start ``python ARGS`` on ``host``, joined to the cluster by RAY_ADDRESS; output to ``log``."""
        with open(log, "w") as out:
            return self.net.popen(
                host,
                [sys.executable, *args],
                env={**self.env, "RAY_ADDRESS": self.address, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def start_s3(self, host: Host, *, port: int, bucket: str, log: pathlib.Path) -> subprocess.Popen:
        """A moto S3 server on ``host``'s address with the bucket ``bucket``, once it answers."""
        with open(log, "w") as out:
            server = self.net.popen(
                host,
                [sys.executable, "-m", "moto.server", "-H", host.address, "-p", str(port)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        # pyarrow's S3FileSystem() does not read AWS_ENDPOINT_URL (FileSystem.from_uri, which fit() uses, does).
        make = (
            "import pyarrow.fs as fs; fs.S3FileSystem(allow_bucket_creation=True, scheme='http', "
            f"endpoint_override='{host.address}:{port}').create_dir({bucket!r})"
        )
        try:
            wait_until(
                lambda: (
                    server.poll() is not None
                    or self.net.run(host, [sys.executable, "-c", make], env=self.env, capture_output=True).returncode
                    == 0
                ),
                timeout_s=120,
                what=f"S3 on {host.address}",
            )
        except TimeoutError:
            server.kill()
            raise
        if server.poll() is not None:
            raise RuntimeError(f"the S3 server on {host.address} ended: {log.read_text()[-3000:]}")
        return server

    def stop(self) -> None:
        """Every process on the hosts killed, the namespaces and Ray's folders removed."""
        self.net.down()
        shutil.rmtree(self.ray_root, ignore_errors=True)


def dump(hosts: RayHosts, path: pathlib.Path) -> None:
    path.write_text(json.dumps(hosts.to_json()))
