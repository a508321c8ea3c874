"""Hosts with their own addresses on one machine: network namespaces joined through a bridge.

Each host is a network namespace with one interface (``eth0``) and its own address; a further
namespace holds the bridge (the switch), so nothing is added to the machine's own network and no
address of these reaches outside them (no route, no NAT). A host's link can be cut at the switch
(its processes live on, unreachable: a partition) and restored. ``down()`` kills every process in
the namespaces and removes them. Needs root and ``ip`` (iproute2).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence


def can_make_namespaces() -> str | None:
    """None when this process can build the cluster, else why not (for a skip's reason)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
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


@dataclasses.dataclass(frozen=True)
class Host:
    """One host: its namespace, its address, and the name of its link's end at the switch."""

    netns: str
    address: str
    switch_port: str


class NamespaceCluster:
    """``count`` hosts on 10.<n>.0.0/24, the first at .1; see the module's docstring.

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
        self._made: list[str] = []

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

    def popen(self, host: Host, argv: Sequence[str], **kwargs: object) -> subprocess.Popen:
        """Start ``argv`` on ``host``."""
        return subprocess.Popen(self.on(host, argv), **kwargs)  # type: ignore[call-overload]

    def run(self, host: Host, argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``host`` to its end."""
        return subprocess.run(self.on(host, argv), **kwargs)  # type: ignore[call-overload]

    def partition(self, host: Host) -> None:
        """Cut ``host``'s link at the switch: its processes live on and reach no other host."""
        _ip("link", "set", host.switch_port, "down", netns=self.switch)

    def heal(self, host: Host) -> None:
        _ip("link", "set", host.switch_port, "up", netns=self.switch)

    def pids(self, host: Host) -> list[int]:
        found = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True)
        return [int(pid) for pid in found.stdout.split()]

    def down(self) -> None:
        """Kill every process in the hosts' namespaces, then remove the namespaces."""
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
