"""The pre-flight check (docs/health.md): before the first step every worker times a compute probe
and, with a process group, an all-reduce (one figure for the group: a collective runs at its
slowest link's pace); a worker far slower than the median fails ``fit()`` with ``PreflightError``.
"""

from __future__ import annotations

import statistics
from typing import Any

from storage.health import PreflightRecord
from trainers._internal.health.health_settings import PreflightSettings
from trainers.errors import PreflightError


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
