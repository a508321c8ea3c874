"""Synchronise the workers of a run from inside the training function, as ``ray.train.collective``.

Both calls work with any trainer (PyTorch, XGBoost, LightGBM or your own backend) and need no
process group: each rank tells the driver it arrived, and the driver lets every rank go once the
last one did. They are for small things, such as a folder name rank 0 chose or "rank 0 has
downloaded the data"; send tensors with your framework's collectives.

Every rank must make the same calls in the same order. While ranks wait, a rank that fails ends
the attempt as usual (and ``FailureConfig`` restarts it).
"""

from __future__ import annotations

from typing import TypeVar

from trainers._internal.session.worker_session import get_session

T = TypeVar("T")


def barrier() -> None:
    """Wait until every worker of the run has called ``barrier()``."""
    get_session("barrier").synchronize(None, "barrier")


def broadcast_from_rank_zero(data: T) -> T:
    """Return rank 0's ``data`` on every worker, once every worker has called this.

    What the other ranks pass is ignored. ``data`` must pickle (a ``TypeError`` on rank 0 says so
    otherwise); above 1000 pickled bytes a warning says it is meant for small values.
    """
    return get_session("broadcast_from_rank_zero").synchronize(data, "broadcast_from_rank_zero")
