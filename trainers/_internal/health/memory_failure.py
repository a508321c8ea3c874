"""Failures for want of memory (docs/health.md, "Memory"): telling them from others, and the
summary a rank leaves in the run's ``.health/`` folder when it runs out. A rank the kernel or Ray's
memory monitor killed leaves no error: Ray's death message names the monitor, and for the kernel
the controller compares the rank's last reported memory with its limit (``MemoryPeak.near_limit``).
"""

from __future__ import annotations

import os
import tempfile

from storage.filesystem import pafs
from storage.layout import RunLayout
from storage.memory_peak import MemoryPeak
from trainers.backend import FrameworkProcess

#: Words of the errors that mean an allocation failed: PyTorch's CUDA and CPU allocators, NCCL's,
#: Python's ``MemoryError``, Ray's memory monitor (``ray.exceptions.OutOfMemoryError``).
_SIGNS = ("out of memory", "outofmemoryerror", "can't allocate memory", "memoryerror", "memory monitor")


def is_out_of_memory(error: BaseException | str) -> bool:
    """Whether ``error`` (or its text, as a dead worker's message carries it) is a failed allocation."""
    if isinstance(error, MemoryError):
        return True
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return any(sign in text.lower() for sign in _SIGNS)


def leave_memory_summary(
    layout: RunLayout,
    filesystem: pafs.FileSystem,
    *,
    rank: int,
    attempt: int,
    reports: int,
    error: BaseException,
    memory: MemoryPeak,
    framework: type[FrameworkProcess] = FrameworkProcess,
) -> str | None:
    """Write rank ``rank``'s memory when ``error`` stopped it into the run's ``.health/`` folder,
    with ``framework``'s device summary and snapshot; return the summary's path (None: not written)."""
    stem = f"oom-attempt{attempt:04d}-rank{rank:04d}"
    lines = [
        f"rank {rank}, attempt {attempt}, after {reports} report(s)",
        f"error: {type(error).__name__}: {error}",
        f"peak memory in this attempt: {memory.describe()}",
    ]
    device = framework.device_memory_summary()
    if device is not None:
        lines += ["", device]
    # Imported here, on the way out of memory: the rest of storage.health is the driver's.
    from storage.health import write_health_file

    try:
        path = write_health_file(filesystem, layout, f"{stem}.txt", "\n".join(lines).encode())
        with tempfile.TemporaryDirectory(prefix="flowtrain-oom-") as folder:
            local = os.path.join(folder, f"{stem}.pickle")
            if framework.save_device_snapshot(local):
                pafs.copy_files(
                    local,
                    layout.health_path(f"{stem}.pickle"),
                    source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=filesystem,
                )
    except Exception:  # noqa: BLE001 - the failure itself must reach the controller whatever storage does
        return None
    return path
