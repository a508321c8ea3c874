"""The training script a user runs on a cluster, unchanged from the laptop: a ``TorchTrainer`` whose
ranks all-reduce every step and each write a shard of every checkpoint.

Run as a script (on the head host, as a Ray Job, or by a Prefect flow), it joins the cluster by
``RAY_ADDRESS`` and writes what it saw to ``OUT``::

    python cluster_script.py STORAGE NAME OUT [--workers N] [--hold-at STEP --markers FOLDER]

``--hold-at``/``--markers`` (tests): rank 0 marks each step's all-reduce done in ``MARKERS``
(``step-<n>-attempt-<a>``), and at step ``HOLD_AT`` every rank waits until ``MARKERS/go`` exists,
so the test can cut a host at that exact step.
"""

from __future__ import annotations

import argparse
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


def trainer(storage: str, name: str, hold_at: int | None = None, markers: str | None = None, workers: int = 6):
    from trainers import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from trainers.torch import TorchTrainer

    return TorchTrainer(
        train_loop,
        train_loop_config={"steps": STEPS, "hold_at": hold_at, "markers": markers},
        scaling_config=ScalingConfig(num_workers=workers, placement_strategy="SPREAD"),
        run_config=RunConfig(
            name=name,
            storage_path=storage,
            failure_config=FailureConfig(max_failures=2),
            checkpoint_config=CheckpointConfig(num_to_keep=None),
        ),
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("storage")
    parser.add_argument("name")
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--hold-at", type=int)
    parser.add_argument("--markers")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = trainer(args.storage, args.name, args.hold_at, args.markers, args.workers).fit()
    frame = result.metrics_dataframe
    import ray

    summary = {
        "seconds": time.monotonic() - started,
        "error": repr(result.error) if result.error else None,
        "steps": [int(s) for s in frame["step"]],
        "worlds": sorted({int(w) for w in frame["world"]}),
        "driver_host": socket.gethostname(),
        "driver_node": ray.util.get_node_ip_address(),
        "gloo_set_by_user": os.environ.get("GLOO_SOCKET_IFNAME"),
        "path": result.path,
        "uri": result.uri,
    }
    pathlib.Path(args.out).write_text(json.dumps(summary))


def committed(run_uri: str) -> dict:
    """The run's record (``run.json``) and each committed checkpoint's rank files by checkpoint
    folder, read from wherever the run is stored (a local folder, S3)."""
    import pyarrow.fs as pafs

    from storage.filesystem import read_bytes, resolve_filesystem

    fs, root = resolve_filesystem(run_uri)
    record = json.loads(read_bytes(fs, f"{root}/run.json"))
    shards = {}
    for checkpoint in record["checkpoints"]:
        found = fs.get_file_info(pafs.FileSelector(f"{root}/{checkpoint['dir_name']}"))
        names = sorted(info.path for info in found if info.base_name.startswith("rank"))
        shards[checkpoint["dir_name"]] = [json.loads(read_bytes(fs, name)) for name in names]
    return {"record": record, "shards": shards}


if __name__ == "__main__":
    main(sys.argv[1:])
