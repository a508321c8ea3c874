"""Where the lines a run's workers print go: the terminal (Ray's default) or a caller's sink
(``capture_worker_output``; the Prefect tasks log them into the task run). The machinery is
``trainers/_internal/worker_output.py``; these are the names callers use."""

from __future__ import annotations

from trainers._internal.ray_private import ray_console_handlers
from trainers._internal.worker_output import (
    Sink,
    announce,
    capture_worker_output,
    install,
    is_captured,
    is_ray_data_notice,
    worker_label,
)

__all__ = [
    "Sink",
    "announce",
    "capture_worker_output",
    "install",
    "is_captured",
    "is_ray_data_notice",
    "ray_console_handlers",
    "worker_label",
]
