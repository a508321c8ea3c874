"""Ray Data ingestion on a 2-CPU Ray: sharding, training through iter_torch_batches, errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import loops
from conftest import assert_no_leaks
from trainers import (
    DataConfig,
    FailureConfig,
    InsufficientResourcesError,
    RunConfig,
    ScalingConfig,
    UserCallback,
    WorkerGroupError,
)
from trainers.data import DatasetError, read_dataset
from trainers.torch import TorchTrainer


@pytest.fixture(scope="module")
def ray_two_cpus():
    """This machine's real size: Ray Data must share 2 CPUs with 2 training workers."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture
def two_cpus(ray_two_cpus):
    yield
    assert_no_leaks()


def write_ids(folder, rows=1000, files=4):
    folder.mkdir()
    per = rows // files
    for f in range(files):
        ids = np.arange(f * per, (f + 1) * per)
        pq.write_table(pa.table({"id": ids, "value": ids * 0.5}), folder / f"part-{f}.parquet")
    return folder


class AllRanks(UserCallback):
    def __init__(self):
        self.rounds = []

    def after_report(self, run_context, metrics, checkpoint):
        self.rounds.append(metrics)


def test_two_workers_see_every_row_exactly_once_and_equal_counts(two_cpus, tmp_path):
    dataset = read_dataset(str(write_ids(tmp_path / "ids")), required_columns={"id": "int", "value": "float"})
    seen = AllRanks()
    with pytest.warns(UserWarning, match=r"Giving each of the 2 training workers 0.5 CPU"):
        TorchTrainer(
            loops.collect_ids_loop,
            datasets={"train": dataset},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="shards", storage_path=str(tmp_path), callbacks=[seen]),
        ).fit()
    (round_,) = seen.rounds
    ids = round_[0]["ids"] + round_[1]["ids"]
    assert sorted(ids) == list(range(1000))  # the union is the whole dataset, no duplicates
    assert round_[0]["count"] == round_[1]["count"] == 500


def test_shards_are_rebuilt_after_a_restart(two_cpus, tmp_path):
    import warnings

    dataset = read_dataset(str(write_ids(tmp_path / "ids")))
    seen = AllRanks()
    marker = tmp_path / "failed-once"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the fractional-CPU notice, tested above
        TorchTrainer(
            loops.collect_ids_loop,
            train_loop_config={"fail_marker": str(marker)},
            datasets={"train": dataset},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(
                name="restart",
                storage_path=str(tmp_path),
                failure_config=FailureConfig(max_failures=1),
                callbacks=[seen],
            ),
        ).fit()
    assert marker.exists()
    (round_,) = seen.rounds  # the failed attempt reported nothing
    assert sorted(round_[0]["ids"] + round_[1]["ids"]) == list(range(1000))


def footer_readers_started() -> int:
    """FooterReader actors Ray has started since it came up (ended ones included). Ray's public
    state API needs the dashboard, which these tests do not start; the GCS table does not."""
    import ray

    return sum("FooterReader" in str(actor.get("ActorClassName", "")) for actor in ray._private.state.actors().values())


@pytest.mark.parametrize("files", [25, 8])
def test_a_parquet_listing_starts_one_footer_reader_per_ten_files_not_ray_datas_32(two_cpus, tmp_path, files):
    import warnings

    import ray.data

    # 25 files: Ray Data hands footers out 10 files at a time, so 3 readers can all be busy. 8
    # files fit one batch: the listing task reads their footers itself, and starts no process.
    dataset = ray.data.read_parquet(str(write_ids(tmp_path / "ids", files=files)))
    before = footer_readers_started()
    seen = AllRanks()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the fractional-CPU notice, tested above
        TorchTrainer(
            loops.collect_ids_loop,
            datasets={"train": dataset},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="footers", storage_path=str(tmp_path), callbacks=[seen]),
        ).fit()
    started = footer_readers_started() - before
    (round_,) = seen.rounds
    assert sorted(round_[0]["ids"] + round_[1]["ids"]) == list(range(1000))  # the read itself is unchanged
    # One listing for the epoch, and at most one more for the row count checked before the
    # workers start; Ray Data alone starts 32 readers for each.
    assert started in ((3, 6) if files == 25 else (0,)), started


def test_iter_torch_batches_trains_like_a_dataloader(two_cpus, tmp_path):
    import ray.data
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    x, y = loops.dataset()
    frame = {f"x{i}": x[:, i].numpy() for i in range(4)} | {"y": y[:, 0].numpy()}
    pq.write_table(pa.table(frame), tmp_path / "regression.parquet")
    dataset = read_dataset(str(tmp_path / "regression.parquet"))
    options = ray.data.ExecutionOptions(preserve_order=True)
    result = TorchTrainer(
        loops.ray_data_regression_loop,
        train_loop_config={"epochs": 3},
        datasets={"train": dataset},
        dataset_config=DataConfig(execution_options=options),
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="regression", storage_path=str(tmp_path)),
    ).fit()

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=False)
    for _ in range(3):
        total = 0.0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(yb)
    # Same rows in the same order and batch size: the same loss up to float32 rounding.
    assert result.return_value == pytest.approx(total / len(x), rel=1e-5)


def test_workers_that_would_take_every_cpu_fail_at_once_saying_what_to_change(two_cpus, tmp_path):
    import ray.data

    with pytest.raises(
        InsufficientResourcesError,
        match=r"Ray Data needs at least 1 CPU beside the training workers, but 2 workers take 2 of the cluster's 2 CPUs",
    ) as info:
        TorchTrainer(
            loops.collect_ids_loop,
            datasets={"train": ray.data.range(10)},
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(name="starved", storage_path=str(tmp_path)),
        ).fit()
    assert "lower ScalingConfig.num_workers or resources_per_worker['CPU']" in str(info.value)


def test_dataset_errors_are_clear(two_cpus, tmp_path):
    import ray.data

    with pytest.raises(TypeError, match=r"datasets\['train'\]=list: pass a ray.data.Dataset"):
        TorchTrainer(loops.collect_ids_loop, datasets={"train": [1, 2, 3]})
    # An empty dataset, or fewer rows than workers, trains with a warning as in Ray Train: see
    # test_data_parity.py.
    with pytest.raises(
        WorkerGroupError, match=r"get_dataset_shard\('valid'\): no dataset of that name; the trainer has 'train'"
    ):
        TorchTrainer(
            loops.ask_for_unknown_dataset,
            datasets={"train": ray.data.range(4)},
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(name="unknown", storage_path=str(tmp_path)),
        ).fit()


def test_reader_names_the_file_and_the_column(two_cpus, tmp_path):
    path = tmp_path / "table.parquet"
    pq.write_table(pa.table({"id": [1, 2], "label": ["a", "b"]}), path)
    with pytest.raises(DatasetError, match=rf"{path}: column 'y' is missing; the columns are \['id', 'label'\]"):
        read_dataset(str(path), required_columns={"y": "float"})
    with pytest.raises(DatasetError, match=rf"{path}: column 'label' holds string, expected number values"):
        read_dataset(str(path), required_columns={"label": "number"})
    with pytest.raises(DatasetError, match=r"no such file or folder"):
        read_dataset(str(tmp_path / "missing.parquet"))
    (tmp_path / "data.bin").write_bytes(b"\0")
    with pytest.raises(DatasetError, match=r"data.bin: cannot tell the format from the name; pass format="):
        read_dataset(str(tmp_path / "data.bin"))
    csv = tmp_path / "table.csv"
    csv.write_text("id,score\n1,0.5\n2,1.5\n")
    assert read_dataset(str(csv), required_columns={"score": "float"}).count() == 2


def test_datasets_not_split_reach_every_rank_whole(two_cpus, tmp_path):
    import ray.data

    seen = AllRanks()
    TorchTrainer(
        loops.collect_ids_loop,
        datasets={"train": ray.data.range(40)},
        dataset_config=DataConfig(datasets_to_split=[]),
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(name="whole", storage_path=str(tmp_path), callbacks=[seen]),
    ).fit()
    (round_,) = seen.rounds
    assert sorted(round_[0]["ids"]) == sorted(round_[1]["ids"]) == list(range(40))
