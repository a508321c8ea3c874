"""Where a run's data stood when a checkpoint was saved, as run.json keeps it beside the checkpoint
(``CheckpointRecord.data_position``): typed records, written and read as the JSON run.json has
always held (``to_json``/``from_json``). The workers count and the controller plans the resume
(``trainers/_internal/session/data_position.py``); these are only what travels and is kept."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class ShardRecord:
    """One rank's dataset shard: the epoch (pass over it) under way and the rows handed out in it."""

    epoch: int
    rows: int

    def to_json(self) -> dict[str, int]:
        return {"epoch": self.epoch, "rows": self.rows}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ShardRecord:
        return cls(int(body["epoch"]), int(body["rows"]))


@dataclasses.dataclass(frozen=True)
class LoaderRecord:
    """One rank's prepared ``DataLoader``: its sampler's epoch and the samples handed out in it."""

    epoch: int
    samples: int

    def to_json(self) -> dict[str, int]:
        return {"epoch": self.epoch, "samples": self.samples}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> LoaderRecord:
        return cls(int(body["epoch"]), int(body["samples"]))


@dataclasses.dataclass(frozen=True)
class RankPosition:
    """One rank's data when it reported: its dataset shards by name, its prepared loaders in the
    order its loop prepared them."""

    datasets: Mapping[str, ShardRecord] = dataclasses.field(default_factory=dict)
    loaders: tuple[LoaderRecord, ...] = ()

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if self.datasets:
            body["datasets"] = {name: shard.to_json() for name, shard in self.datasets.items()}
        if self.loaders:
            body["loaders"] = [loader.to_json() for loader in self.loaders]
        return body

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> RankPosition:
        return cls(
            {name: ShardRecord.from_json(shard) for name, shard in body.get("datasets", {}).items()},
            tuple(LoaderRecord.from_json(loader) for loader in body.get("loaders", [])),
        )


@dataclasses.dataclass(frozen=True)
class RoundPosition:
    """Every rank's data position of one report round (None for a rank that tracked nothing or
    did not report it), and the world size they belong to."""

    world_size: int
    ranks: tuple[RankPosition | None, ...]

    def to_json(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "ranks": [r.to_json() if r is not None else None for r in self.ranks]}

    @classmethod
    def from_json(cls, body: Mapping[str, Any] | None) -> RoundPosition | None:
        if body is None:
            return None
        ranks = tuple(RankPosition.from_json(r) if r is not None else None for r in body["ranks"])
        return cls(int(body["world_size"]), ranks)


@dataclasses.dataclass(frozen=True)
class SkippedRows:
    """What the ranks' shards of one dataset skipped, together, in the epoch they resumed."""

    epoch: int
    rows_skipped: int


@dataclasses.dataclass(frozen=True)
class SkippedSamples:
    """What the ranks' prepared loaders at one index skipped, together, in the epoch they resumed."""

    epoch: int
    samples_skipped: int


@dataclasses.dataclass(frozen=True)
class DataResume:
    """How an attempt resumed the data position of the checkpoint it started from (run.json's
    ``data_resumes``): exact or not, why not, and what each dataset and loader skipped."""

    exact: bool
    #: Why the resume is not exact (empty when it is), one reason each.
    why: tuple[str, ...] = ()
    datasets: Mapping[str, SkippedRows] = dataclasses.field(default_factory=dict)
    loaders: tuple[SkippedSamples, ...] = ()
    #: The attempt that resumed, and the checkpoint it resumed from: set when it is recorded.
    attempt: int | None = None
    checkpoint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "checkpoint": self.checkpoint,
            "exact": self.exact,
            "why": list(self.why),
            "datasets": {name: dataclasses.asdict(skipped) for name, skipped in self.datasets.items()},
            "loaders": [dataclasses.asdict(skipped) for skipped in self.loaders],
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> DataResume:
        return cls(
            exact=bool(body["exact"]),
            why=tuple(body.get("why", ())),
            datasets={name: SkippedRows(**skipped) for name, skipped in body.get("datasets", {}).items()},
            loaders=tuple(SkippedSamples(**skipped) for skipped in body.get("loaders", [])),
            attempt=body.get("attempt"),
            checkpoint=body.get("checkpoint"),
        )
