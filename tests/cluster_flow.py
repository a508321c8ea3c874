"""The cluster script as a Prefect flow, for a deployment that a process worker on another host runs:
its fit() joins the cluster by the worker's RAY_ADDRESS, as any flow run of the pipeline does."""

from __future__ import annotations

import os
import pathlib

from prefect import flow

import cluster_script


#: A retry of a flow run whose driver was cut off finds the run's lease still held until the cut
#: driver's last heartbeat on the storage is ``stale_after_s`` (30 s) old: fit() refuses it with
#: RunInProgressError meanwhile, and the flow tries again.
@flow(name="cluster-train", retries=3, retry_delay_seconds=10)
def train_on_cluster(
    storage: str,
    name: str,
    out: str,
    hold_at: int | None = None,
    markers: str | None = None,
    workers: int = 6,
) -> None:
    """Train ``cluster_script``'s workers; its summary goes to ``out`` (``hold_at``/``markers``:
    see ``cluster_script``; in ``markers`` the flow run also leaves its id and its process's pid)."""
    if markers:
        from prefect.runtime import flow_run

        pathlib.Path(markers, f"flow-run-{flow_run.id}-pid-{os.getpid()}").touch()
    held = ["--hold-at", str(hold_at), "--markers", markers] if markers else []
    cluster_script.main([storage, name, out, "--workers", str(workers), *held])
