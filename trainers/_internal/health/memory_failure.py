"""Failures for want of memory: telling them from others, and what a rank leaves behind when it
runs out (a memory summary in the run's ``.health/`` folder; with ``FLOWTRAIN_CUDA_MEMORY_SNAPSHOT``
set, PyTorch's CUDA memory snapshot too).

A rank that raises a CUDA out-of-memory error, a ``MemoryError`` or an allocator's "can't
allocate" error is out of memory by its error. A rank killed by the kernel's OOM killer or Ray's
memory monitor leaves no error of its own: Ray's death message names the monitor, and for the
kernel the controller compares the rank's memory at its last report with its limit
(``MemoryPeak.near_limit``).
"""

from __future__ import annotations

import os
import sys
import tempfile

import pyarrow.fs

from storage import settings
from storage.health import MemoryPeak, write_health_file
from storage.layout import RunLayout

#: Words of the errors that mean an allocation failed: PyTorch's CUDA and CPU allocators, NCCL's,
#: Python's ``MemoryError``, Ray's memory monitor (``ray.exceptions.OutOfMemoryError``).
_SIGNS = ("out of memory", "outofmemoryerror", "can't allocate memory", "memoryerror", "memory monitor")


def is_out_of_memory(error: BaseException | str) -> bool:
    """Whether ``error`` (or an error's text, as a dead worker's message carries it) is a failed
    allocation."""
    if isinstance(error, MemoryError):
        return True
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return any(sign in text.lower() for sign in _SIGNS)


def record_cuda_history() -> None:
    """With ``FLOWTRAIN_CUDA_MEMORY_SNAPSHOT`` on and a GPU, start recording CUDA allocations (and
    dump PyTorch's memory snapshot, ``torch.cuda.memory._dump_snapshot``, when a rank runs out of
    CUDA memory; open it at https://pytorch.org/memory_viz)."""
    if not settings.CUDA_MEMORY_SNAPSHOT.read():
        return
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.memory._record_memory_history()


def leave_memory_summary(
    layout: RunLayout,
    filesystem: pyarrow.fs.FileSystem,
    *,
    rank: int,
    attempt: int,
    reports: int,
    error: BaseException,
    memory: MemoryPeak,
) -> str | None:
    """Write what rank ``rank``'s memory looked like when ``error`` stopped it (after ``reports``
    reports of ``attempt``) into the run's ``.health/`` folder; return the summary's path there
    (None when it could not be written)."""
    stem = f"oom-attempt{attempt:04d}-rank{rank:04d}"
    lines = [
        f"rank {rank}, attempt {attempt}, after {reports} report(s)",
        f"error: {type(error).__name__}: {error}",
        f"peak memory in this attempt: {memory.describe()}",
    ]
    torch = sys.modules.get("torch")
    cuda = torch is not None and torch.cuda.is_initialized()
    if cuda:
        lines += ["", torch.cuda.memory_summary()]  # type: ignore[union-attr]
    try:
        path = write_health_file(filesystem, layout, f"{stem}.txt", "\n".join(lines).encode())
        if cuda and settings.CUDA_MEMORY_SNAPSHOT.read():
            _upload_snapshot(layout, filesystem, f"{stem}.pickle")
    except Exception:  # noqa: BLE001 - the failure itself must reach the controller whatever storage does
        return None
    return path


def _upload_snapshot(layout: RunLayout, filesystem: pyarrow.fs.FileSystem, name: str) -> None:
    import torch

    with tempfile.TemporaryDirectory(prefix="flowtrain-oom-") as folder:
        local = os.path.join(folder, name)
        torch.cuda.memory._dump_snapshot(local)
        pyarrow.fs.copy_files(
            local,
            layout.health_path(name),
            source_filesystem=pyarrow.fs.LocalFileSystem(),
            destination_filesystem=filesystem,
        )
