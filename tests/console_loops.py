"""A training loop for tests/test_console_output.py (workers import this module), and the script
the test runs in a subprocess: a demo-sized pipeline on a 2-CPU Ray of its own.

    python tests/console_loops.py <data.parquet> <storage folder> <run name> [fail]
"""

from __future__ import annotations

import sys
import warnings

import trainers

#: What rank 1 warns from its train loop (its run's Prefect logs must show it).
WORKER_WARNING = "console-test: rank 1 warns from inside its train loop"
#: What rank 1 raises with ``fail``.
WORKER_FAILURE = "console-test: rank 1 fails on purpose"


def warning_loop(config: dict) -> None:
    """Counts the rows of its train and valid shards each epoch and reports them; rank 1 warns in
    the first epoch (and with ``fail`` raises there instead of reporting)."""
    rank = trainers.get_context().get_world_rank()
    shards = [trainers.get_dataset_shard(name) for name in ("train", "valid")]
    for epoch in range(config["epochs"]):
        rows = sum(len(batch["label"]) for shard in shards for batch in shard.iter_batches(batch_size=64))
        if epoch == 0 and rank == 1:
            warnings.warn(WORKER_WARNING, stacklevel=1)
            if config.get("fail"):
                raise RuntimeError(WORKER_FAILURE)
        trainers.report({"epoch": epoch, "rows": rows})


def main(data: str, storage: str, name: str, fail: bool = False) -> None:
    """Run the training pipeline on a Ray of 2 CPUs, as ``make demo`` does: the 2 workers then get
    0.5 CPU each, which ``fit()`` warns about in the driver."""
    import ray

    from flows.pipeline import training_pipeline

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=True)
    state = training_pipeline(
        train_loop="console_loops:warning_loop",
        train_loop_config={"epochs": 4, "fail": fail},
        datasets={"train": {"uri": data}, "valid": {"uri": data}},
        scaling={"num_workers": 2},
        failures={"max_failures": 0},
        run={"name": name, "storage_path": storage},
        return_state=True,
    )
    sys.exit(0 if state.is_completed() else 1)  # as examples/pipeline_demo.py: Prefect has logged the failure


if __name__ == "__main__":
    main(*sys.argv[1:4], fail=sys.argv[4:] == ["fail"])
