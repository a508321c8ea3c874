"""The run configuration a Ray Train user knows: ScalingConfig, RunConfig, FailureConfig, DataConfig.

Every config checks itself when it is built, so a mistake fails at the line that made it, before
any worker starts. ``CheckpointConfig`` lives in ``storage`` (it configures retention) and is
re-exported here.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import os
import re
from typing import TYPE_CHECKING, Any, Literal

# Every run's storage needs pyarrow's core filesystems in the driver: load them with the trainer's
# imports rather than inside its first fit() (0.1 s). The workers never import this module.
import pyarrow._fs  # noqa: F401

from storage import CheckpointConfig
from storage.config import DEPRECATED
from storage.config import deprecated as _deprecated
from storage.filesystem import is_uri, pafs
from storage.layout import resolve_storage_path
from trainers._checks import check_bool, check_choice, check_int, check_number, check_resources, is_count

if TYPE_CHECKING:
    from trainers.callback import UserCallback

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
#: Ray's resource for "this node has accelerator X" (``accelerator_type:A100``).
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"


def tpu_slice_shape(
    topology: str, accelerator_type: str, resources_per_worker: dict | None
) -> tuple[int, dict[str, float]]:
    """How many workers one slice of ``topology`` holds, and what each worker reserves (a whole
    host's chips and 1 CPU unless ``resources_per_worker`` says otherwise). ``ValueError`` when
    Ray cannot read the topology for that accelerator."""
    from ray.util.tpu import get_tpu_worker_resources

    try:
        return get_tpu_worker_resources(
            topology=topology,
            accelerator_type=accelerator_type,
            resources_per_worker=resources_per_worker,
            num_slices=1,
        )
    except Exception as error:  # noqa: BLE001 - Ray's parser raises many kinds; all mean the same bad topology
        raise ValueError(
            f"Could not parse TPU topology details for type={accelerator_type}, topology={topology}. Error: {error} "
            "Set ScalingConfig.topology to the slice's shape, e.g. '2x2x2', and accelerator_type to its generation, "
            "e.g. 'TPU-V4'."
        ) from None


@dataclasses.dataclass(frozen=True)
class ScalingConfig:
    """How many workers to start and what each one reserves.

    ``num_workers=0`` runs the training function in the calling process (local mode), with the
    same API; handy for debugging. ``num_workers=(min, max)`` trains elastically: the run starts
    with as many workers as the cluster holds (at least ``min``), grows toward ``max`` when
    resources appear, and carries on with fewer when a node goes away.
    """

    #: Removed in Ray Train V2 (the driver reserves nothing); passing it raises DeprecationWarning.
    trainer_resources: dict | None = None
    #: Number of training workers (Ray actors); 0 runs the loop in this process; (min, max) is elastic.
    num_workers: int | tuple[int, int] = 1
    #: Reserve one GPU per worker and train on it (nccl); CPU training uses gloo.
    use_gpu: bool = False
    #: Resources each worker reserves, e.g. ``{"CPU": 2}`` or ``{"GPU": 1, "custom": 1}``.
    #: Defaults to ``{"CPU": 1}``, or ``{"GPU": 1}`` with ``use_gpu`` (as in Ray: a GPU node with
    #: few CPUs still fits one worker per GPU).
    resources_per_worker: dict[str, float] | None = None
    #: How the workers' bundles are placed on nodes: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD.
    placement_strategy: str = "PACK"
    #: Start the workers only on nodes with this accelerator, e.g. "A100" or "L4" (Ray's
    #: ``accelerator_type:<name>`` resource, which Ray sets on nodes that have one).
    accelerator_type: str | None = None
    #: Ray node labels a worker's node must have, e.g. ``{"ray.io/market-type": "spot"}``: one dict
    #: for every worker, or a list with one dict per worker (as long as the maximum worker count).
    label_selector: dict[str, str] | list[dict[str, str]] | None = None
    #: Train on TPUs (one TPU VM per worker); needs ``topology`` and ``accelerator_type`` beyond 1 worker.
    use_tpu: bool = False
    #: The TPU slice topology, e.g. "2x2x2" (with ``use_tpu``). Each worker then takes a whole host of
    #: a slice unless ``resources_per_worker`` says otherwise, and the workers fill whole slices:
    #: ``num_workers`` must be a multiple of the workers one slice holds (4 workers on "2x2x2"
    #: TPU-V4, 2 hosts per slice, span two slices).
    topology: str | None = None
    #: Elastic runs: how often (seconds) a healthy run checks whether more workers would now fit.
    elastic_resize_monitor_interval_s: float = 60.0

    # Not a field (no annotation): set by __post_init__ to (workers per slice, one worker's
    # resources) when the workers fill TPU slices, else None.
    _tpu_shape = None

    def __post_init__(self) -> None:
        if self.trainer_resources is not None:
            raise _deprecated(
                "ScalingConfig(trainer_resources=...)",
                "The driver does no heavy work and reserves nothing; set what each worker needs with "
                "resources_per_worker.",
            )
        if isinstance(self.num_workers, list):
            object.__setattr__(self, "num_workers", tuple(self.num_workers))
        workers = self.num_workers
        if isinstance(workers, tuple):
            if len(workers) != 2 or not all(is_count(n) for n in workers) or not 1 <= workers[0] <= workers[1]:
                raise ValueError(
                    f"ScalingConfig.num_workers={workers!r}: an elastic size must be a (min_workers, max_workers) "
                    "pair of integers with 1 <= min_workers <= max_workers, e.g. (2, 8)."
                )
        else:
            check_int(
                "ScalingConfig.num_workers",
                workers,
                minimum=0,
                allowed="an integer >= 0, or a (min_workers, max_workers) pair for elastic training",
            )
        interval = self.elastic_resize_monitor_interval_s
        check_number("ScalingConfig.elastic_resize_monitor_interval_s", interval, minimum=0, allowed="seconds >= 0")
        if self.accelerator_type is not None and not (isinstance(self.accelerator_type, str) and self.accelerator_type):
            raise ValueError(
                f"ScalingConfig.accelerator_type={self.accelerator_type!r}: must be a name such as 'A100', or None."
            )
        check_bool("ScalingConfig.use_gpu", self.use_gpu)
        check_bool("ScalingConfig.use_tpu", self.use_tpu)
        check_choice("ScalingConfig.placement_strategy", self.placement_strategy, PLACEMENT_STRATEGIES)
        if self.resources_per_worker is not None:
            check_resources("ScalingConfig.resources_per_worker", self.resources_per_worker)
            for name, builtin in itertools.product(self.resources_per_worker, ("CPU", "GPU", "memory")):
                if name != builtin and name.lower() == builtin.lower():  # a custom resource no node has
                    raise ValueError(
                        f"ScalingConfig.resources_per_worker: resource name {name!r} would be a custom resource "
                        f"no node has; did you mean Ray's {builtin!r}? Resource names are case-sensitive."
                    )
        self._check_accelerators()
        self._check_label_selector()

    def _check_accelerators(self) -> None:
        if self.use_gpu and self.use_tpu:
            raise ValueError(
                "ScalingConfig: use_gpu=True and use_tpu=True together; a worker trains on one kind of accelerator."
            )
        for flag, kind in (("use_gpu", "GPU"), ("use_tpu", "TPU")):
            amount = (self.resources_per_worker or {}).get(kind)
            if getattr(self, flag) and amount == 0:
                raise ValueError(
                    f"ScalingConfig: {flag}=True with resources_per_worker[{kind!r}]=0 reserves no {kind}; "
                    f"set resources_per_worker[{kind!r}] > 0 or {flag}=False."
                )
            if not getattr(self, flag) and amount:
                raise ValueError(
                    f"ScalingConfig: resources_per_worker[{kind!r}]={amount!r} with {flag}=False; "
                    f"set {flag}=True to train on the {kind}s you reserve."
                )
        if self.use_tpu and self.max_workers > 1 and not (self.topology and self.accelerator_type):
            raise ValueError(
                "ScalingConfig: use_tpu=True with more than one worker needs topology= (e.g. '2x2x2') and "
                "accelerator_type= (e.g. 'TPU-V4') so the workers land on one TPU slice."
            )
        if self.use_tpu and self.max_workers > 1 and self.label_selector:
            raise ValueError(
                # Ray's words first: users and Ray's own tests match on them.
                "Cannot set `label_selector` when `use_tpu=True` because Ray Train automatically reserves a TPU "
                f"slice with a predefined label. ScalingConfig: drop label_selector={self.label_selector!r}; the "
                "workers are placed on their TPU slice by its own labels (ray.io/tpu-slice-name)."
            )
        # With a TPU topology each worker takes a whole host by default, and the workers fill whole slices.
        if self.use_tpu and self.topology and self.accelerator_type:
            shape = tpu_slice_shape(self.topology, self.accelerator_type, self.resources_per_worker)
            object.__setattr__(self, "_tpu_shape", shape)  # derived once: worker_resources is read often
            per_slice, resources = shape
            for field, count in (("num_workers", self.max_workers), ("min_workers", self.min_workers)):
                if count % per_slice:
                    shown = self.num_workers if field == "num_workers" else count
                    raise ValueError(
                        f"The configured `{field}` ({shown}) must be a multiple of {per_slice} for the specified "
                        f"topology ({self.topology}). ScalingConfig: one {self.accelerator_type} slice of topology "
                        f"{self.topology} holds {per_slice} workers of {resources}; ask for {per_slice}, "
                        f"{2 * per_slice}, ... workers, or change resources_per_worker['TPU']."
                    )

    def _check_label_selector(self) -> None:
        selector = self.label_selector
        if selector is None:
            return
        for item in selector if isinstance(selector, list) else [selector]:
            if not isinstance(item, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in item.items()
            ):
                raise TypeError(
                    f"ScalingConfig.label_selector={selector!r}: must be a dict of label name to value "
                    "(e.g. {'ray.io/market-type': 'spot'}), or a list with one such dict per worker."
                )
        if isinstance(selector, list) and len(selector) != self.max_workers:
            raise ValueError(
                f"ScalingConfig.label_selector has {len(selector)} entries for {self.max_workers} workers: a list "
                "needs one selector per worker (as many as max_workers); pass one dict to apply it to every worker."
            )

    # -- sizes -------------------------------------------------------------------------------------

    @property
    def elasticity_enabled(self) -> bool:
        """True when ``num_workers`` is a (min, max) range."""
        return isinstance(self.num_workers, tuple)

    @property
    def min_workers(self) -> int:
        """The fewest workers the run trains with (``num_workers`` when it is fixed)."""
        return self.num_workers[0] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def max_workers(self) -> int:
        """The most workers the run trains with (``num_workers`` when it is fixed)."""
        return self.num_workers[1] if isinstance(self.num_workers, tuple) else self.num_workers

    def with_num_workers(self, num_workers: int) -> ScalingConfig:
        """This config with a fixed number of workers (one elastic attempt's size)."""
        return dataclasses.replace(self, num_workers=num_workers)

    # -- resources ---------------------------------------------------------------------------------

    @property
    def worker_resources(self) -> dict[str, float]:
        """The resources one worker reserves, with defaults filled in and zero amounts dropped."""
        resources: dict[str, float]
        if self._tpu_shape is not None:
            resources = dict(self._tpu_shape[1])  # a whole TPU host and 1 CPU, or resources_per_worker and 1 CPU
        elif self.resources_per_worker is None:
            # No CPU beside an accelerator, as Ray: GPU nodes often have few CPUs.
            resources = {"GPU": 1} if self.use_gpu else {"TPU": 1} if self.use_tpu else {"CPU": 1}
        else:
            resources = dict(self.resources_per_worker)
        if self.use_gpu:
            resources.setdefault("GPU", 1)
        if self.accelerator_type:
            # A sliver of the resource: enough to land on such a node, not to count as using it.
            resources.setdefault(f"{ACCELERATOR_RESOURCE_PREFIX}{self.accelerator_type}", 0.001)
        return {name: amount for name, amount in resources.items() if amount}

    @property
    def tpu_workers_per_slice(self) -> int | None:
        """How many workers one TPU slice of ``topology`` holds (with ``use_tpu``, ``topology`` and
        ``accelerator_type``), or None: then the workers are placed as any others."""
        return None if self._tpu_shape is None else self._tpu_shape[0]

    @property
    def total_resources(self) -> dict[str, float]:
        """The resources all workers together reserve (at ``max_workers`` when elastic)."""
        return {name: amount * self.max_workers for name, amount in self.worker_resources.items()}

    @property
    def num_cpus_per_worker(self) -> float:
        """CPUs each worker reserves."""
        return self.worker_resources.get("CPU", 0)

    @property
    def num_gpus_per_worker(self) -> float:
        """GPUs each worker reserves."""
        return self.worker_resources.get("GPU", 0)

    @property
    def num_tpus_per_worker(self) -> float:
        """TPUs each worker reserves."""
        return self.worker_resources.get("TPU", 0)

    @property
    def additional_resources_per_worker(self) -> dict[str, float]:
        """What each worker reserves beside CPUs and GPUs (custom resources, memory, accelerator type)."""
        return {name: amount for name, amount in self.worker_resources.items() if name not in ("CPU", "GPU")}

    def label_selector_per_worker(self, num_workers: int) -> list[dict[str, str]] | None:
        """One label selector per worker for an attempt of ``num_workers`` workers, or None."""
        if isinstance(self.label_selector, list):
            return [dict(s) for s in self.label_selector[:num_workers]]
        if isinstance(self.label_selector, dict):
            return [dict(self.label_selector) for _ in range(num_workers)]
        return None

    def as_placement_group_factory(self) -> Any:
        """Ray Tune resources for a trial that runs this trainer: one CPU for the trial's own
        process, then one bundle per worker (see ``trainers.tune.trial_resources``)."""
        return self.tune_bundles({"CPU": 1})

    def tune_bundles(self, driver_resources: dict[str, float]) -> Any:
        """A ``tune.PlacementGroupFactory``: ``driver_resources`` for the trial's own process, then one
        bundle per worker (``max_workers``: an elastic trainer trains at its maximum in a trial)."""
        from ray import tune

        workers = [dict(self.worker_resources) for _ in range(self.max_workers)]
        return tune.PlacementGroupFactory([dict(driver_resources), *workers], strategy=self.placement_strategy)


@dataclasses.dataclass(frozen=True)
class FailureConfig:
    """How many failures a run survives before ``fit()`` gives up.

    A worker failure (exception, dead process, lost node) restarts the whole worker group from
    the latest committed checkpoint while the budget allows. A preempted node (drained by the
    cloud with a deadline) counts against ``max_preemption_failures`` instead.
    """

    #: Restarts allowed after worker failures: 0 never restarts, -1 restarts without limit.
    max_failures: int = 0
    #: A Ray Tune setting that Ray Train V2 dropped; passing it raises DeprecationWarning.
    fail_fast: bool | str = DEPRECATED
    #: Retries of the whole ``fit()`` after a driver-level failure (a ``ControllerError``, or the
    #: driver dying), each resuming from the latest checkpoint; -1 without limit. Made by whatever
    #: runs ``fit()`` (the Prefect pipeline's train task); ``fit()`` alone warns when this is set.
    #: (A worker group that fails to start counts against ``max_failures``, not here as in Ray.)
    controller_failure_limit: int = -1
    #: Restarts allowed after nodes were preempted (drained with a deadline): -1 without limit.
    max_preemption_failures: int = -1
    #: On a preemption, let the workers on the surviving nodes finish their step without waiting
    #: at collectives for the ranks being taken away.
    relax_collectives_on_preemption: bool = False
    #: Seconds past the preemption deadline that workers get to finish a checkpoint before the
    #: run restarts without them.
    preemption_grace_s: float = 0.0
    #: Seconds a rank may lag behind the others' report of the same step (or their arrival at the
    #: same ``trainers.collective`` barrier) before the run counts it as hung (a failure,
    #: restarted per ``max_failures``). None: never.
    report_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.fail_fast != DEPRECATED:
            raise _deprecated(
                "FailureConfig(fail_fast=...)",
                "It only mattered for many Ray Tune trials at once; pass it to ray.tune.FailureConfig "
                "for a tune.Tuner instead.",
            )
        for field in ("max_failures", "controller_failure_limit", "max_preemption_failures"):
            check_int(
                f"FailureConfig.{field}",
                getattr(self, field),
                minimum=-1,
                allowed="an integer >= -1 (-1 means unlimited)",
            )
        check_bool("FailureConfig.relax_collectives_on_preemption", self.relax_collectives_on_preemption)
        check_number("FailureConfig.preemption_grace_s", self.preemption_grace_s, minimum=0, allowed="seconds >= 0")
        timeout = self.report_timeout_s
        if timeout is not None:
            check_number(
                "FailureConfig.report_timeout_s", timeout, minimum=0, strict=True, allowed="None or seconds > 0"
            )


#: The dataset name Ray Train's trainers treat as the training set (``datasets={"train": ds}``).
TRAIN_DATASET_KEY = "train"


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """How the trainer's Ray Data datasets reach the workers.

    Datasets named in ``datasets_to_split`` are streamed to the workers in equal shards; the rest
    reach every worker whole.
    """

    #: "all", or the names of the datasets to split.
    datasets_to_split: Literal["all"] | list[str] = "all"
    #: Ray Data execution options (``ray.data.ExecutionOptions``) for every dataset's pipeline, or a
    #: dict of dataset name to options for some of them (the others keep the defaults).
    execution_options: Any = None
    #: Let each worker's shard prefer data blocks that sit on that worker's node.
    enable_shard_locality: bool = True
    #: Save where each worker's data stands in its epoch with every checkpoint (the rows its
    #: ``get_dataset_shard`` iterators handed out, the samples of its ``prepare_data_loader``
    #: loaders' ``DistributedSampler``), in the run's record, and start a resumed epoch there
    #: instead of at its beginning. Exact with ``ExecutionOptions(preserve_order=True)`` and the
    #: same number of workers. False: a resumed run replays its epoch from the start, as Ray Train does.
    checkpoint_data_position: bool = True

    def __post_init__(self) -> None:
        value = self.datasets_to_split
        if value != "all" and not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
            raise TypeError(
                f"`datasets_to_split` should be 'all' or a list of dataset names: DataConfig.datasets_to_split={value!r} "
                f"({type(value).__name__}) is neither; e.g. DataConfig(datasets_to_split=['train'])."
            )
        options = self.execution_options
        if isinstance(options, dict) and not all(isinstance(name, str) for name in options):
            raise TypeError(
                f"DataConfig.execution_options={options!r}: a dict must map dataset names (e.g. 'train') to "
                "ray.data.ExecutionOptions."
            )
        check_bool("DataConfig.enable_shard_locality", self.enable_shard_locality)
        check_bool("DataConfig.checkpoint_data_position", self.checkpoint_data_position)

    def configure(
        self,
        datasets: dict[str, Any],
        world_size: int,
        worker_handles: Any = None,
        worker_node_ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[dict[str, Any]]:
        """One ``{name: DataIterator}`` per worker rank; override it in a subclass to decide the
        shards yourself, as with Ray Train's ``DataConfig.configure``.

        Each dataset runs on a copy with its own execution options (an unnamed dataset you passed
        is named after its key, as in Ray Train). Datasets in ``datasets_to_split`` are streamed in
        equal shards, each preferring blocks on its worker's node (``worker_node_ids``, in rank
        order) with ``enable_shard_locality``; the others reach every rank whole.
        ``worker_handles`` and ``kwargs`` are accepted for Ray's signature and not used."""
        to_split = set(datasets) if self.datasets_to_split == "all" else set(self.datasets_to_split)
        hints = list(worker_node_ids) if self.enable_shard_locality and worker_node_ids else None
        shards: list[dict[str, Any]] = [{} for _ in range(world_size)]
        for name, dataset in datasets.items():
            if dataset.name is None:
                dataset.set_name(name)
            # A copy with a context of its own: the options set here must not reach the caller's dataset.
            dataset = type(dataset).copy(dataset, _deep_copy=True)
            dataset.context.execution_options = self.execution_options_for(name)
            if name in to_split and world_size > 1:
                parts = dataset.streaming_split(world_size, equal=True, locality_hints=hints)
            else:
                # With one worker a split dataset is read whole: a plain iterator needs no split
                # coordinator actor (a process of its own), so the first batch comes sooner.
                parts = [dataset.iterator()] * world_size
            for rank in range(world_size):
                shards[rank][name] = parts[rank]
        return shards

    @staticmethod
    def default_ingest_options() -> Any:
        """The ``ray.data.ExecutionOptions`` of a dataset ``execution_options`` names none for: a
        copy of the current ``DataContext``'s, as in Ray Train."""
        from ray.data import DataContext

        # A copy, not ExecutionOptions(exclude_resources=...): Ray 2.60 warns on every
        # exclude_resources it is given (deprecated for label_selector), the default zero included.
        return copy.deepcopy(DataContext.get_current().execution_options)

    def execution_options_for(self, name: str) -> Any:
        """A fresh copy of the ``ExecutionOptions`` dataset ``name`` runs with: those given for all
        datasets or for ``name``, else ``default_ingest_options()`` (a subclass may override it)."""
        given = self.execution_options
        if isinstance(given, dict):
            given = given.get(name)
        return copy.deepcopy(self.default_ingest_options() if given is None else given)


#: The log levels ``LoggingConfig`` accepts, as Python's logging spells them.
LOG_LEVELS = ("CRITICAL", "FATAL", "ERROR", "WARN", "WARNING", "INFO", "DEBUG", "NOTSET")


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    """How much flowtrain itself logs, in the driver and in the workers (the ``trainers`` and
    ``storage`` loggers). Your own loggers, Ray's and the root logger are left alone."""

    #: A Python log level name: "DEBUG", "INFO", "WARNING", "ERROR" or "CRITICAL" (any case).
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        level = self.log_level
        if not isinstance(level, str) or level.upper() not in LOG_LEVELS:
            raise ValueError(
                f"LoggingConfig.log_level={level!r}: must be one of {', '.join(repr(name) for name in LOG_LEVELS)}."
            )
        object.__setattr__(self, "log_level", level.upper())


_NAME_PATTERN = re.compile(r"^[A-Za-z0-9._\-=+@,]+$")


@dataclasses.dataclass(frozen=True)
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
    storage_filesystem: pafs.FileSystem | None = None
    #: How many worker failures to survive.
    failure_config: FailureConfig | None = None
    #: Which checkpoints to keep.
    checkpoint_config: CheckpointConfig | None = None
    #: ``UserCallback`` objects called in the driver after each report and on failures.
    callbacks: list[UserCallback] | None = None
    #: Runtime environment for the worker actors (``ray.runtime_env.RuntimeEnv`` or dict).
    worker_runtime_env: dict | None = None
    #: How much flowtrain logs (``LoggingConfig(log_level="DEBUG")``).
    logging_config: LoggingConfig | None = None
    #: Ray Tune settings Ray Train V2 dropped; passing any of them raises DeprecationWarning.
    sync_config: Any = DEPRECATED
    verbose: Any = DEPRECATED
    stop: Any = DEPRECATED
    progress_reporter: Any = DEPRECATED
    log_to_file: Any = DEPRECATED

    def __post_init__(self) -> None:
        for field in ("sync_config", "verbose", "stop", "progress_reporter", "log_to_file"):
            if getattr(self, field) != DEPRECATED:
                raise _deprecated(
                    f"RunConfig({field}=...)",
                    "It was a Ray Tune setting; to keep using it, run the trainer as one trial of a "
                    "ray.tune.Tuner and set it there.",
                )
        if self.name is not None:
            if not isinstance(self.name, str) or not self.name.strip():
                raise ValueError(f"RunConfig.name={self.name!r}: must be a non-empty string.")
            if not _NAME_PATTERN.match(self.name) or self.name in (".", ".."):
                raise ValueError(
                    f"RunConfig.name={self.name!r}: must be one folder name (letters, digits and . _ - = + @ ,), "
                    "without '/' or spaces; put nesting in storage_path instead."
                )
        path = self.storage_path
        if path is not None:
            if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
                raise ValueError(
                    f"RunConfig.storage_path={path!r}: must be a non-empty absolute path or a URI such as 's3://bucket/prefix'."
                )
            text = str(path)
            if not is_uri(text) and self.storage_filesystem is None and not os.path.isabs(os.path.expanduser(text)):
                raise ValueError(
                    f"RunConfig.storage_path={text!r}: a relative path means different folders on different "
                    f"nodes; give an absolute path (e.g. {os.path.abspath(text)!r}) or a URI."
                )
        if self.storage_filesystem is not None and not isinstance(self.storage_filesystem, pafs.FileSystem):
            raise TypeError(
                f"RunConfig.storage_filesystem={self.storage_filesystem!r}: must be a pyarrow.fs.FileSystem "
                "(wrap an fsspec filesystem with pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs)))."
            )
        for field, kind in (
            ("failure_config", FailureConfig),
            ("checkpoint_config", CheckpointConfig),
            ("logging_config", LoggingConfig),
        ):
            value = getattr(self, field)
            if value is not None and not isinstance(value, kind):
                raise TypeError(f"RunConfig.{field}={value!r}: must be a {kind.__name__}.")
        if self.callbacks is not None:
            from trainers.callback import UserCallback

            for callback in self.callbacks:
                if not isinstance(callback, UserCallback):
                    raise TypeError(f"RunConfig.callbacks: {callback!r} is not a trainers.UserCallback.")

    @property
    def resolved_storage_path(self) -> str:
        """``storage_path`` with the default filled in and ``~`` expanded."""
        return resolve_storage_path(self.storage_path)


__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "FailureConfig",
    "LoggingConfig",
    "TRAIN_DATASET_KEY",
    "RunConfig",
    "ScalingConfig",
]
