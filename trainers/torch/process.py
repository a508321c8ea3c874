"""What a worker's process asks of torch (``trainers.backend.FrameworkProcess``), run in the
workers; each method does nothing in a process where torch (or CUDA) was never used.

NCCL's collectives wait in a CUDA synchronisation that no closed socket ends: the communicator is
aborted (``interrupt``) before the training thread is waited for, and CUDA is checked usable
(``unusable``) before the process is reused. A rank leaves its group (``leave_group``) only once
its training thread has ended, since destroying a group another thread is using is unsafe.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

from storage import settings
from trainers._internal.network import INTERFACE_VARIABLES
from trainers.backend import FrameworkProcess
from trainers.tuning import PROBE_ROUND_S

#: torch's default seed for its CPU and CUDA generators in a new process (``default_rng_seed_val``
#: in c10): ``torch.initial_seed()`` answers it until the user seeds.
TORCH_START_SEED = 67280421310721
#: Matrix side and repetitions of one batch of the compute probe (5 to 50 ms on a CPU core, tens
#: of milliseconds on a GPU); a round repeats batches for at least ``PROBE_ROUND_S`` and the best of
#: ``PROBE_ROUNDS`` rounds counts.
CPU_SIDE, CPU_REPEATS = 256, 20
PROBE_ROUNDS = 3
GPU_SIDE, GPU_REPEATS = 4096, 20
#: All-reduce payload (bytes) and repetitions: big enough to measure bandwidth, small enough to be quick.
CPU_ALLREDUCE_BYTES, GPU_ALLREDUCE_BYTES, ALLREDUCE_REPEATS = 4 * 2**20, 256 * 2**20, 5


def _distributed() -> Any:
    if "torch.distributed" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _cuda() -> Any:
    """torch, when this process has initialised CUDA with it; else None."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_initialized() else None


class TorchProcess(FrameworkProcess):
    """``FrameworkProcess`` for torch (see the module's docstring)."""

    @staticmethod
    def interrupt() -> None:
        dist = _distributed()
        if dist is not None and "nccl" in str(dist.get_backend()):
            from torch.distributed import distributed_c10d

            distributed_c10d._abort_process_group()

    @staticmethod
    def leave_group() -> None:
        from trainers._internal.workers.connections import shut_group_connections

        dist = _distributed()
        if dist is None:
            return
        with contextlib.suppress(Exception):  # an aborted group refuses a second teardown; it is gone either way
            dist.destroy_process_group()
        shut_group_connections()

    @staticmethod
    def unusable() -> str | None:
        torch = _cuda()
        if torch is None:
            return None
        try:
            torch.ones(1, device="cuda").add_(1)
            torch.cuda.synchronize()
        except Exception as error:  # noqa: BLE001 - any CUDA error means the process cannot train again
            return f"CUDA is not usable after the process group was aborted: {type(error).__name__}: {error}"
        return None

    @staticmethod
    def reset() -> None:
        """torch's process-wide settings as a new process has them (nothing to do where torch was
        never imported). Grad mode, inference mode and autocast are per thread, and every attempt
        trains in a new one."""
        torch = sys.modules.get("torch")
        if torch is None:
            return
        torch.set_default_dtype(torch.float32)
        torch.set_default_device(None)
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))
        # use_deterministic_algorithms imports torch._inductor's config first (0.8 s of a worker's CPU):
        # only when there is something to put back.
        if (
            torch.are_deterministic_algorithms_enabled()
            or torch.is_deterministic_algorithms_warn_only_enabled()
            or "torch._inductor.config" in sys.modules
        ):
            torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
        torch.backends.cudnn.benchmark = False
        torch.set_float32_matmul_precision("highest")
        torch.autograd.set_detect_anomaly(False)
        torch.manual_seed(TORCH_START_SEED)  # every CUDA device too, lazily
        if "torch._dynamo" in sys.modules:
            torch._dynamo.reset()

    @staticmethod
    def probe(use_gpu: bool) -> dict[str, Any] | None:
        """Run in each worker: its compute rate (GFLOP/s), with a process group the group's all-reduce
        bus bandwidth (GB/s) as this rank saw it, and the interface its collectives use. On a CPU the
        multiply runs on one thread (the rate of one core, whatever the worker's thread settings),
        which is put back after."""
        import torch

        device = torch.device("cuda", torch.cuda.current_device()) if use_gpu and torch.cuda.is_available() else None
        side, repeats = (GPU_SIDE, GPU_REPEATS) if device is not None else (CPU_SIDE, CPU_REPEATS)
        threads = torch.get_num_threads()
        if device is None:
            torch.set_num_threads(1)
        try:
            left, right = torch.rand(2, side, side, device=device)
            _synchronize(torch, device)
            left @ right  # warm up: the first multiply loads kernels
            rates = []
            # The best round counts: a worker descheduled now and then is not slow, a throttled one is.
            for _ in range(PROBE_ROUNDS):
                _synchronize(torch, device)
                started, multiplies, elapsed = time.perf_counter(), 0, 0.0
                while elapsed < PROBE_ROUND_S:
                    for _ in range(repeats):
                        left @ right
                    _synchronize(torch, device)
                    multiplies += repeats
                    elapsed = time.perf_counter() - started
                rates.append(2 * side**3 * multiplies / elapsed / 1e9)
        finally:
            torch.set_num_threads(threads)
        interface = os.environ.get(INTERFACE_VARIABLES[0], "")
        return {"gflops": max(rates), "bus_gbps": _allreduce_gbps(torch, device), "interface": interface}

    @staticmethod
    def device_peaks() -> tuple[int, int] | None:
        torch = _cuda()
        return None if torch is None else (torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())

    @staticmethod
    def reset_device_peaks() -> None:
        torch = _cuda()
        if torch is not None:
            torch.cuda.reset_peak_memory_stats()

    @staticmethod
    def watch_device_memory() -> None:
        torch = sys.modules.get("torch")
        if settings.CUDA_MEMORY_SNAPSHOT.read() and torch is not None and torch.cuda.is_available():
            torch.cuda.memory._record_memory_history()

    @staticmethod
    def device_memory_summary() -> str | None:
        torch = _cuda()
        return None if torch is None else torch.cuda.memory_summary()

    @staticmethod
    def save_device_snapshot(local_path: str) -> bool:
        torch = _cuda()
        if torch is None or not settings.CUDA_MEMORY_SNAPSHOT.read():
            return False
        torch.cuda.memory._dump_snapshot(local_path)
        return True


def _allreduce_gbps(torch: Any, device: Any) -> float | None:
    dist = _distributed()
    if dist is None or dist.get_world_size() < 2:
        return None
    size = GPU_ALLREDUCE_BYTES if device is not None else CPU_ALLREDUCE_BYTES
    payload = torch.ones(size // 4, dtype=torch.float32, device=device)
    dist.all_reduce(payload)  # warm up: the first call sets the connections up
    _synchronize(torch, device)
    started = time.perf_counter()
    for _ in range(ALLREDUCE_REPEATS):
        dist.all_reduce(payload)
    _synchronize(torch, device)
    seconds = (time.perf_counter() - started) / ALLREDUCE_REPEATS
    ranks = dist.get_world_size()
    return size / seconds * 2 * (ranks - 1) / ranks / 1e9  # bus bandwidth, as nccl-tests count it


def _synchronize(torch: Any, device: Any) -> None:
    if device is not None:
        torch.cuda.synchronize(device)
