"""Each use of Ray's private parts (``trainers/_internal/ray_private.py``) against the installed Ray.

A test is named after the use it checks (``test_<name>``) and, when Ray changed underneath
(something missing, or answering in another shape), fails with a message that names that use
and the Ray version it was last checked against. The effects end to end are tested where they
matter: routing worker lines in tests/test_console_output.py, drains in tests/test_preemption.py,
elastic sizing in tests/test_elastic.py, the footer readers in tests/test_ray_data.py, Tune trials
in tests/test_tune.py.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import types
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from trainers._internal import ray_private
from trainers._internal.ray_private import CHECKED_AGAINST


@contextlib.contextmanager
def private_use(name: str):
    """Turn any failure inside (a missing name, an assertion on its shape) into one that names the use."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - whatever broke, say which use it was
        pytest.fail(
            f"ray_private.{name} no longer works with Ray {ray.__version__} (checked against {CHECKED_AGAINST}): "
            f"{type(error).__name__}: {error}. See its docstring for what it uses; fix it there.",
            pytrace=True,
        )


def test_every_private_use_has_its_test():
    uses = [
        name
        for name, value in vars(ray_private).items()
        if not name.startswith("_") and callable(value) and getattr(value, "__module__", None) == ray_private.__name__
    ]
    assert len(uses) >= 9, uses
    missing = [name for name in uses if f"test_{name}" not in globals()]
    assert not missing, f"uses of Ray's private parts without a test here: {missing}"


def test_checked_against_the_installed_ray():
    assert ray.__version__ == CHECKED_AGAINST, (
        f"Ray {ray.__version__} is installed, but trainers/_internal/ray_private.py was checked against "
        f"{CHECKED_AGAINST}: run this module, fix the uses it names, read each docstring's public replacement "
        "again, then set CHECKED_AGAINST."
    )


# -- worker output ---------------------------------------------------------------------------


def test_wrap_worker_line_printer(ray_local):
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    with private_use("wrap_worker_line_printer"):
        names = [name for name, _ in dispatcher.handlers]
        assert ray_private.WORKER_LINE_PRINTER in names, (
            f"no handler named {ray_private.WORKER_LINE_PRINTER!r} among {names}"
        )
        printer = dict(dispatcher.handlers)[ray_private.WORKER_LINE_PRINTER]
        seen = []
        ray_private.wrap_worker_line_printer(lambda handler: seen.append(handler) or handler)
        assert seen == [printer], seen
        assert dict(dispatcher.handlers)[ray_private.WORKER_LINE_PRINTER] is printer


@ray.remote(num_cpus=0)
class Announcer:
    def say(self, label: str, line: str) -> None:
        from trainers.worker_output import announce

        announce(label)
        print(line, flush=True)


def test_actor_name_line(ray_local):
    from trainers.worker_output import capture_worker_output, worker_label

    arrived = threading.Event()
    lines = []

    def sink(rank: int, batch: list[str], is_err: bool) -> None:
        lines.extend(batch)
        if "under its new name" in batch:
            arrived.set()

    with private_use("actor_name_line"):
        assert ray_private.actor_name_line("x").endswith("x\n")
        actor = Announcer.remote()
        try:
            with capture_worker_output("ray-private", sink):
                ray.get(actor.say.remote(worker_label("ray-private", 0), "under its new name"))
                assert arrived.wait(timeout=60), (
                    f"the worker's line never came under its new name (got {lines}): Ray's log monitor no longer "
                    "renames an actor's lines after the marker line"
                )
        finally:
            ray.kill(actor)


def test_ray_console_handlers(ray_local):
    import logging

    import ray.data  # noqa: F401 - Ray Data sets up its own console handler when imported

    with private_use("ray_console_handlers"):
        handlers = ray_private.ray_console_handlers()
        owners = {name for name in ("ray", "ray.data") for h in logging.getLogger(name).handlers if h in handlers}
        assert owners == {"ray", "ray.data"}, (
            f"Ray's console handlers found on {owners}, not on both 'ray' and 'ray.data'"
        )
        assert all(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) for h in handlers), (
            handlers
        )


# -- the cluster -----------------------------------------------------------------------------


def test_available_resources_per_node(ray_local):
    with private_use("available_resources_per_node"):
        nodes = {node["NodeID"]: node["Resources"] for node in ray.nodes() if node["Alive"]}
        free = ray_private.available_resources_per_node()
        assert isinstance(free, dict) and set(free) == set(nodes), (
            f"{sorted(free)} are not the live nodes {sorted(nodes)}"
        )
        for node, amounts in free.items():
            assert isinstance(amounts, dict) and all(isinstance(v, float) for v in amounts.values()), amounts
            assert 0 <= amounts.get("CPU", 0.0) <= nodes[node]["CPU"], (amounts, nodes[node])


def test_draining_nodes(ray_local):
    # A local cluster drains nothing; tests/test_preemption.py drains a node of a two-node Ray.
    with private_use("draining_nodes"):
        assert ray_private.draining_nodes() == {}


# -- Ray Data --------------------------------------------------------------------------------


def test_set_current_data_context(ray_local):
    import copy

    from ray.data import DataContext

    before = DataContext.get_current()
    mine = copy.deepcopy(before)
    mine.enable_progress_bars = not before.enable_progress_bars
    with private_use("set_current_data_context"):
        try:
            ray_private.set_current_data_context(mine)
            assert DataContext.get_current() is mine
        finally:
            ray_private.set_current_data_context(before)
        assert DataContext.get_current() is before


def test_right_size_footer_readers(ray_local, tmp_path):
    import pyarrow.fs
    import ray.data
    from ray import cloudpickle

    for part in range(3):
        pq.write_table(pa.table({"id": [part]}), tmp_path / f"part-{part}.parquet")
    dataset = ray.data.read_parquet(str(tmp_path))
    with private_use("right_size_footer_readers"):
        ray_private.right_size_footer_readers(dataset)
        (indexer,) = [
            op.file_indexer
            for op in ray_private._operators(dataset._logical_plan.dag)
            if getattr(op, "file_indexer", None)
        ]
        assert type(indexer).__name__ == "RightSizedFooterIndexer", f"the listing's indexer is {type(indexer)}"
        assert isinstance(indexer._num_actors, int) and isinstance(indexer._footer_batch_size, int)
        # Datasets travel to Ray Data's processes: the class by its name, not its code.
        blob = cloudpickle.dumps(indexer)
        assert b"_iter_file_infos_for_list" not in blob and type(cloudpickle.loads(blob)) is type(indexer)
        # The pool is sized from the files Ray Data lists first ...
        local = pyarrow.fs.LocalFileSystem()
        files = list(indexer._iter_file_infos_for_list(pa.array([str(tmp_path)]), filesystem=local))
        assert len(files) == 3 and indexer._num_actors == 1, (files, indexer._num_actors)
        # ... which must come before Ray Data starts the pool.
        base = type(indexer).__base__
        source = inspect.getsource(base.list_files)
        assert 0 <= source.find("_iter_file_infos_for_list") < source.find("range(self._num_actors)"), (
            "FooterFileIndexer.list_files no longer lists the files before starting its pool of self._num_actors readers"
        )
        # Files that fit one batch have their footers read in the listing task, by a FooterReader
        # built and called as Ray's pool builds and calls its actors.
        from ray.data._internal.datasource_v2.formats.parquet.footer_reader import FooterReader

        listed = set(inspect.signature(base.list_files).parameters) - {"self", "paths"}
        listing = set(inspect.signature(base._iter_file_infos_for_list).parameters) - {"self", "paths"}
        assert listed - {"predicate", "limit", "projected_columns"} == listing, (listed, listing)
        built = list(inspect.signature(FooterReader).parameters)
        assert built[:5] == ["filesystem", "io_concurrency", "filter_expr", "projected_cols", "coalesce_bytes"], built
        assert "excluded_read_unit_ids" in built
        assert {"result_batch_size", "preserve_order"} <= set(inspect.signature(FooterReader.read_footers).parameters)
        threads = pa.io_thread_count()
        manifests = list(indexer.list_files(pa.array([str(tmp_path)]), filesystem=local, preserve_order=True))
        assert sorted(path for m in manifests for path in m.paths) == sorted(str(f.path) for f in files)
        assert pa.io_thread_count() == threads  # the process's Arrow IO threads as they were


@pytest.fixture
def blocks_in_order():
    """Ray Data hands blocks out as they finish unless told to keep their order; these tests name
    which rows come first, so they run with ``preserve_order`` (as an exact resume does)."""
    import ray.data

    options = ray.data.DataContext.get_current().execution_options
    before, options.preserve_order = options.preserve_order, True
    yield
    options.preserve_order = before


def test_counting_iterator(ray_local, blocks_in_order):
    import pickle

    import ray.data

    from storage.positions import ShardRecord
    from trainers._internal.session.data_position import ShardPosition

    dataset = ray.data.range(30, override_num_blocks=3)
    with private_use("counting_iterator"):
        position = ShardPosition.resumed(ShardRecord(0, 12))
        waits = types.SimpleNamespace(data_wait_s=0.0)
        iterator = ray_private.counting_iterator(dataset.iterator(), position, waits)
        assert isinstance(iterator, ray.data.DataIterator)
        batches = [list(b["id"]) for b in iterator.iter_batches(batch_size=5)]  # starts after row 12
        assert sum(batches, []) == list(range(12, 30)) and position.to_record() == ShardRecord(1, 0)
        assert waits.data_wait_s > 0  # the pass's start, at least, was waited for
        rows = iterator.iter_rows()
        for row in rows:
            if row["id"] == 3:
                break
        assert position.to_record() == ShardRecord(1, 4)  # counted one by one, as handed out
        torch_ids = [int(i) for b in iterator.iter_torch_batches(batch_size=None) for i in b["id"]]
        assert torch_ids == list(range(30)) and position.to_record() == ShardRecord(3, 0)
        assert type(pickle.loads(pickle.dumps(iterator))) is type(dataset.iterator())  # elsewhere: the plain shard


def test_skip_rows(ray_local, blocks_in_order):
    import ray.data

    dataset = ray.data.range(30, override_num_blocks=3)  # blocks of 10 rows
    with private_use("skip_rows"):
        bundles, _, executor = dataset.iterator()._to_ref_bundle_iterator()
        try:
            kept = list(ray_private.skip_rows(bundles, 13))
        finally:
            executor.shutdown(force=True)
        blocks = [ray.get(ref) for bundle in kept for ref in bundle.block_refs]
        assert [list(block["id"].to_pylist()) for block in blocks] == [list(range(13, 20)), list(range(20, 30))]
        assert [m.num_rows for bundle in kept for m in bundle.metadata] == [7, 10]


def test_default_ingest_options_use_no_deprecated_ray_data_option(monkeypatch):
    import copy

    from ray.data import DataContext, ExecutionResources

    from trainers import DataConfig

    context = DataContext.get_current()
    options = copy.deepcopy(context.execution_options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a user's own use of the deprecated option
        options.exclude_resources = ExecutionResources(cpu=1)
    options.label_selector = {"pool": "data"}
    monkeypatch.setattr(context, "execution_options", options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ingest = DataConfig().default_ingest_options()
    assert ingest == options and ingest is not options  # carried over, Ray's replacement included
    assert ingest.exclude_resources.cpu == 1 and ingest.label_selector == {"pool": "data"}


# -- Ray Tune --------------------------------------------------------------------------------


def test_in_tune_function_session():
    # Outside a trial here; tests/test_tune.py runs trials that need the True answer.
    with private_use("in_tune_function_session"):
        assert ray_private.in_tune_function_session() is False


def test_TuneTrainableAttributes():
    from ray import tune
    from ray.tune.experiment.experiment import Experiment
    from ray.tune.trainable.function_trainable import wrap_function

    from trainers import DataParallelTrainer, ScalingConfig
    from trainers.tune import trainer_trial_resources

    trainer = DataParallelTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=2))
    with private_use("TuneTrainableAttributes"):
        assert Experiment.get_trainable_name(trainer) == "DataParallelTrainer"
        assert wrap_function(trainer).default_resource_request({}) == trainer_trial_resources(trainer)
        assert tune.with_resources(trainer, {"CPU": 3}) is trainer
        assert wrap_function(trainer).default_resource_request({}).required_resources == {"CPU": 3}


def test_end_dataset_splits(ray_local):
    """Killing the coordinator ends a shard's wait in the epoch barrier for a rank that never comes."""
    import ray.data

    shards = [{"train": it} for it in ray.data.range(8).streaming_split(2, equal=True)]
    outcome: dict = {}

    def read_one_shard() -> None:
        try:
            outcome["rows"] = sum(len(b["id"]) for b in shards[0]["train"].iter_batches(batch_size=4))
            outcome["rows"] += sum(len(b["id"]) for b in shards[0]["train"].iter_batches(batch_size=4))
        except Exception as error:  # noqa: BLE001 - what the kill should cause
            outcome["error"] = error

    reader = threading.Thread(target=read_one_shard, daemon=True)
    reader.start()
    reader.join(5)
    assert reader.is_alive(), "rank 0 should wait for rank 1 at an epoch barrier"
    with private_use("end_dataset_splits"):
        assert ray_private.end_dataset_splits(shards) == 1
    reader.join(30)
    assert not reader.is_alive() and "error" in outcome, outcome


def test_count_items(monkeypatch):
    """Not a use of Ray's private parts: the counting and timing that ``counting_iterator``'s
    passes do, for batches already in hand (``trainers.testing.ShardCounter.count``). On a clock
    of the test's own, the time the loop waited for each item is counted and its own time is not."""
    from trainers._internal.session.data_position import ShardPosition

    now = [0.0]
    monkeypatch.setattr(ray_private, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    def produced():
        for item in ("a", "b", "c"):
            now[0] += 1.0  # the data pipeline's second
            yield item
        now[0] += 0.5  # its end of the pass

    position = ShardPosition()
    position.start_pass()
    waits = types.SimpleNamespace(data_wait_s=0.0)
    handed = []
    for item in ray_private.count_items(produced(), position, 10, waits):
        assert position.rows == 10 * (len(handed) + 1)
        handed.append(item)
        now[0] += 10.0  # the loop's own work: not waiting
    assert handed == ["a", "b", "c"] and (position.epoch, position.rows) == (1, 0)  # a full pass ends the epoch
    assert waits.data_wait_s == 3.5
