"""Which network interface the workers' collectives use.

gloo picks its address from the host name and NCCL its first interface that is up: on a host
whose name resolves to loopback, or with several interfaces, ranks on different hosts then cannot
reach each other (gloo's ``connectFullMesh ... remote=[127.0.0.1]``). The interface carrying the
address Ray reaches the node at is the one to use, unless the user set ``GLOO_SOCKET_IFNAME`` or
``NCCL_SOCKET_IFNAME``.
"""

from __future__ import annotations

import ipaddress
import os
import socket

#: The variables gloo and NCCL read for the interface to use; a user's value is never replaced.
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def interface_carrying(address: str) -> str | None:
    """The name of this host's interface that holds ``address`` (IPv4 or IPv6), or None."""
    import psutil  # type: ignore[import-untyped]  # Ray ships it (ray/thirdparty_files); workers import Ray

    try:
        wanted = ipaddress.ip_address(address)
    except ValueError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    if ipaddress.ip_address(entry.address.split("%")[0]) == wanted:
                        return name
                except ValueError:
                    continue
    return None


def pin_collective_interface(node_address: str) -> str | None:
    """Run in a worker before it joins a process group: point gloo and NCCL at the interface that
    carries ``node_address`` (its Ray node's address) where the user has not named one. Returns the
    interface the collectives will use (the user's, when set), or None when none was found."""
    chosen = os.environ.get(INTERFACE_VARIABLES[0]) or interface_carrying(node_address)
    if chosen is not None:
        for variable in INTERFACE_VARIABLES:
            os.environ.setdefault(variable, chosen)
    return chosen
