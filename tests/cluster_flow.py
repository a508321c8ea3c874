"""The cluster script as a Prefect flow, for a deployment that a process worker on another host runs:
its fit() joins the cluster by the worker's RAY_ADDRESS, as any flow run of the pipeline does."""

from __future__ import annotations

from prefect import flow

import cluster_script


@flow(name="cluster-train", retries=1)
def train_on_cluster(storage: str, name: str, out: str, hold_at: int | None = None, markers: str | None = None) -> None:
    """Train ``cluster_script``'s 6 workers; its summary goes to ``out`` (``hold_at``/``markers``:
    see ``cluster_script``)."""
    cluster_script.main([storage, name, out, *([str(hold_at), markers] if markers else [])])
