"""``LoggingConfig(log_level)``: the level of flowtrain's own loggers, in the driver and the workers.

Only flowtrain's loggers change (``trainers``, ``storage``, ``tasks``, ``flows``): the user's, Ray's
and the root logger keep theirs, and no handler is added, so where the records go stays the
user's choice (``logging.basicConfig``, Prefect's run logger, ...).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

#: The top-level loggers of flowtrain's packages.
FLOWTRAIN_LOGGERS = ("trainers", "storage", "tasks", "flows")


def apply_log_level(level: str) -> None:
    """Set every flowtrain logger to ``level`` (a name such as "DEBUG"); used in worker processes,
    which end with the run."""
    for name in FLOWTRAIN_LOGGERS:
        logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def log_level(level: str | None) -> Iterator[None]:
    """Within the block, flowtrain's loggers use ``level``; afterwards their earlier levels come back
    (the driver is the user's process). ``None`` changes nothing."""
    if level is None:
        yield
        return
    before = {name: logging.getLogger(name).level for name in FLOWTRAIN_LOGGERS}
    apply_log_level(level)
    try:
        yield
    finally:
        for name, previous in before.items():
            logging.getLogger(name).setLevel(previous)
