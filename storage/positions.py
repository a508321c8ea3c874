"""Where a run's data stood when a checkpoint was saved, as run.json keeps it beside the checkpoint
(``CheckpointRecord.data_position``): typed records, written and read by ``storage.codec``. The
workers count and the controller plans the resume (``trainers/_internal/session/data_position.py``);
these are only what travels and is kept."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from storage.codec import Record


@dataclasses.dataclass(frozen=True)
class ShardRecord(Record):
    """One rank's dataset shard: the epoch (pass over it) under way and the rows handed out in it."""

    epoch: int
    rows: int


@dataclasses.dataclass(frozen=True)
class LoaderRecord(Record):
    """One rank's prepared ``DataLoader``: its sampler's epoch and the samples handed out in it."""

    epoch: int
    samples: int


@dataclasses.dataclass(frozen=True)
class RankPosition(Record):
    """One rank's data when it reported: its dataset shards by name, its prepared loaders in the
    order its loop prepared them."""

    JSON_OMITS_DEFAULTS = True  # a rank without loaders (most) writes no "loaders": []

    datasets: Mapping[str, ShardRecord] = dataclasses.field(default_factory=dict)
    loaders: tuple[LoaderRecord, ...] = ()


@dataclasses.dataclass(frozen=True)
class RoundPosition(Record):
    """Every rank's data position of one report round (None for a rank that tracked nothing or
    did not report it), and the world size they belong to."""

    world_size: int
    ranks: tuple[RankPosition | None, ...]


@dataclasses.dataclass(frozen=True)
class SkippedRows(Record):
    """What the ranks' shards of one dataset skipped, together, in the epoch they resumed."""

    epoch: int
    rows_skipped: int


@dataclasses.dataclass(frozen=True)
class SkippedSamples(Record):
    """What the ranks' prepared loaders at one index skipped, together, in the epoch they resumed."""

    epoch: int
    samples_skipped: int


@dataclasses.dataclass(frozen=True)
class DataResume(Record):
    """How an attempt resumed the data position of the checkpoint it started from (run.json's
    ``data_resumes``): exact or not, why not, and what each dataset and loader skipped."""

    #: The attempt that resumed, and the checkpoint it resumed from: set when it is recorded (given
    #: by keyword; first in run.json, as they always were).
    attempt: int | None = dataclasses.field(default=None, kw_only=True)
    checkpoint: str | None = dataclasses.field(default=None, kw_only=True)
    exact: bool
    #: Why the resume is not exact (empty when it is), one reason each.
    why: tuple[str, ...] = ()
    datasets: Mapping[str, SkippedRows] = dataclasses.field(default_factory=dict)
    loaders: tuple[SkippedSamples, ...] = ()
