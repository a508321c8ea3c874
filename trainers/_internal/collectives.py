"""Ending a worker's torch process group when its attempt stops, so the process can join the next.

Run in the worker, by ``TrainWorker.stop``; each does nothing when torch.distributed was never
imported. How a rank blocked in a collective gets out depends on the library under it:

- **gloo**: a peer whose process died or whose group was destroyed closes its sockets, and every
  collective waiting on it fails at once ("Connection closed by peer"). ``abort`` does not wake a
  waiting gloo collective (torch 2.13), and destroying a group another thread is using is unsafe,
  so a rank leaves its group only once its training thread has ended; the controller kills hung
  ranks first, which closes their sockets. A host cut off from the network closes nothing: the
  survivors shut their own connections to it (``cut_connections_to``), which fails their waiting
  collectives the same way, and each rank that leaves its group then frees the ranks waiting on it.
- **nccl**: collectives run on the GPU and a rank waits in a CUDA synchronisation, which no closed
  socket ends: the communicator is aborted (``abort_nccl``) before the thread is waited for, and
  CUDA is checked usable (``cuda_usable``) before the process is reused.
"""

from __future__ import annotations

import os
import socket
import sys


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


def cut_connections_to(addresses: frozenset[str]) -> int:
    """Shut down this process's TCP connections to ``addresses`` (hosts Ray has declared dead):
    whatever waits on one, a gloo collective included, fails at once instead of waiting for a
    peer that will never answer. Returns how many were shut."""
    if not addresses:
        return 0
    import psutil  # type: ignore[import-untyped]  # Ray ships it (ray/thirdparty_files)

    cut = 0
    for connection in psutil.Process().net_connections(kind="tcp"):
        if connection.raddr and connection.raddr.ip in addresses and connection.fd >= 0:
            try:
                # A second descriptor of the same socket: shutting it down ends the connection for
                # its owner too, and closing it leaves the owner's descriptor to the owner.
                with socket.socket(fileno=os.dup(connection.fd)) as duplicate:
                    duplicate.shutdown(socket.SHUT_RDWR)
                cut += 1
            except OSError:  # closed meanwhile
                continue
    return cut


def leave() -> None:
    """Leave this process's group (gloo: its sockets close, so peers still waiting in a collective
    with this rank fail at once); one already aborted is only forgotten."""
    dist = _distributed()
    if dist is None:
        return
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - an aborted group refuses a second teardown; it is gone either way
        pass


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
