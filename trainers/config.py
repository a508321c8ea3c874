"""The run configuration a Ray Train user knows: ScalingConfig, RunConfig, FailureConfig, DataConfig.

Every config checks itself when it is built, so a mistake fails at the line that made it, before
any worker starts. ``CheckpointConfig`` lives in ``storage`` (it configures retention) and is
re-exported here.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import TYPE_CHECKING, Any, Literal

import pyarrow.fs

from storage import CheckpointConfig
from trainers._internal.validation import (
    check_bool,
    check_choice,
    check_int,
    check_number,
)

if TYPE_CHECKING:
    from trainers.callback import UserCallback

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
#: Ray's resource for "this node has accelerator X" (``accelerator_type:A100``).
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"
DEFAULT_STORAGE_PATH = "~/flowtrain_results"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScalingConfig:
    """How many workers to start and what each one reserves.

    ``num_workers=0`` runs the training function in the calling process (local mode), with the
    same API; handy for debugging.
    """

    #: Number of training workers (Ray actors); 0 runs the loop in this process.
    num_workers: int = 1
    #: Reserve one GPU per worker and train on it (nccl); CPU training uses gloo.
    use_gpu: bool = False
    #: Resources each worker reserves, e.g. ``{"CPU": 2}`` or ``{"GPU": 1, "custom": 1}``.
    #: Defaults to ``{"CPU": 1}``, plus ``{"GPU": 1}`` with ``use_gpu``.
    resources_per_worker: dict[str, float] | None = None
    #: How the workers' bundles are placed on nodes: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD.
    placement_strategy: str = "PACK"
    #: Start the workers only on nodes with this accelerator, e.g. "A100" or "L4" (Ray's
    #: ``accelerator_type:<name>`` resource, which Ray sets on nodes that have one).
    accelerator_type: str | None = None

    def __post_init__(self) -> None:
        check_int("ScalingConfig.num_workers", self.num_workers, minimum=0, allowed="an integer >= 0")
        if self.accelerator_type is not None and (not isinstance(self.accelerator_type, str) or not self.accelerator_type):
            raise ValueError(
                f"ScalingConfig.accelerator_type={self.accelerator_type!r}: must be a name such as 'A100', or None."
            )
        check_bool("ScalingConfig.use_gpu", self.use_gpu)
        check_choice("ScalingConfig.placement_strategy", self.placement_strategy, PLACEMENT_STRATEGIES)
        if self.resources_per_worker is not None:
            if not isinstance(self.resources_per_worker, dict):
                raise TypeError(
                    f"ScalingConfig.resources_per_worker={self.resources_per_worker!r}: must be a dict "
                    'of resource name to amount, e.g. {"CPU": 2}.'
                )
            for name, amount in self.resources_per_worker.items():
                if not isinstance(name, str) or not name:
                    raise ValueError(f"ScalingConfig.resources_per_worker: resource name {name!r} must be a non-empty string.")
                _check_builtin_spelling(name)
                check_number(
                    f"ScalingConfig.resources_per_worker[{name!r}]",
                    amount,
                    minimum=0,
                    allowed="a number >= 0",
                )
            gpus = self.resources_per_worker.get("GPU", None)
            if self.use_gpu and gpus is not None and gpus == 0:
                raise ValueError(
                    "ScalingConfig: use_gpu=True with resources_per_worker['GPU']=0 reserves no GPU; "
                    "set resources_per_worker['GPU'] > 0 or use_gpu=False."
                )
            if not self.use_gpu and gpus:
                raise ValueError(
                    f"ScalingConfig: resources_per_worker['GPU']={gpus!r} with use_gpu=False; "
                    "set use_gpu=True to train on the GPUs you reserve."
                )

    @property
    def worker_resources(self) -> dict[str, float]:
        """The resources one worker reserves, with defaults filled in and zero amounts dropped."""
        resources = dict(self.resources_per_worker or {})
        resources.setdefault("CPU", 1)
        if self.use_gpu:
            resources.setdefault("GPU", 1)
        if self.accelerator_type:
            # A sliver of the resource: enough to land on such a node, not to count as using it.
            resources.setdefault(f"{ACCELERATOR_RESOURCE_PREFIX}{self.accelerator_type}", 0.001)
        return {name: amount for name, amount in resources.items() if amount}

    @property
    def total_resources(self) -> dict[str, float]:
        """The resources all workers together reserve."""
        return {name: amount * self.num_workers for name, amount in self.worker_resources.items()}


#: Ray's built-in resources, spelled as Ray spells them.
BUILTIN_RESOURCES = ("CPU", "GPU", "memory")


def _check_builtin_spelling(name: str) -> None:
    """``"gpu"`` would be a custom resource no node has: the run could never start."""
    for builtin in BUILTIN_RESOURCES:
        if name != builtin and name.lower() == builtin.lower():
            raise ValueError(
                f"ScalingConfig.resources_per_worker: resource name {name!r} would be a custom resource "
                f"no node has; did you mean Ray's {builtin!r}? Resource names are case-sensitive."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class FailureConfig:
    """How many failures a run survives before ``fit()`` gives up.

    A worker failure (exception, dead process, lost node) restarts the whole worker group from
    the latest committed checkpoint while the budget allows.
    """

    #: Restarts allowed after worker failures: 0 never restarts, -1 restarts without limit.
    max_failures: int = 0
    #: Retries of the driver itself (the Prefect train task) after it crashed: -1 without limit.
    controller_failure_limit: int = -1
    #: Seconds a rank may lag behind the others' report of the same step (or their arrival at the
    #: same ``trainers.collective`` barrier) before the run counts it as hung (a failure,
    #: restarted per ``max_failures``). None: never.
    report_timeout_s: float | None = None

    def __post_init__(self) -> None:
        check_int("FailureConfig.max_failures", self.max_failures, minimum=-1, allowed="an integer >= -1 (-1 means unlimited)")
        check_int(
            "FailureConfig.controller_failure_limit",
            self.controller_failure_limit,
            minimum=-1,
            allowed="an integer >= -1 (-1 means unlimited)",
        )
        if self.report_timeout_s is not None:
            check_number(
                "FailureConfig.report_timeout_s", self.report_timeout_s, minimum=0, strict=True, allowed="None or seconds > 0"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Which datasets are split across workers (the rest reach every worker whole)."""

    #: "all", or the names of the datasets to split.
    datasets_to_split: Literal["all"] | list[str] = "all"
    #: Ray Data execution options applied to every dataset's pipeline (``ray.data.ExecutionOptions``).
    execution_options: Any = None

    def __post_init__(self) -> None:
        value = self.datasets_to_split
        if value != "all" and not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
            raise TypeError(f"DataConfig.datasets_to_split={value!r}: must be 'all' or a list of dataset names.")


_NAME_PATTERN = re.compile(r"^[A-Za-z0-9._\-=+@,]+$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Where a run keeps its results and how it checkpoints, fails and reports.

    Two fits with the same ``storage_path`` and ``name`` are the same run: the second resumes from
    the first one's latest checkpoint.
    """

    #: The run's name: one folder under ``storage_path``. Default: the trainer's name and a timestamp.
    name: str | None = None
    #: Absolute local path or URI (``s3://bucket/prefix``, ``gs://...``). Default ``~/flowtrain_results``.
    storage_path: str | None = None
    #: A ``pyarrow.fs.FileSystem`` to use for ``storage_path`` instead of resolving it from the URI.
    storage_filesystem: pyarrow.fs.FileSystem | None = None
    #: Which checkpoints to keep.
    checkpoint_config: CheckpointConfig | None = None
    #: How many worker failures to survive.
    failure_config: FailureConfig | None = None
    #: ``UserCallback`` objects called in the driver after each report and on failures.
    callbacks: list["UserCallback"] | None = None
    #: Runtime environment for the worker actors (``ray.runtime_env.RuntimeEnv`` or dict).
    worker_runtime_env: dict | None = None

    def __post_init__(self) -> None:
        if self.name is not None:
            if not isinstance(self.name, str) or not self.name.strip():
                raise ValueError(f"RunConfig.name={self.name!r}: must be a non-empty string.")
            if not _NAME_PATTERN.match(self.name) or self.name in (".", ".."):
                raise ValueError(
                    f"RunConfig.name={self.name!r}: must be one folder name (letters, digits and . _ - = + @ ,), "
                    "without '/' or spaces; put nesting in storage_path instead."
                )
        if self.storage_path is not None:
            self._check_storage_path(self.storage_path)
        if self.storage_filesystem is not None and not isinstance(self.storage_filesystem, pyarrow.fs.FileSystem):
            raise TypeError(
                f"RunConfig.storage_filesystem={self.storage_filesystem!r}: must be a pyarrow.fs.FileSystem "
                "(wrap an fsspec filesystem with pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs)))."
            )
        if self.checkpoint_config is not None and not isinstance(self.checkpoint_config, CheckpointConfig):
            raise TypeError(f"RunConfig.checkpoint_config={self.checkpoint_config!r}: must be a CheckpointConfig.")
        if self.failure_config is not None and not isinstance(self.failure_config, FailureConfig):
            raise TypeError(f"RunConfig.failure_config={self.failure_config!r}: must be a FailureConfig.")
        if self.callbacks is not None:
            from trainers.callback import UserCallback

            for callback in self.callbacks:
                if not isinstance(callback, UserCallback):
                    raise TypeError(f"RunConfig.callbacks: {callback!r} is not a trainers.UserCallback.")

    def _check_storage_path(self, path: Any) -> None:
        if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
            raise ValueError(
                f"RunConfig.storage_path={path!r}: must be a non-empty absolute path or a URI such as 's3://bucket/prefix'."
            )
        text = str(path)
        if "://" in text:
            return
        if self.storage_filesystem is None and not os.path.isabs(os.path.expanduser(text)):
            raise ValueError(
                f"RunConfig.storage_path={text!r}: a relative path means different folders on different "
                f"nodes; give an absolute path (e.g. {os.path.abspath(text)!r}) or a URI."
            )

    @property
    def resolved_storage_path(self) -> str:
        """``storage_path`` with the default filled in and ``~`` expanded."""
        path = str(self.storage_path) if self.storage_path is not None else DEFAULT_STORAGE_PATH
        return path if "://" in path else os.path.expanduser(path)


__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "FailureConfig",
    "RunConfig",
    "ScalingConfig",
]
