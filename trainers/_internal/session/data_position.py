"""Where a worker's data stands in its epoch: saved with each checkpoint, resumed from after a
restart (docs/data.md, "Resuming mid-epoch", says when that is exact).

A worker's dataset shards and prepared loaders count what they handed out in the current epoch;
every ``report()`` carries the counts, the controller commits them with the round's checkpoint,
and the next attempt's first pass of that epoch skips what was handed out (``plan_resume``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import types
from typing import Any, Protocol

from storage.positions import (
    DataResume,
    LoaderRecord,
    RankPosition,
    RoundPosition,
    ShardRecord,
    SkippedRows,
    SkippedSamples,
)


@dataclasses.dataclass
class ShardPosition:
    """One dataset shard's place: the epoch (pass) under way and the rows handed out in it. A pass
    that runs to its end moves to the next epoch's start, where a checkpoint saved then resumes."""

    epoch: int = 0
    rows: int = 0
    #: Rows the next pass skips: those the checkpoint this attempt resumed from had handed out.
    skip: int = 0
    #: A pass of ``epoch`` began in this attempt: the next pass is a new epoch.
    started: bool = False

    @classmethod
    def resumed(cls, record: ShardRecord) -> ShardPosition:
        return cls(epoch=record.epoch, rows=record.rows, skip=record.rows)

    def start_pass(self) -> int:
        """A pass begins; return the rows it skips."""
        if self.started:
            self.epoch, self.rows, self.skip = self.epoch + 1, 0, 0
        self.started = True
        skip, self.skip = self.skip, 0
        return skip

    def handed_out(self, rows: int) -> None:
        self.rows += rows

    def end_pass(self) -> None:
        self.epoch, self.rows, self.started = self.epoch + 1, 0, False

    def to_record(self) -> ShardRecord:
        return ShardRecord(self.epoch, self.rows)


class LoaderPosition(Protocol):
    """A prepared loader's sampler (``trainers.torch``'s ``PositionedSampler``)."""

    def position(self) -> LoaderRecord: ...


class DataPositions:
    """This worker's positions: its dataset shards by name, its prepared loaders in the order the
    loop prepared them. ``start`` is this rank's position to resume from (``plan_resume``)."""

    def __init__(self, start: RankPosition | None = None) -> None:
        self._start = start or RankPosition()
        self.shards: dict[str, ShardPosition] = {}
        self.loaders: list[LoaderPosition] = []

    def track_shards(self, shards: dict[str, Any], waits: Any) -> dict[str, Any]:
        """``shards`` with every Ray Data iterator among them counting into a position of its own,
        and timing the loop's wait for each batch into ``waits.data_wait_s`` (a ``RankHealth``)."""
        if "ray.data" not in sys.modules:
            return shards  # no Ray Data iterator can be among them
        from ray.data import DataIterator

        from trainers._internal.ray_private import counting_iterator

        tracked = dict(shards)
        for name, shard in shards.items():
            if isinstance(shard, DataIterator):
                saved = self._start.datasets.get(name)
                position = self.shards[name] = ShardPosition.resumed(saved) if saved else ShardPosition()
                tracked[name] = counting_iterator(shard, position, waits)
        return tracked

    def next_loader_start(self) -> LoaderRecord | None:
        """Where the next loader the loop prepares resumes (loaders are matched by their order)."""
        saved = self._start.loaders
        return saved[len(self.loaders)] if len(self.loaders) < len(saved) else None

    def add_loader(self, loader: LoaderPosition) -> None:
        self.loaders.append(loader)

    def record(self) -> RankPosition | None:
        """What a report carries: where each shard and loader stands, or None while nothing is tracked."""
        if not self.shards and not self.loaders:
            return None
        return RankPosition(
            {name: position.to_record() for name, position in self.shards.items()},
            tuple(loader.position() for loader in self.loaders),
        )


def round_position(positions: list[RankPosition | None]) -> RoundPosition | None:
    """What run.json keeps with one round's checkpoint: every rank's position (None for a rank
    that tracked nothing or did not report the round), and the world size they belong to."""
    if all(position is None for position in positions):
        return None
    return RoundPosition(len(positions), tuple(positions))


@dataclasses.dataclass(frozen=True)
class ResumePlan:
    """Where each rank starts, and what is said about it."""

    #: One start per rank (None: from the beginning).
    starts: list[RankPosition | None]
    #: For the run's record; None when nothing is resumed.
    note: DataResume | None = None
    #: Why the resume is not exact, for a warning at start; None when it is.
    warning: str | None = None


def plan_resume(
    saved: RoundPosition | None, *, world_size: int, ordered: dict[str, bool], split: set[str]
) -> ResumePlan:
    """Each rank's start from the position ``saved`` with a checkpoint (``ordered``: whether each
    dataset runs with ``preserve_order``; ``split``: the datasets split between the ranks). With
    the same world size each rank resumes its own position; with another, every rank skips an equal
    part of what all ranks had handed out of a split dataset (of a whole one, what rank 0 had)."""
    if saved is None or not any(saved.ranks):
        return ResumePlan([None] * world_size)
    why = []
    if saved.world_size == world_size:
        starts = list(saved.ranks)
        missing = [rank for rank, start in enumerate(starts) if start is None]
        if missing:
            why.append(
                f"rank(s) {missing} did not report the step the checkpoint was saved at, so they start "
                "their epoch from its beginning"
            )
    else:
        starts = [_divided(saved.ranks, world_size, split)] * world_size
        why.append(
            f"the run has {world_size} worker(s) and had {saved.world_size} when the checkpoint was saved, so "
            "each shard holds other rows: every rank skips an equal part of what all ranks had handed out"
        )
    rows: dict[str, SkippedRows] = {}
    samples: list[SkippedSamples] = []
    for start in filter(None, starts):
        for name, shard in start.datasets.items():
            so_far = rows.get(name, SkippedRows(shard.epoch, 0))
            rows[name] = SkippedRows(so_far.epoch, so_far.rows_skipped + shard.rows)
        for index, loader in enumerate(start.loaders):
            if index == len(samples):
                samples.append(SkippedSamples(loader.epoch, 0))
            samples[index] = SkippedSamples(samples[index].epoch, samples[index].samples_skipped + loader.samples)
    for name, skipped in sorted(rows.items()):
        if skipped.rows_skipped and not ordered.get(name, False):
            why.append(
                f"datasets[{name!r}] runs without ExecutionOptions.preserve_order, so its rows reach the ranks in "
                f"another order in every attempt: the {skipped.rows_skipped} rows skipped in epoch {skipped.epoch} "
                "are not exactly the rows trained on (some may be seen twice, others not at all)"
            )
    note = DataResume(exact=not why, why=tuple(why), datasets=rows, loaders=tuple(samples))
    warning = (
        "The data position saved with the checkpoint is resumed, but not exactly: "
        + "; ".join(why)
        + ". For an exact resume run the datasets with ray.data.ExecutionOptions(preserve_order=True) in "
        "DataConfig(execution_options=...) and keep the number of workers; to replay the epoch from its start "
        "instead, pass DataConfig(checkpoint_data_position=False)."
    )
    return ResumePlan(starts, note, warning if why else None)


def _divided(ranks: tuple[RankPosition | None, ...], world_size: int, split: set[str]) -> RankPosition:
    """One rank's share, among ``world_size``, of what the saved ``ranks`` had handed out."""
    known = [rank for rank in ranks if rank is not None]
    datasets: dict[str, ShardRecord] = {}
    for name in known[0].datasets:
        shards = [rank.datasets[name] for rank in known if name in rank.datasets]
        epoch = max(shard.epoch for shard in shards)
        rows = [shard.rows for shard in shards if shard.epoch == epoch]
        datasets[name] = ShardRecord(epoch, sum(rows) // world_size if name in split else rows[0])
    loaders = []
    for at_index in zip(*(rank.loaders for rank in known), strict=False):  # the loaders every rank had
        epoch = max(loader.epoch for loader in at_index)
        samples = sum(loader.samples for loader in at_index if loader.epoch == epoch)
        loaders.append(LoaderRecord(epoch, samples // world_size))
    return RankPosition(datasets, tuple(loaders))


#: The self-check's known dataset: rows, blocks, the batch size of its passes, and the rows its
#: resumed pass skips.
_CHECK_ROWS, _CHECK_BLOCKS, _CHECK_BATCH, _CHECK_SKIP = 12, 3, 5, 7


@functools.cache
def position_hooks_problem() -> str | None:
    """Whether ``counting_iterator`` counts right with the Ray Data installed here, checked once per
    process on a tiny in-memory dataset: None when it does, else what it got wrong. A Ray upgrade
    that iterates around its hooks would otherwise make a resumed epoch skip the wrong rows silently."""
    import ray.data  # its loggers exist from here on

    # Quietly: Ray Data logs each execution and its progress at INFO on loggers of its own, which
    # would print ten lines about a dataset the user never made into their run's output.
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.startswith("ray.data")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        return _count_a_known_dataset(ray.data)
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _count_a_known_dataset(ray_data: Any) -> str | None:
    from trainers._internal.ray_private import counting_iterator

    dataset = ray_data.from_items([{"id": i} for i in range(_CHECK_ROWS)], override_num_blocks=_CHECK_BLOCKS)
    whole = ShardPosition()
    seen: list[int] = []
    counted: list[int] = []
    waits = types.SimpleNamespace(data_wait_s=0.0)
    for batch in counting_iterator(dataset.iterator(), whole, waits).iter_batches(batch_size=_CHECK_BATCH):
        seen.extend(int(i) for i in batch["id"])
        counted.append(whole.rows)
    expected = [min(n, _CHECK_ROWS) for n in range(_CHECK_BATCH, _CHECK_ROWS + _CHECK_BATCH, _CHECK_BATCH)]
    if sorted(seen) != list(range(_CHECK_ROWS)) or counted != expected or whole.to_record() != ShardRecord(1, 0):
        return (
            f"a pass over {_CHECK_ROWS} rows in batches of {_CHECK_BATCH} was counted {counted} "
            f"(expected {expected}) and ended at epoch {whole.epoch}, row {whole.rows}"
        )
    resumed = ShardPosition.resumed(ShardRecord(0, _CHECK_SKIP))
    rest = sum(len(b["id"]) for b in counting_iterator(dataset.iterator(), resumed, waits).iter_batches(batch_size=2))
    if rest != _CHECK_ROWS - _CHECK_SKIP:
        return f"a pass resumed after {_CHECK_SKIP} of {_CHECK_ROWS} rows handed out {rest} rows, not {_CHECK_ROWS - _CHECK_SKIP}"
    return None
