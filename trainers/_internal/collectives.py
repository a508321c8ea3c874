"""Ending a worker's torch process group when its attempt stops, so the process can join the next.

Run in the worker, by ``TrainWorker.stop``; each does nothing when torch.distributed was never
imported. How a rank blocked in a collective gets out depends on the library under it:

- **gloo**: a peer whose process died or whose group was destroyed closes its sockets, and every
  collective waiting on it fails at once ("Connection closed by peer"). ``abort`` does not wake a
  waiting gloo collective (torch 2.13), and destroying a group another thread is using is unsafe,
  so a rank leaves its group only once its training thread has ended; the controller kills hung
  ranks first, which closes their sockets.
- **nccl**: collectives run on the GPU and a rank waits in a CUDA synchronisation, which no closed
  socket ends: the communicator is aborted (``abort_nccl``) before the thread is waited for, and
  CUDA is checked usable (``cuda_usable``) before the process is reused.
"""

from __future__ import annotations

import sys


def _distributed():
    if "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def group_backend() -> str | None:
    """The backend of this process's default group ("gloo", "nccl"), or None without one."""
    dist = _distributed()
    return str(dist.get_backend()) if dist is not None else None


def abort_nccl() -> bool:
    """Abort this process's NCCL communicators (their pending collectives fail instead of waiting
    for the watchdog's timeout); True when there was an NCCL group to abort."""
    dist = _distributed()
    if dist is None or "nccl" not in str(dist.get_backend()):
        return False
    from torch.distributed import distributed_c10d

    distributed_c10d._abort_process_group()
    return True


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
