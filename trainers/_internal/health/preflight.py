"""The pre-flight check: before the first step, every worker times a small compute probe (a
matrix multiply on its device) and, when the group has a ``torch.distributed`` process group, an
all-reduce; a worker far slower than the median worker fails ``fit()`` before training, naming its
rank, node and figures (``trainers.errors.PreflightError``).

The all-reduce is one figure for the group (a collective runs at the pace of its slowest link),
reported as bus bandwidth; the compute probe is per worker and is what names a bad one.
On by default for GPU runs, off for CPU runs (``FLOWTRAIN_PREFLIGHT``; see ``trainers.health``).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from storage.health import PreflightRecord
from trainers._internal.health.health_settings import PreflightSettings
from trainers._internal.network import INTERFACE_VARIABLES
from trainers.errors import PreflightError
from trainers.tuning import PROBE_ROUND_S

#: Matrix side and repetitions of one batch of the compute probe (5 to 50 ms on a CPU core, tens
#: of milliseconds on a GPU); a round repeats batches for at least ``PROBE_ROUND_S`` and the best of
#: ``PROBE_ROUNDS`` rounds counts.
CPU_SIDE, CPU_REPEATS = 256, 20
PROBE_ROUNDS = 3
GPU_SIDE, GPU_REPEATS = 4096, 20
#: All-reduce payload (bytes) and repetitions: big enough to measure bandwidth, small enough to be quick.
CPU_ALLREDUCE_BYTES, GPU_ALLREDUCE_BYTES, ALLREDUCE_REPEATS = 4 * 2**20, 256 * 2**20, 5


def probe(use_gpu: bool) -> dict[str, Any]:
    """Run in each worker: its compute rate (GFLOP/s), with a process group the group's all-reduce
    bus bandwidth (GB/s) as this rank saw it, and the interface its collectives use. On a CPU the
    multiply runs on one thread (the rate of one core, whatever the worker's thread settings),
    which is put back after."""
    import os

    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if use_gpu and torch.cuda.is_available() else None
    side, repeats = (GPU_SIDE, GPU_REPEATS) if device is not None else (CPU_SIDE, CPU_REPEATS)
    threads = torch.get_num_threads()
    if device is None:
        torch.set_num_threads(1)
    try:
        left = torch.rand(side, side, device=device)
        right = torch.rand(side, side, device=device)
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


def _allreduce_gbps(torch: Any, device: Any) -> float | None:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
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


def judge(
    figures: list[dict[str, Any]],
    nodes: dict[int, tuple[str, str]],
    settings: PreflightSettings,
    seconds: float,
) -> PreflightRecord:
    """The check's record, or ``PreflightError`` naming every worker whose compute rate is more
    than ``settings.factor`` times below the median worker's."""
    rates = [float(f["gflops"] or 0.0) for f in figures]
    buses = [f["bus_gbps"] for f in figures if f["bus_gbps"] is not None]
    record = PreflightRecord(
        seconds=seconds,
        gflops=tuple(rates),
        bus_gbps=min(buses) if buses else None,
        interfaces=tuple(str(f.get("interface") or "") for f in figures),
    )
    median = statistics.median_high(rates) if rates else 0.0
    slow = [rank for rank, rate in enumerate(rates) if rate * settings.factor < median]
    if not slow:
        return record
    lines = [
        f"pre-flight check: {len(slow)} of {len(rates)} worker(s) compute more than {settings.factor:g}x slower "
        f"than the median worker ({median:.3g} GFLOP/s), before training began:"
    ]
    for rank in slow:
        node_id, node_ip = nodes.get(rank, ("", ""))
        lines.append(
            f"  - rank {rank} on node {node_ip or '?'} ({node_id[:12] or '?'}): {rates[rank]:.3g} GFLOP/s, "
            f"{median / max(rates[rank], 1e-9):.2g}x below the median"
        )
    lines.append(f"Every worker: {', '.join(f'rank {r} {g:.3g}' for r, g in enumerate(rates))} GFLOP/s.")
    lines.append(
        "A throttled, shared or faulty CPU/GPU on that node is the usual cause: check it, or leave it out of the "
        "cluster; FLOWTRAIN_PREFLIGHT=off skips the check, FLOWTRAIN_PREFLIGHT_FACTOR sets how far below counts."
    )
    raise PreflightError("\n".join(lines), record=record, slow_ranks=tuple(slow))
