"""A backend whose context every worker enters around the training function (for test_backend_context)."""

from __future__ import annotations

import contextlib
import dataclasses

import trainers
from trainers import BackendConfig

inside: list[int] = []


@contextlib.contextmanager
def _context():
    # get_context() already works here, in the thread that trains.
    inside.append(trainers.get_context().get_world_rank())
    try:
        yield
    finally:
        inside.pop()


@dataclasses.dataclass(frozen=True)
class ContextConfig(BackendConfig):
    @property
    def train_func_context(self):
        return _context


def report_inside() -> list[int]:
    trainers.report({"inside": list(inside)})
    return list(inside)


def fail_inside() -> None:
    raise ValueError(f"failed inside {inside}")
