"""XGBoostConfig and the xgboost backend: xgboost's own collective, coordinated from the driver.

The driver runs xgboost's ``RabitTracker``; every worker joins it through
``xgboost.collective.CommunicatorContext`` around the training function, with a task id made
from its world rank so that xgboost's ranks are our ranks. With one worker (or
``num_workers=0``) there is nothing to coordinate and the function runs as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from trainers._checks import check_choice
from trainers.backend import Backend, BackendConfig

logger = logging.getLogger(__name__)

COMMUNICATORS = ("rabit",)


@dataclasses.dataclass(frozen=True)
class XGBoostConfig(BackendConfig):
    """How the workers of an ``XGBoostTrainer`` talk to each other.

    You rarely need it: the trainer starts xgboost's tracker on the driver and has every worker
    join it before your training function runs, so a plain ``xgboost.train(...)`` inside the
    function trains on all workers' data together. Same name as ``ray.train.xgboost.XGBoostConfig``.
    """

    #: The collective xgboost uses between workers; "rabit" (its TCP collective) is the one supported.
    xgboost_communicator: str = "rabit"

    def __post_init__(self) -> None:
        check_choice("XGBoostConfig.xgboost_communicator", self.xgboost_communicator, COMMUNICATORS)

    framework = "xgboost"

    @property
    def backend_cls(self) -> type[Backend]:
        return XGBoostBackend

    @property
    def train_func_context(self) -> Callable[[], AbstractContextManager[Any]]:
        return communicator_context


# -- worker side --------------------------------------------------------------------------------

#: The tracker's address, set on each worker by the backend before training starts (None: one worker).
_tracker_args: dict[str, Any] | None = None


def _set_tracker_args(args: dict[str, Any] | None) -> None:
    global _tracker_args
    _tracker_args = dict(args) if args else None


def task_id(world_rank: int) -> str:
    """The task id a worker gives the tracker; the tracker ranks tasks by sorting these names, so
    zero-padding makes xgboost's rank equal the world rank."""
    return f"flowtrain-rank-{world_rank:08d}"


@contextlib.contextmanager
def communicator_context() -> Iterator[None]:
    """Join the xgboost collective for the duration of the training function (when distributed)."""
    if not _tracker_args:
        yield
        return
    from xgboost.collective import CommunicatorContext

    from trainers.context import get_context

    with CommunicatorContext(**_tracker_args, dmlc_task_id=task_id(get_context().get_world_rank())):
        yield


# -- driver side --------------------------------------------------------------------------------


class XGBoostBackend(Backend[XGBoostConfig]):
    """Starts a ``RabitTracker`` on the driver for each attempt and tells the workers where it is."""

    def __init__(self) -> None:
        self._tracker: Any = None

    def on_start(self, worker_group: Any, backend_config: XGBoostConfig) -> None:
        # A failed attempt's tracker may still wait for workers that died: stop it first.
        self._stop_tracker()
        if worker_group.world_size < 2:
            return
        from xgboost.tracker import RabitTracker

        # sortby="task": ranks follow the task ids (our world ranks), not the order of arrival.
        self._tracker = RabitTracker(
            n_workers=worker_group.world_size, host_ip=worker_group.driver_address(), sortby="task"
        )
        self._tracker.start()
        worker_group.execute(_set_tracker_args, self._tracker.worker_args())

    def on_shutdown(self, worker_group: Any, backend_config: XGBoostConfig) -> None:
        self._stop_tracker()

    def __del__(self) -> None:
        # When the last attempt fails, on_shutdown is not called: the tracker goes with the backend.
        self._stop_tracker()

    def _stop_tracker(self) -> None:
        tracker, self._tracker = self._tracker, None
        if tracker is None:
            return
        try:
            tracker.free()
        except Exception as error:  # noqa: BLE001 - a tracker whose workers are gone reports the broken connection
            logger.debug("xgboost tracker stopped with: %s", error)
