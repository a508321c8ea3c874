"""Run folders written by ``ray.train`` (Ray Train V2, as Ray 2.60 writes them), read as flowtrain runs.

Ray's one file of run state, ``checkpoint_manager_snapshot.json``, keeps the checkpoints its
``CheckpointConfig`` kept (ranked, best last), their metrics and report indices and how their
validations ended; metrics-only reports and dropped checkpoints leave no record, so a carried-over
history holds one report per kept checkpoint. Read only, never rewritten (docs/design.md).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from storage.errors import StorageError
from storage.filesystem import exists, pafs, read_bytes
from storage.layout import check_dir_name
from storage.metrics_log import ReportEntry
from storage.snapshot import (
    COMMITTED,
    PENDING_VALIDATION,
    VALIDATED,
    VALIDATION_FAILED,
    VALIDATION_TIMEOUT,
    CheckpointRecord,
    RunSnapshot,
)

#: Ray Train's run state file in the run folder.
RAY_SNAPSHOT = "checkpoint_manager_snapshot.json"
#: The Ray release whose snapshot format this module reads.
READ_RAY_VERSION = "2.60.0"
#: The version of Ray's per-checkpoint record (``_TrainingResultState.version``) read here.
READ_RECORD_VERSION = 0

#: Ray's lists of checkpoints whose validation ended, and the status each means here.
_ENDED_VALIDATIONS = {
    "validated_checkpoint_dir_names": VALIDATED,
    "timed_out_validation_checkpoint_dir_names": VALIDATION_TIMEOUT,
    "failed_validation_checkpoint_dir_names": VALIDATION_FAILED,
}


class RayRunFormatError(StorageError):
    """A run folder written by ``ray.train`` whose snapshot flowtrain cannot read: written by a Ray
    version with another format, or damaged. The message names the Ray version and the format.

    A ``StorageError``, which is what ``Result.from_path`` and ``fit()`` raise for a run folder
    they cannot read, so ``except RuntimeError`` or ``except OSError`` catches it too.
    """


@dataclasses.dataclass
class RayRun:
    """A ``ray.train`` run folder as flowtrain's record of a run."""

    #: The kept checkpoints as the run's first ones (report order), each with its report (attempt 0).
    snapshot: RunSnapshot
    #: The checkpoints' folder names best last, as Ray's snapshot ranks them (it records the
    #: order its ``CheckpointConfig`` gave them, not the rule).
    ranked: list[str]


def read_ray_run(fs: pafs.FileSystem, run_path: str, name: str, display: str) -> RayRun | None:
    """The ``ray.train`` run in the folder ``run_path`` (shown to people as ``display``), or None
    when the folder holds no Ray snapshot.

    Raises ``RayRunFormatError`` naming the Ray version and what is not as expected when the
    snapshot is not in the format of Ray 2.60 (checkpoint records of version 0).
    """
    path = f"{run_path.rstrip('/')}/{RAY_SNAPSHOT}"
    if not exists(fs, path):
        return None
    where = f"{display.rstrip('/')}/{RAY_SNAPSHOT}"
    try:
        body = json.loads(read_bytes(fs, path))
    except ValueError as error:
        raise RayRunFormatError(f"the ray.train run snapshot {where} is not JSON ({error}): it is damaged.") from None
    written_by = body.get("ray_version") if isinstance(body, dict) else None
    try:
        return _parse(body, name)
    except (KeyError, TypeError, ValueError) as error:
        version = f"Ray {written_by}" if isinstance(written_by, str) else "an unknown Ray version (it names none)"
        raise RayRunFormatError(
            f"the ray.train run snapshot {where} was written by {version} in a format flowtrain does not "
            f"read ({type(error).__name__}: {error}). flowtrain reads the format of Ray {READ_RAY_VERSION} "
            f"(checkpoint records of version {READ_RECORD_VERSION}). Finish or read this run with the Ray "
            "version that wrote it, or start a new run under another RunConfig(name=...)."
        ) from None


def _parse(body: Any, name: str) -> RayRun:
    if not isinstance(body, dict):
        raise TypeError(f"the file holds a {type(body).__name__}, not an object")
    ray_version = body["ray_version"]
    results, indices = body["checkpoint_results"], body["checkpoint_report_indices"]
    if not isinstance(ray_version, str) or not isinstance(results, list) or not isinstance(indices, list):
        raise TypeError("ray_version, checkpoint_results or checkpoint_report_indices has another type")
    if len(results) != len(indices) or not all(isinstance(i, int) for i in indices):
        raise ValueError("checkpoint_report_indices does not give one report index per checkpoint")
    records = [_record(result) for result in results]

    status = {dir_name: ended for key, ended in _ENDED_VALIDATIONS.items() for dir_name in body.get(key, [])}
    pending = [_record(result)[0] for result in body.get("pending_training_results", [])]
    # One spec per pending result.
    validation = dict(zip(pending, body.get("pending_validation_specs", []), strict=True))

    snapshot = RunSnapshot(name=name)
    for seq, (report_index, (dir_name, metrics)) in enumerate(
        sorted(zip(indices, records, strict=True), key=lambda pair: pair[0])
    ):
        snapshot.unlogged_reports.append(ReportEntry(0, report_index, metrics))
        snapshot.checkpoints.append(
            CheckpointRecord(
                seq=seq,
                dir_name=dir_name,
                metrics=metrics,
                report=seq,
                status=PENDING_VALIDATION if dir_name in validation else status.get(dir_name, COMMITTED),
                validation=validation.get(dir_name, False),
            )
        )
    snapshot.next_seq = snapshot.num_reports = len(records)
    return RayRun(snapshot=snapshot, ranked=[dir_name for dir_name, _ in records])


def _record(result: Any) -> tuple[str, dict[str, Any]]:
    """(folder name, metrics) of one of Ray's checkpoint records."""
    if not isinstance(result, dict):
        raise TypeError(f"a checkpoint record is a {type(result).__name__}, not an object")
    if result.get("version") != READ_RECORD_VERSION:
        raise ValueError(f"checkpoint record version {result.get('version')!r}")
    dir_name, metrics = result["checkpoint_dir_name"], result["metrics"]
    if not isinstance(metrics, dict):
        raise TypeError(f"the metrics of checkpoint {dir_name!r} are a {type(metrics).__name__}")
    return check_dir_name(dir_name, field="checkpoint_dir_name"), metrics
