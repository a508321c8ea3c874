"""What the chaos soak's processes write down for it: JSON lines appended to local files, and
markers that make each planned fault fire once.

Every process of a soak (the soak itself, each driver, each worker, on any node of the one-machine
cluster) shares one local folder per run. A line written with one ``O_APPEND`` write lands whole
and in order, so the soak reads the events of all processes without locks; a marker is created
with ``O_EXCL``, so exactly one process fires a fault however many reach its point.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


def append(path: str, record: dict[str, Any]) -> None:
    """Add ``record`` (with the time) as one line of ``path``."""
    line = json.dumps({**record, "t": time.time()}, separators=(",", ":")) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read(path: str) -> list[dict[str, Any]]:
    """The whole lines of ``path`` (none when it does not exist; a line being written is skipped)."""
    try:
        with open(path) as file:
            text = file.read()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def fire(marks: str, fault_id: int, what: str = "fired") -> bool:
    """Claim fault ``fault_id``'s ``what`` marker: True for the one caller that creates it."""
    try:
        os.close(os.open(marker(marks, fault_id, what), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


def fired(marks: str, fault_id: int, what: str = "fired") -> bool:
    """Whether fault ``fault_id``'s ``what`` marker exists."""
    return os.path.exists(marker(marks, fault_id, what))


def marker(marks: str, fault_id: int, what: str) -> str:
    return os.path.join(marks, f"fault-{fault_id:03d}.{what}")
