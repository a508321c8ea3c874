"""The training script a user runs on a cluster, unchanged from the laptop: a ``TorchTrainer`` whose
ranks all-reduce every step and each write a shard of every checkpoint.

Run as a script (on the head host, as a Ray Job, or by a Prefect flow), it joins the cluster by
``RAY_ADDRESS`` and writes what it saw to ``OUT``::

    python cluster_script.py STORAGE NAME OUT [HOLD_AT] [MARKERS]

``HOLD_AT``/``MARKERS`` (tests): rank 0 marks each step's all-reduce done in ``MARKERS``
(``step-<n>-attempt-<a>``), and at step ``HOLD_AT`` every rank waits until ``MARKERS/go`` exists,
so the test can cut a host at that exact step.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import sys
import tempfile
import time

STEPS = 12


def resumed_step() -> int:
    """The step after the latest checkpoint's (0 without one)."""
    from trainers import get_checkpoint

    checkpoint = get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as folder:
        return json.loads(pathlib.Path(folder, "rank0.json").read_text())["step"] + 1


def train_loop(config: dict) -> None:
    """Each step: an all-reduce across every rank, then a report whose checkpoint holds one file
    per rank naming the rank's node address and attempt."""
    import ray
    import torch
    import torch.distributed as dist

    from trainers import Checkpoint, get_context, report

    context = get_context()
    rank, node = context.get_world_rank(), ray.util.get_node_ip_address()
    hold_at, markers = config.get("hold_at"), config.get("markers")
    for step in range(resumed_step(), config["steps"]):
        total = torch.ones(1)
        dist.all_reduce(total)
        if markers and rank == 0:
            pathlib.Path(markers, f"step-{step}-attempt-{context.get_attempt()}").touch()
        if step == hold_at and markers:
            # Every rank holds here, past the step's all-reduce and before its report, until the
            # test has cut a host: that host's ranks then write their checkpoint files (the disk
            # is shared) and report into a network that no longer reaches the driver.
            while not pathlib.Path(markers, "go").exists():
                time.sleep(0.05)
        with tempfile.TemporaryDirectory() as folder:
            written = {"step": step, "rank": rank, "node": node, "attempt": context.get_attempt()}
            pathlib.Path(folder, f"rank{rank}.json").write_text(json.dumps(written))
            report(
                {"step": step, "world": int(total.item()), "node": node, "gloo": os.environ.get("GLOO_SOCKET_IFNAME")},
                checkpoint=Checkpoint.from_directory(folder),
            )


def trainer(storage: str, name: str, hold_at: int | None = None, markers: str | None = None):
    from trainers import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from trainers.torch import TorchTrainer

    return TorchTrainer(
        train_loop,
        train_loop_config={"steps": STEPS, "hold_at": hold_at, "markers": markers},
        scaling_config=ScalingConfig(num_workers=6, placement_strategy="SPREAD"),
        run_config=RunConfig(
            name=name,
            storage_path=storage,
            failure_config=FailureConfig(max_failures=2),
            checkpoint_config=CheckpointConfig(num_to_keep=None),
        ),
    )


def main(argv: list[str]) -> None:
    storage, name, out = argv[:3]
    hold_at = int(argv[3]) if len(argv) > 3 else None
    markers = argv[4] if len(argv) > 4 else None
    started = time.monotonic()
    result = trainer(storage, name, hold_at, markers).fit()
    frame = result.metrics_dataframe
    summary = {
        "seconds": time.monotonic() - started,
        "error": repr(result.error) if result.error else None,
        "steps": [int(s) for s in frame["step"]],
        "worlds": sorted({int(w) for w in frame["world"]}),
        "driver_host": socket.gethostname(),
        "gloo_set_by_user": os.environ.get("GLOO_SOCKET_IFNAME"),
        "path": result.path,
    }
    pathlib.Path(out).write_text(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1:])
