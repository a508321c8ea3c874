"""A real multi-node Ray on one machine, and the bits the tests that kill, add or drain nodes share:
a callback that records rank 0's reports and lets the test wait for one, and fit() in a thread."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from conftest import assert_no_leaks
from trainers import UserCallback


@contextlib.contextmanager
def two_node_cluster(monkeypatch: Any, *, start_timeout_s: float, spare: bool = True) -> Iterator[tuple[Any, Any]]:
    """Head and one more node, 1 CPU each; yields ``(cluster, spare_node)`` (``spare=False``: the
    head alone, and None). Worker groups that cannot be placed fail after ``start_timeout_s``
    instead of the default 120 s."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()  # the suite's shared single-node Ray; ray_local restarts it when needed
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    spare_node = cluster.add_node(num_cpus=1) if spare else None
    ray.init(address=cluster.address)
    monkeypatch.setenv("FLOWTRAIN_WORKER_START_TIMEOUT_S", str(start_timeout_s))  # read by each fit()
    try:
        yield cluster, spare_node
        assert_no_leaks()
    finally:
        ray.shutdown()
        cluster.shutdown()


class RecordedReports(UserCallback):
    """Rank 0's reports and checkpoints as the driver sees them, the kinds of failure behind each
    restart, and a way to wait for a report that matches."""

    def __init__(self) -> None:
        self.reports: list[dict] = []
        self.checkpoints: list[Any] = []
        self.restarts: list[list] = []
        self.changed = threading.Condition()

    def after_report(self, run_context, metrics, checkpoint):
        with self.changed:
            self.reports.append(metrics[0])
            self.checkpoints.append(checkpoint)
            self.changed.notify_all()

    def on_restart(self, run_context, failures, resume_from):
        self.restarts.append(failures)

    def wait_for(self, match: Callable[[dict], bool], after: int = 0, timeout_s: float = 180) -> int:
        """The index of the first report from index ``after`` on that ``match``es (waits for it)."""
        with self.changed:
            found = self.changed.wait_for(lambda: any(match(r) for r in self.reports[after:]), timeout=timeout_s)
            assert found, f"no matching report after report {after}: {self.reports[-3:]}"
            return next(i for i, r in enumerate(self.reports) if i >= after and match(r))


def fit_in_background(trainer: Any) -> tuple[threading.Thread, dict]:
    """Start ``trainer.fit()`` in a thread; its Result (or error) lands in the returned dict."""
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as error:  # noqa: BLE001 - the test asserts on it
            outcome["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome
