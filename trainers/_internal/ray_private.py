"""Every part of Ray that Ray does not promise to keep, used through this one module.

Each name says what flowtrain uses it for, what of Ray's it touches (as of ``CHECKED_AGAINST``)
and why no public API of Ray 2.60 replaces it. ``tests/test_ray_private.py`` exercises each against
the installed Ray: after upgrading Ray, run it, fix what it names, then move ``CHECKED_AGAINST``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

#: The Ray version every use below was read and tested against.
CHECKED_AGAINST = "2.60.0"

#: The name ``ray.init(log_to_driver=True)`` gives its printer of worker lines (``ray._private.worker``).
WORKER_LINE_PRINTER = "ray_print_logs"


# -- worker output ---------------------------------------------------------------------------


def actor_name_line(label: str) -> str:
    """The line that, written to an actor's stdout or stderr, makes Ray show the lines after it
    under ``label`` (``worker_output.announce``).

    Uses ``ray._private.ray_constants.LOG_PREFIX_ACTOR_NAME``, the prefix Ray's log monitor looks
    for. Public replacement: none; an actor's ``__repr__`` names its lines once, when it starts.
    """
    from ray._private import ray_constants

    return f"{ray_constants.LOG_PREFIX_ACTOR_NAME}{label}\n"


def wrap_worker_line_printer(wrap: Callable[[Callable[[dict], Any]], Callable[[dict], Any]]) -> None:
    """Replace the driver's printer of forwarded worker lines by ``wrap(printer)``
    (``worker_output.install``); a no-op when this process does not forward them.

    Uses ``ray._private.ray_logging.global_worker_stdstream_dispatcher``: its ``handlers`` list of
    ``(name, handler)`` pairs, swapped under its ``_lock`` so no batch of lines slips past. Public
    replacement: none; ``ray.init(log_to_driver=False)`` turns all worker lines off, it does not route them.
    """
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    with dispatcher._lock:
        dispatcher.handlers = [
            (name, wrap(handler) if name == WORKER_LINE_PRINTER else handler) for name, handler in dispatcher.handlers
        ]


def ray_console_handlers() -> list[logging.Handler]:
    """The handlers that print Ray's (and Ray Data's) log records on the terminal, not those of
    Ray's log files (``tasks.console`` filters them).

    Uses ``ray._private.log.PlainRayHandler``. Public replacement: none; picking the
    ``StreamHandler``s would also pick handlers a user put on Ray's loggers.
    """
    from ray._private.log import PlainRayHandler

    return [
        handler
        for name in ("ray", "ray.data")
        for handler in logging.getLogger(name).handlers
        if isinstance(handler, PlainRayHandler)
    ]


# -- the cluster -----------------------------------------------------------------------------


def available_resources_per_node() -> dict[str, dict[str, float]]:
    """What each live node has free now: node id (hex) -> resource name -> amount (elastic
    sizing, and the "Nodes now" part of start errors).

    Uses ``ray._private.state.available_resources_per_node``. Public replacement: none;
    ``ray.available_resources()`` sums the cluster, ``ray.nodes()`` gives totals, and
    ``ray.util.state`` needs the dashboard (the local Ray starts none) and shows no free amounts.
    """
    from ray._private import state

    return state.available_resources_per_node()


def draining_nodes() -> dict[str, int]:
    """The nodes Ray is draining: node id (hex) -> deadline in UNIX milliseconds, 0 for none
    (preemption notices, and nodes an elastic run must not grow onto).

    Uses ``ray._private.state.state.get_draining_nodes``, as Ray Train 2.60's own preemption
    watch does. Public replacement: none; ``ray.nodes()`` has no drain state in 2.60.
    """
    from ray._private import state

    return dict(state.state.get_draining_nodes() or {})


# -- Ray Data --------------------------------------------------------------------------------


def set_current_data_context(context: Any) -> None:
    """Make ``context`` this process's ``ray.data.DataContext`` (each worker gets the driver's).

    Uses ``DataContext._set_current``, as Ray Train's workers do. Public replacement: none.
    """
    from ray.data import DataContext

    DataContext._set_current(context)


def end_dataset_splits(shards: list[dict[str, Any]]) -> int:
    """Kill the split coordinators behind one attempt's dataset shards (``streaming_split``);
    returns how many. A rank done with its share of an epoch waits in the coordinator's epoch
    barrier (a ``ray.get`` in Ray Data's prefetch thread, out of reach of anything raised in its
    thread) for every rank, a dead one too: with the coordinator gone that call fails and the
    rank's loop ends, so it can serve the next attempt.

    Uses ``StreamSplitDataIterator._coord_actor``. Public replacement: none (no cancelling).
    """
    import ray

    actors = (getattr(iterator, "_coord_actor", None) for shard in shards for iterator in shard.values())
    coordinators = {actor._actor_id: actor for actor in actors if actor is not None}
    for actor in coordinators.values():
        with contextlib.suppress(Exception):  # already dead, or Ray shut down: gone either way
            ray.kill(actor, no_restart=True)
    return len(coordinators)


def right_size_footer_readers(dataset: Any) -> None:
    """Let every Parquet listing in ``dataset``'s plan start one footer reader per batch of files
    it reads (at most Ray Data's setting) instead of always 32, and none when its files fit one
    batch: their footers are then read in the listing task itself. The read itself is unchanged.

    Why: every execution of a ``read_parquet`` dataset (each epoch of a ``streaming_split``, each
    pass over a whole dataset) lists its files with a fresh pool of ``FooterReader`` actors,
    ``RAY_DATA_PARQUET_FOOTER_NUM_ACTORS`` (32) new processes, handed 10 files each. With 8 files
    31 of them only take CPU from the workers starting beside them (on 2 cores a 250k-row epoch
    waited 2.6-4.0 s for its first batch, 1.4 s with one); and even one is a process start: 1-file
    datasets waited 1 s for their first batch every epoch, 0.1 s read in the listing task (issue 62).

    Uses ``Dataset._logical_plan.dag`` (``input_dependencies``, ``file_indexer``) and swaps the
    class of each ``FooterFileIndexer`` for a subclass overriding ``_iter_file_infos_for_list``
    (sets ``_num_actors`` from ``_footer_batch_size``) and ``list_files`` (one batch: a
    ``FooterReader`` of its own from ``_io_concurrency`` and ``_coalesce_bytes``, its
    ``read_footers``, ``_file_chunks_to_manifest`` and ``pool``). Plans or indexers without these
    are left as they are. Public replacement: none; the pool size is one variable for the process.
    """
    right_sized = _right_sized_footer_indexer()
    if right_sized is None:
        return
    settings = ("_num_actors", "_footer_batch_size", "_io_concurrency", "_coalesce_bytes", "_iter_file_infos_for_list")
    plan = getattr(dataset, "_logical_plan", None)
    for op in _operators(getattr(plan, "dag", None)):
        indexer = getattr(op, "file_indexer", None)
        if type(indexer) is right_sized.__base__ and all(hasattr(indexer, name) for name in settings):
            indexer.__class__ = right_sized


def counting_iterator(inner: Any, position: Any, waits: Any) -> Any:
    """``inner`` (a worker's shard) as a ``DataIterator`` that tells ``position``
    (``session.data_position``) what it hands to the training loop, and adds the seconds the loop
    waits for each batch to ``waits.data_wait_s`` (a ``RankHealth``).

    Each pass over it (any ``iter_*``/``to_tf`` loop, or ``materialize``) calls
    ``position.start_pass()``, which answers how many rows to skip (a resumed epoch), then
    ``position.handed_out(rows)`` per batch or row, and ``position.end_pass()`` at its end.
    Skipped rows are dropped before their blocks are fetched (``skip_rows``). Pickled, it is ``inner``.

    Uses ``DataIterator``'s hooks ``_to_ref_bundle_iterator``, ``_iter_batches`` (every public
    iteration method goes through them), ``_on_iteration_end`` and ``_get_dataset_tag``. Public
    replacement: none; Ray Data has no iterator position nor mid-way start (Ray's issues 37633, 46814).
    """
    return _counting_iterator_class()(inner, position, waits)


def skip_rows(bundles: Iterator[Any], rows: int) -> Iterator[Any]:
    """The ``RefBundle`` stream ``bundles`` without its first ``rows`` rows: whole blocks dropped
    by their metadata (never fetched), the block the cut falls in fetched, sliced and put back.
    Counted in whole blocks, as Ray Data's batching reads them (it ignores a bundle's ``slices``).

    Uses ``RefBundle``, ``BlockEntry`` and ``BlockAccessor``. Public replacement: none
    (``Dataset.limit`` keeps the first rows; there is no offset).
    """
    import ray
    from ray.data._internal.execution.interfaces.ref_bundle import BlockEntry, RefBundle
    from ray.data.block import BlockAccessor

    for bundle in bundles:
        if rows <= 0:
            yield bundle
            continue
        kept = []
        for entry in bundle.blocks:
            count = entry.metadata.num_rows
            block = None
            if count is None:
                block = ray.get(entry.ref)
                count = BlockAccessor.for_block(block).num_rows()
            if rows >= count:
                rows -= count
                continue
            if rows > 0:
                accessor = BlockAccessor.for_block(block if block is not None else ray.get(entry.ref))
                tail = accessor.slice(rows, accessor.num_rows(), copy=True)
                ref: Any = ray.put(tail)  # ray.put's ObjectRef class is the one ray.types names, by another path
                entry = BlockEntry(ref=ref, metadata=BlockAccessor.for_block(tail).get_metadata())
                rows = 0
            kept.append(entry)
        if kept:
            yield RefBundle(blocks=tuple(kept), schema=bundle.schema, owns_blocks=False)


@functools.cache
def _counting_iterator_class() -> type:
    """Built on first use: importing this module (every worker does) must not import Ray Data."""
    from ray.data import DataIterator

    def delegate(name: str) -> Any:  # DataIterator's own methods, which __getattr__ is never asked for
        return lambda self, *args: getattr(self._inner, name)(*args)

    class CountingIterator(DataIterator):
        def __init__(self, inner: Any, position: Any, waits: Any) -> None:
            self._inner, self._position, self._waits = inner, position, waits
            self._rows_one_by_one = False

        def __reduce__(self) -> Any:
            return (_same, (self._inner,))

        def __getattr__(self, name: str) -> Any:
            if name.startswith("__") or name in ("_inner", "_position", "_waits"):
                raise AttributeError(name)
            return getattr(self._inner, name)  # world_size() and the like of the inner iterator

        def __repr__(self) -> str:
            return repr(self._inner)

        def _to_ref_bundle_iterator(self) -> Any:
            skip = self._position.start_pass()
            bundles, stats, executor = self._inner._to_ref_bundle_iterator()
            return (skip_rows(bundles, skip) if skip else bundles), stats, executor

        _on_iteration_end = delegate("_on_iteration_end")
        _get_dataset_tag = delegate("_get_dataset_tag")
        stats = delegate("stats")
        schema = delegate("schema")
        get_context = delegate("get_context")

        def _iter_batches(self, **kwargs: Any) -> Any:
            batches = super()._iter_batches(**kwargs)
            if self._rows_one_by_one:  # iter_rows counts its rows itself
                return batches
            # Each batch's own rows: the last one of a pass is short, and a report after it (before
            # the pass ends) must not count rows the shard did not have.
            return _Passes(batches, self._position, _rows_in, self._waits)

        def iter_rows(self) -> Any:
            self._rows_one_by_one = True  # Ray's iter_rows calls _iter_batches at once, not lazily
            try:
                rows = super().iter_rows()
            finally:
                self._rows_one_by_one = False
            return _Passes(rows, self._position, lambda row: 1, self._waits)

    CountingIterator.__qualname__ = CountingIterator.__name__
    return CountingIterator


def _same(value: Any) -> Any:
    return value


class _Passes:
    """An iterable of passes (each ``iter()`` is one) that counts the items it hands out and the
    seconds the loop waits for each (into ``waits.data_wait_s``)."""

    def __init__(self, items: Any, position: Any, rows_of: Callable[[Any], int], waits: Any) -> None:
        self._items, self._position, self._rows_of, self._waits = items, position, rows_of, waits

    def __iter__(self) -> Iterator[Any]:
        items = iter(self._items)
        position, rows_of, waits, clock = self._position, self._rows_of, self._waits, time.perf_counter
        try:
            asked = clock()  # from the loop asking for an item to having it: two clock reads a batch
            for item in items:
                waits.data_wait_s += clock() - asked
                position.handed_out(rows_of(item))
                yield item
                asked = clock()
            waits.data_wait_s += clock() - asked  # Ray Data's end of the pass
            position.end_pass()
        finally:
            close = getattr(items, "close", None)
            if close is not None:  # a loop that breaks off ends Ray's pass now, not when collected
                close()


def count_items(items: Any, position: Any, rows_each: int, waits: Any) -> Any:
    """``items`` handed out as a counted shard hands out its batches, ``rows_each`` rows apiece,
    timed into ``waits`` (``trainers.testing.ShardCounter``: the cost of counting and timing alone)."""
    return _Passes(items, position, lambda item: rows_each, waits)


def _rows_in(batch: Any) -> int:
    """Rows in one batch as iter_batches formats it: a dict of columns, a table, a frame, an array."""
    if isinstance(batch, dict) and batch:
        batch = next(iter(batch.values()))
    rows = getattr(batch, "num_rows", None)
    if isinstance(rows, int):
        return rows
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else len(batch)


def _operators(op: Any) -> Iterator[Any]:
    seen: set[int] = set()
    pending = [op] if op is not None else []
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending.extend(getattr(current, "input_dependencies", None) or [])


@functools.cache
def _right_sized_footer_indexer() -> type | None:
    """Ray Data's Parquet footer indexer with a pool no larger than its files need (None: no such
    indexer). Built on first use: importing this module (every worker does) must not import Ray Data."""
    try:
        from ray.data._internal.datasource_v2.formats.parquet.footer_file_indexer import FooterFileIndexer
    except ImportError:
        return None

    import pyarrow
    from ray.data._internal.datasource_v2.formats.parquet.footer_file_indexer import _file_chunks_to_manifest
    from ray.data._internal.datasource_v2.formats.parquet.footer_reader import FooterReader

    class RightSizedFooterIndexer(FooterFileIndexer):
        def _iter_file_infos_for_list(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
            if (listed := self.__dict__.pop("_listed", None)) is not None:
                return listed  # list_files below listed them already
            # Ray Data asks for the files first and starts the pool right after, from
            # ``self._num_actors``. Listing is lazy, so read ahead as far as a full pool could take
            # (one batch more than the first at least, to tell whether one holds them all; the
            # rest of a bigger listing stays lazy) and size the pool to what was found. The
            # configured size is kept apart: a later listing of a grown folder may need it all.
            limit = self.__dict__.setdefault("_configured_num_actors", max(1, self._num_actors))
            per_actor = max(1, self._footer_batch_size)
            files = iter(super()._iter_file_infos_for_list(*args, **kwargs))
            ahead = list(itertools.islice(files, max(limit * per_actor, per_actor + 1)))
            self._num_actors = max(1, min(limit, math.ceil(len(ahead) / per_actor)))
            self._one_batch = len(ahead) <= per_actor
            return itertools.chain(ahead, files)

        def list_files(self, paths: Any, **options: Any) -> Iterator[Any]:
            listing = {k: v for k, v in options.items() if k not in ("predicate", "limit", "projected_columns")}
            files = self._iter_file_infos_for_list(paths, **listing)
            if not self._one_batch:
                self._listed = files
                yield from super().list_files(paths, **options)
                return
            # One batch: read here, as one pooled reader would, without starting its process.
            threads = pyarrow.io_thread_count()  # FooterReader sets the process's count to its own
            reader: Any = FooterReader(  # a plain object here; its read_footers is typed as the actor's
                options["filesystem"],
                self._io_concurrency,
                options.get("predicate"),
                options.get("projected_columns"),
                self._coalesce_bytes,
                excluded_read_unit_ids=options.get("excluded_read_unit_ids"),
            )
            try:
                batch = [(info.path, info.size) for info in files if info.size is not None]
                order = options.get("preserve_order", False)
                for chunks in reader.read_footers(batch, result_batch_size=1, preserve_order=order):
                    yield from map(_file_chunks_to_manifest, chunks)
            finally:
                reader.pool.shutdown(wait=False)
                pyarrow.set_io_thread_count(threads)

    RightSizedFooterIndexer.__qualname__ = RightSizedFooterIndexer.__name__  # found by __getattr__ below
    return RightSizedFooterIndexer


def __getattr__(name: str) -> Any:
    # A pickled dataset names its indexer's class as this module's RightSizedFooterIndexer; the
    # process that unpickles it builds the class here.
    if name == "RightSizedFooterIndexer" and (right_sized := _right_sized_footer_indexer()) is not None:
        return right_sized
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- Ray Tune --------------------------------------------------------------------------------


def in_tune_function_session() -> bool:
    """Whether this code runs inside a Ray Tune trial's function (Tune-only helpers refuse to
    run elsewhere).

    Uses ``trainable_fn_utils._in_tune_session``. Public replacement: none; outside a trial
    ``ray.tune.get_context().get_trial_id()`` warns, and in a Ray Train V1 worker it answers too.
    """
    from ray.tune.trainable.trainable_fn_utils import _in_tune_session

    return bool(_in_tune_session())


class TuneTrainableAttributes:
    """The two attributes Ray Tune reads off a callable trainable, for a trainer object given to
    ``tune.Tuner`` (``DataParallelTrainer`` inherits them).

    ``_resources``: what each trial reserves (read by Tune's ``wrap_function``, set by
    ``tune.with_resources``); until set, ``_default_tune_resources()``. ``_name``: what Tune names
    the trainable after (``Experiment.get_trainable_name``). Public replacement: none for an object.
    """

    def _default_tune_resources(self) -> Any:
        raise NotImplementedError

    @property
    def _resources(self) -> Any:
        return (
            self.__dict__["_tune_resources"] if "_tune_resources" in self.__dict__ else self._default_tune_resources()
        )

    @_resources.setter
    def _resources(self, resources: Any) -> None:
        self.__dict__["_tune_resources"] = resources

    @property
    def _name(self) -> str:
        return type(self).__name__
