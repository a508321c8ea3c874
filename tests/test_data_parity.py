"""Ray Data ingest as Ray Train 2.60 does it: the driver's DataContext in the workers, execution
options per dataset, and shards for more workers than rows."""

from __future__ import annotations

import copy

import pytest

import trainers
from trainers import DataConfig, DataParallelTrainer, RunConfig, ScalingConfig, UserCallback


class Rounds(UserCallback):
    """Every round's metrics, one dict per rank."""

    def __init__(self):
        self.rounds = []

    def after_report(self, run_context, metrics, checkpoint):
        self.rounds.append(metrics)


@pytest.fixture
def driver_data_context(ray_local):
    """The driver's DataContext, put back as it was after the test."""
    from ray.data import DataContext

    saved = copy.deepcopy(DataContext.get_current())
    yield DataContext.get_current()
    DataContext._set_current(saved)


def data_context_loop():
    from ray.data import DataContext

    context = DataContext.get_current()
    return {"key": context.get_config("flowtrain_parity_key"), "block": context.target_max_block_size}


def test_the_drivers_data_context_reaches_the_training_function(driver_data_context, tmp_path):
    driver_data_context.set_config("flowtrain_parity_key", {"answer": 42})
    driver_data_context.target_max_block_size = 7 * 1024 * 1024
    result = DataParallelTrainer(
        data_context_loop,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="context", storage_path=str(tmp_path)),
    ).fit()
    assert result.return_value == {"key": {"answer": 42}, "block": 7 * 1024 * 1024}


def ingest_options_loop():
    import ray

    seen = {}
    for name in ("train", "valid"):
        shard = trainers.get_dataset_shard(name)
        options = shard.get_context().execution_options
        seen[name] = {"preserve_order": options.preserve_order, "cpu_limit": options.resource_limits.cpu}
    coordinator = trainers.get_dataset_shard("train")._coord_actor  # Ray Data's split coordinator
    seen["hints"] = ray.get(coordinator.__ray_call__.remote(lambda coordinator: coordinator._locality_hints))
    seen["node"] = ray.get_runtime_context().get_node_id()
    trainers.report(seen)


def test_execution_options_per_dataset_and_the_driver_defaults_for_the_rest(driver_data_context, tmp_path):
    import ray.data
    from ray.data import ExecutionOptions, ExecutionResources

    train, valid = ray.data.range(8), ray.data.range(4)
    # Datasets the dict leaves out get the ingest defaults from the driver's DataContext as it is
    # at fit() (as in Ray), not the options each dataset was created with.
    driver_data_context.execution_options.resource_limits = ExecutionResources(cpu=3)
    seen = Rounds()
    DataParallelTrainer(
        ingest_options_loop,
        datasets={"train": train, "valid": valid},
        dataset_config=DataConfig(
            datasets_to_split=["train"],
            execution_options={
                "train": ExecutionOptions(preserve_order=True, resource_limits=ExecutionResources(cpu=1))
            },
        ),
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(name="options", storage_path=str(tmp_path), callbacks=[seen]),
    ).fit()
    (ranks,) = seen.rounds
    for rank in ranks:
        assert rank["train"] == {"preserve_order": True, "cpu_limit": 1}
        assert rank["valid"] == {"preserve_order": False, "cpu_limit": 3}
        # enable_shard_locality (on by default): each shard prefers its worker's node, in rank order.
        assert rank["hints"] == [r["node"] for r in ranks]
    # The options went to copies: the datasets passed in keep their own.
    assert train.context.execution_options.preserve_order is False
    assert train.context.execution_options.resource_limits.cpu == float("inf")  # Ray Data's "no limit"


def ids_loop():
    import ray

    shard = trainers.get_dataset_shard("train")
    ids = [int(i) for batch in shard.iter_batches(batch_size=4, batch_format="numpy") for i in batch["id"]]
    coordinator = getattr(shard, "_coord_actor", None)
    hints = ray.get(coordinator.__ray_call__.remote(lambda c: c._locality_hints)) if coordinator else "no split"
    trainers.report({"ids": ids, "hints": hints})


def test_more_workers_than_rows_get_empty_shards_with_a_warning(ray_local, tmp_path):
    import ray.data

    seen = Rounds()
    # Shards are equal (as in Ray Train): 1 row over 2 workers leaves each of them none.
    with pytest.warns(
        UserWarning, match=r"datasets\['train'\] has 1 row\(s\) for 2 workers: .* every worker gets an empty shard"
    ):
        DataParallelTrainer(
            ids_loop,
            datasets={"train": ray.data.range(1)},
            dataset_config=DataConfig(enable_shard_locality=False),
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
            run_config=RunConfig(name="tiny", storage_path=str(tmp_path), callbacks=[seen]),
        ).fit()
    (ranks,) = seen.rounds
    assert [r["ids"] for r in ranks] == [[], []]
    assert [r["hints"] for r in ranks] == [None, None]  # enable_shard_locality=False: no hints


def test_an_empty_dataset_trains_on_no_rows_with_a_warning(ray_local, tmp_path):
    import ray.data

    seen = Rounds()
    with pytest.warns(UserWarning, match=r"datasets\['train'\] is empty"):
        DataParallelTrainer(
            ids_loop,
            datasets={"train": ray.data.range(10).limit(0)},
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(name="empty", storage_path=str(tmp_path), callbacks=[seen]),
        ).fit()
    assert seen.rounds == [[{"ids": [], "hints": "no split"}]]


class WholeToEveryRank(DataConfig):
    """A user's DataConfig, as in Ray Train: its configure() decides what each rank gets."""

    calls = []  # what configure() was given, on the driver

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        WholeToEveryRank.calls.append((sorted(datasets), world_size, worker_node_ids))
        return [{name: ds.iterator() for name, ds in datasets.items()} for _ in range(world_size)]


def test_a_data_config_subclass_decides_the_shards_through_configure(ray_local, tmp_path):
    import ray.data

    seen = Rounds()
    DataParallelTrainer(
        ids_loop,
        datasets={"train": ray.data.range(6)},
        dataset_config=WholeToEveryRank(),
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(name="custom", storage_path=str(tmp_path), callbacks=[seen]),
    ).fit()
    (ranks,) = seen.rounds
    assert [sorted(r["ids"]) for r in ranks] == [list(range(6))] * 2
    ((names, world_size, node_ids),) = WholeToEveryRank.calls
    assert (names, world_size) == (["train"], 2)
    assert node_ids == [ray_node_id()] * 2  # one node here: the workers' nodes in rank order


def ray_node_id():
    import ray

    return ray.get_runtime_context().get_node_id()
