"""Ending a worker's torch process group when its attempt stops, so the process can join the next.

Run in the worker, by ``TrainWorker.stop``; each does nothing when torch.distributed was never
imported. How a rank blocked in a collective gets out depends on the library under it:

- **gloo**: a peer whose process died closes its sockets, and every collective waiting on it fails
  at once ("Connection closed by peer"). A live rank's sockets close only when its group is freed,
  which neither ``destroy_process_group`` nor ``abort`` does while anything holds the group (a DDP
  model does, wherever the user's code keeps it; torch 2.13): so the connections a group opened
  when it formed are remembered (``forming_group``) and shut when the rank leaves (``leave``),
  which fails the collectives its peers wait in, and each of them leaves in turn. Destroying a
  group another thread is using is unsafe, so a rank leaves only once its training thread has
  ended; the controller kills hung ranks first, which closes their sockets. A host cut off from the network closes nothing: the
  survivors shut their own connections to it (``cut_connections_to``), which fails their waiting
  collectives the same way, and each rank that leaves its group then frees the ranks waiting on it.
- **nccl**: collectives run on the GPU and a rank waits in a CUDA synchronisation, which no closed
  socket ends: the communicator is aborted (``abort_nccl``) before the thread is waited for, and
  CUDA is checked usable (``cuda_usable``) before the process is reused.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any

#: (local, remote address) of each TCP connection this process's group opened when it formed.
_group_connections: frozenset[tuple[Any, Any]] = frozenset()


def _distributed():
    if "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def abort_nccl() -> bool:
    """Abort this process's NCCL communicators (their pending collectives fail instead of waiting
    for the watchdog's timeout); True when there was an NCCL group to abort."""
    dist = _distributed()
    if dist is None or "nccl" not in str(dist.get_backend()):
        return False
    from torch.distributed import distributed_c10d

    distributed_c10d._abort_process_group()
    return True


def _tcp_connections() -> list[Any]:
    import psutil  # type: ignore[import-untyped]  # Ray ships it (ray/thirdparty_files)

    return [c for c in psutil.Process().net_connections(kind="tcp") if c.raddr and c.fd >= 0]


def _shut(wanted: Callable[[Any], bool]) -> int:
    """Shut down this process's TCP connections that ``wanted`` picks: whatever waits on one, a
    gloo collective included, fails at once. Returns how many were shut."""
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
    group's, shut when it leaves (``leave``). ``store_port``: the port of a store this process
    hosts, whose connections are not the group's."""
    global _group_connections
    before = {(c.laddr, c.raddr) for c in _tcp_connections()}
    yield
    _group_connections = frozenset(
        (c.laddr, c.raddr)
        for c in _tcp_connections()
        if (c.laddr, c.raddr) not in before and c.laddr.port != store_port
    )


def leave() -> None:
    """Leave this process's group and shut the connections it opened, so peers still waiting in a
    collective with this rank fail at once; one already aborted is only forgotten."""
    global _group_connections
    dist = _distributed()
    if dist is None:
        return
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - an aborted group refuses a second teardown; it is gone either way
        pass
    opened, _group_connections = _group_connections, frozenset()
    if opened:
        _shut(lambda connection: (connection.laddr, connection.raddr) in opened)


def cuda_usable() -> str | None:
    """None when CUDA (if this process used it) still runs a kernel after an abort, else why not."""
    if "torch" not in sys.modules:
        return None
    import torch

    if not torch.cuda.is_initialized():
        return None
    try:
        torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - any CUDA error means the process cannot train again
        return f"CUDA is not usable after the process group was aborted: {type(error).__name__}: {error}"
    return None
