"""A worker's TCP connections that a stopped attempt must end, whatever framework made them.

Run in the worker. A live rank's gloo sockets close only when torch frees its group, not while
anything holds it (a DDP model the user keeps; torch 2.13), so a peer blocked in a collective with
it would wait on. A group's connections are remembered as it forms (``forming_group``) and shut
when the rank leaves it (``shut_group_connections``); a host cut off closes nothing, so the
survivors shut their connections to it (``cut_connections_to``). See docs/design.md, step 8.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

#: (local, remote address) of each TCP connection this process's group opened when it formed.
_group_connections: frozenset[tuple[Any, Any]] = frozenset()


def _tcp_connections() -> list[Any]:
    import psutil  # type: ignore[import-untyped]  # Ray ships it (ray/thirdparty_files)

    return [c for c in psutil.Process().net_connections(kind="tcp") if c.raddr and c.fd >= 0]


def _shut(wanted: Callable[[Any], bool]) -> int:
    """Shut down this process's TCP connections that ``wanted`` picks: whatever waits on one, a
    collective included, fails at once. Returns how many were shut."""
    cut = 0
    for connection in _tcp_connections():
        if wanted(connection):
            try:
                # A second descriptor of the same socket: shutting it down ends the connection for
                # its owner too, and closing it leaves the owner's descriptor to the owner.
                with socket.socket(fileno=os.dup(connection.fd)) as duplicate:
                    duplicate.shutdown(socket.SHUT_RDWR)
                cut += 1
            except OSError:  # closed meanwhile
                continue
    return cut


def cut_connections_to(addresses: frozenset[str]) -> int:
    """Shut down this process's TCP connections to ``addresses`` (hosts Ray has declared dead), so
    nothing waits for a peer that will never answer. Returns how many were shut."""
    return _shut(lambda connection: connection.raddr.ip in addresses) if addresses else 0


@contextlib.contextmanager
def forming_group(*, store_port: int | None = None) -> Iterator[None]:
    """Around the forming of this process's group: the TCP connections opened inside are the
    group's, shut by ``shut_group_connections``. ``store_port``: the port of a store this process
    hosts, whose connections are not the group's."""
    global _group_connections
    before = {(c.laddr, c.raddr) for c in _tcp_connections()}
    yield
    _group_connections = frozenset(
        (c.laddr, c.raddr)
        for c in _tcp_connections()
        if (c.laddr, c.raddr) not in before and c.laddr.port != store_port
    )


def shut_group_connections() -> int:
    """Shut the connections this process's group opened when it formed (and forget them)."""
    global _group_connections
    opened, _group_connections = _group_connections, frozenset()
    return _shut(lambda connection: (connection.laddr, connection.raddr) in opened) if opened else 0
