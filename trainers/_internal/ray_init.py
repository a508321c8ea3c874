"""Connect to Ray: the cluster in RAY_ADDRESS, the one already connected, or a new local one."""

from __future__ import annotations

import os

import ray


def ensure_ray() -> None:
    """Start or join Ray unless this process is already connected."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = os.environ.get("RAY_ADDRESS") or None
    ray.init(address=address, log_to_driver=True, include_dashboard=False if address is None else None)
    from trainers._internal.worker_output import install

    install()  # worker lines of runs whose output a caller captures go to it, not the terminal
