"""One attempt's workers, as the controller sees them: on Ray actors, or in this process.

``RayWorkers.launch`` does everything between "the controller wants workers" and "the training
function runs": start the group, pin GPUs, let the backend set up communication, split the
datasets and hand every worker its session.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import socket
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ray

from storage import Checkpoint, settings
from storage.health import PreflightRecord
from storage.layout import RunLayout
from storage.positions import DataResume, RoundPosition
from storage.snapshot import RestartRecord
from trainers._internal.events.messages import LAUNCH, Event, FailedEvent, ReportEvent, take_events
from trainers._internal.health import preflight
from trainers._internal.health.health_settings import PreflightSettings
from trainers._internal.log_level import apply_log_level
from trainers._internal.ray_private import end_dataset_splits, set_current_data_context
from trainers._internal.session.data import is_dataset, names_to_split, split_datasets
from trainers._internal.session.data_position import DataPositions, ResumePlan, plan_resume, position_hooks_problem
from trainers._internal.workers import shared_storage
from trainers._internal.workers.devices import assign_visible_devices
from trainers._internal.workers.elastic import ElasticSizer, NodeResources, wait_released
from trainers._internal.workers.preemption_watch import DrainWatch, PreemptionNotice
from trainers._internal.workers.ranks import Ranks
from trainers._internal.workers.resources import capturing_placement_group
from trainers._internal.workers.reuse import Reuse, refusal
from trainers._internal.workers.start_failure import describe_nodes
from trainers._internal.workers.worker_group import RayWorkerGroup, WorkerStartError
from trainers.backend import Backend, BackendConfig
from trainers.config import DataConfig, ScalingConfig
from trainers.context import StorageInfo, TrainContext
from trainers.tuning import NODE_DEATH_WAIT_S

if TYPE_CHECKING:
    from trainers._internal.session.worker_session import WorkerSession

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What every attempt of one run starts from."""

    name: str
    train_fn: Callable[..., Any]
    train_loop_config: Any
    takes_config: bool
    scaling: ScalingConfig
    backend_config: BackendConfig
    datasets: dict[str, Any]
    dataset_config: DataConfig
    storage_info: StorageInfo
    layout: RunLayout
    metadata: dict[str, Any]
    start_timeout_s: float
    runtime_env: dict | None = None
    #: ``CheckpointConfig.checkpoint_score_attribute``, checked by ``report()`` in the workers.
    score_attribute: str | None = None
    #: The driver's Ray Data ``DataContext`` when ``fit()`` was called, installed in every worker
    #: (None: the driver never imported Ray Data, the workers' default is the same).
    data_context: Any = None
    #: ``LoggingConfig.log_level`` for flowtrain's loggers in the workers (None: leave them be).
    log_level: str | None = None
    #: The trainer's ``ValidationConfig``: ``report(validation=...)`` checks requests against it.
    validation_config: Any = None
    #: Whether the first attempt runs the pre-flight check (``FLOWTRAIN_PREFLIGHT``), and its bar.
    preflight: PreflightSettings = PreflightSettings()
    #: A file of the run folder every worker must see before it trains (``shared_storage``): the
    #: driver's lease. None: not checked.
    storage_marker: str | None = None
    #: Whether a failure may be followed by another attempt (``FailureConfig.max_failures`` != 0):
    #: only such a run starts spare workers, which serve nothing else.
    restartable: bool = False


def _resume_plan(spec: RunSpec, world_size: int, saved: RoundPosition | None) -> ResumePlan | None:
    """Where each rank's data starts (None: positions are not kept); warns, in the driver, when
    resuming ``saved`` is not exact."""
    config = spec.dataset_config
    if not config.checkpoint_data_position:
        return None
    if any(map(is_dataset, spec.datasets.values())) and (problem := position_hooks_problem()) is not None:
        warnings.warn(
            f"DataConfig(checkpoint_data_position=True) is off for this run: with Ray {ray.__version__} "
            f"flowtrain's count of the rows a dataset shard hands out is wrong ({problem}). A restarted "
            "epoch replays from its beginning instead of skipping rows it may not have trained on. Use the "
            "Ray version flowtrain pins, or pass DataConfig(checkpoint_data_position=False) to silence this.",
            UserWarning,
            stacklevel=4,
        )
        return None
    if not saved:
        return ResumePlan([None] * world_size)
    ordered = {name: bool(config.execution_options_for(name).preserve_order) for name in spec.datasets}
    plan = plan_resume(saved, world_size=world_size, ordered=ordered, split=names_to_split(spec.datasets, config))
    if plan.warning is not None:
        warnings.warn(plan.warning, UserWarning, stacklevel=4)
    return plan


def _session_args(
    spec: RunSpec,
    attempt: int,
    checkpoint: Checkpoint | None,
    shards: dict,
    plan: ResumePlan | None,
    ranks: Ranks,
    world_size: int,
    accelerator_ids: tuple[int, ...] = (),
) -> dict:
    """What one worker's ``WorkerSession`` is made with, its ``TrainContext`` among it."""
    context = TrainContext(
        experiment_name=spec.name,
        world_size=world_size,
        storage=spec.storage_info,
        accelerator_ids=accelerator_ids,
        metadata=spec.metadata,
        attempt=attempt,
        **dataclasses.asdict(ranks),
    )
    return dict(
        context=context,
        attempt=attempt,
        layout=spec.layout,
        checkpoint=checkpoint,
        dataset_shards=shards,
        score_attribute=spec.score_attribute,
        validation_config=spec.validation_config,
        data_position=DataPositions(plan.starts[ranks.world_rank]) if plan is not None else None,
        framework=spec.backend_config.backend_cls.process,
    )


class RayWorkers:
    """The workers of one attempt as Ray actors."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.world_size = spec.scaling.max_workers
        self.backend = spec.backend_config.backend_cls()
        self.group: RayWorkerGroup | None = None
        # An elastic run sizes each attempt by what is free, except inside a Tune trial, whose
        # group already holds max_workers bundles for it.
        elastic = spec.scaling.elasticity_enabled and capturing_placement_group() is None
        self.sizer = ElasticSizer(spec.scaling) if elastic else None
        self._started_at = 0.0
        #: What the last stopped group held per node: the next elastic count waits to see it free.
        self._released: NodeResources = {}
        self._drain: DrainWatch | None = None
        self._nodes: dict[int, tuple[str, str]] = {}
        #: The backend was torn down after a clean end: the workers may be kept for the next run.
        self._clean = False
        self.workers_parked: str | None = None
        #: The attempt under way (for the restart record).
        self._attempt = 0
        #: Its dataset shards, one ``{name: DataIterator}`` per rank.
        self._shards: list[dict[str, Any]] = []
        #: ``launch`` is re-forming the group around kept workers: a failure now restarts them all.
        self._reforming = False
        self.preflight: PreflightRecord | None = None
        self._spares_per_node = settings.SPARE_WORKERS.read() if spec.restartable else 0
        self._spares_after_s = settings.SPARE_AFTER_S.read()
        self._unreachable_s = settings.UNREACHABLE_S.read()
        #: Nodes the next new group stays off: lost hosts found when every worker had to restart.
        self._avoid_next: frozenset[str] = frozenset()
        #: This attempt's group should get its spare workers once it reports (``_fill_spares``).
        self._spares_due = False
        self._first_started_at: float | None = None

    def launch(
        self, attempt: int, checkpoint: Checkpoint | None, data_position: RoundPosition | None = None
    ) -> DataResume | None:
        """Start attempt ``attempt``: around the survivors ``stop`` kept, replacing only the ranks it
        let go, or else a whole new group. Returns how the data position was resumed."""
        self._attempt = attempt
        shards: list[dict[str, Any]] = []
        if self.group is not None and self.group.workers:
            self._reforming = True
            self.group.refill(self.spec.start_timeout_s)
            shards = self._split([w.metadata.node_id for w in self.group.workers])
        else:
            self._start_group(shards)
        self._shards = shards
        note = self._start_training(attempt, checkpoint, data_position, shards)
        self._reforming = False
        return note

    def _split(self, node_ids: list[str]) -> list[dict[str, Any]]:
        return split_datasets(self.spec.datasets, self.spec.dataset_config, self.world_size, node_ids)

    def _start_group(self, shards: list[dict[str, Any]]) -> None:
        """Reserve the placement group and start every worker (some of them, perhaps, kept from the
        last run); ``shards`` receives the datasets' split."""
        spec = self.spec

        def split(node_ids: list[str]) -> None:
            # Splitting once the nodes are known but before the actors start gives each shard its
            # worker's node as locality hint, and starts Ray Data's split coordinator (an actor that
            # needs a process of its own) while the workers start and import their framework, not
            # after them: the first batch no longer also waits for that process to start.
            shards.extend(self._split(node_ids))

        scaling = spec.scaling
        if scaling.elasticity_enabled:
            if self.sizer is not None:
                wait_released(self._released)
                size = self.sizer.size_to_start(time.monotonic() + spec.start_timeout_s)
                if size < scaling.min_workers:
                    raise WorkerStartError(
                        f"the cluster did not come to hold min_workers={scaling.min_workers} worker(s) x "
                        f"{scaling.worker_resources} within {spec.start_timeout_s:g} s (room for {size}). Nodes now: "
                        f"{describe_nodes()}. Add nodes, lower the minimum of ScalingConfig.num_workers, or raise "
                        "FLOWTRAIN_WORKER_START_TIMEOUT_S."
                    )
                self.world_size = size
            scaling = scaling.with_num_workers(self.world_size)
        self._clean = False
        self.group = RayWorkerGroup(
            scaling=scaling,
            start_timeout_s=spec.start_timeout_s,
            runtime_env=spec.runtime_env,
            reusable=type(self.backend) is Backend or self.backend.reuses_workers,
            backend_name=spec.backend_config.framework or type(self.backend).__name__,
            unreachable_s=self._unreachable_s,
            avoid=self._avoid_next,
        )
        self._avoid_next = frozenset()
        self.group.start(on_placed=split)

    def _start_training(
        self,
        attempt: int,
        checkpoint: Checkpoint | None,
        data_position: RoundPosition | None,
        shards: list[dict[str, Any]],
    ) -> DataResume | None:
        """Everything between "the workers are up and ranked" and "the training function runs":
        pin GPUs, let the backend set up communication, hand every worker its session."""
        spec, backend_config = self.spec, self.spec.backend_config
        group = self.group
        assert group is not None  # launch started or re-formed it
        self._started_at = time.monotonic()
        first_attempt = self._first_started_at is None
        if first_attempt:
            self._first_started_at = self._started_at
        self._spares_due = self._spares_per_node > 0
        context = spec.data_context
        installed = group.execute_async(set_current_data_context, context) if context is not None else []
        marker = spec.storage_marker
        shipped = spec.storage_info.shipped_filesystem
        looked = group.execute_async(shared_storage.what_this_node_sees, shipped, marker) if marker else []
        node_ids = [w.metadata.node_id for w in group.workers]
        self._nodes = {w.ranks.world_rank: (w.metadata.node_id, w.metadata.node_ip) for w in group.workers}
        node_to_ranks: dict[str, list[int]] = {}
        for rank, (node_id, _) in self._nodes.items():
            node_to_ranks.setdefault(node_id, []).append(rank)
        self._drain = DrainWatch(node_to_ranks)
        if marker:  # before any process group or training: a node that does not share the run's folder
            shared_storage.check_every_node_sees(
                spec.storage_info.storage_filesystem,
                marker,
                group.wait_all(looked, timeout_s=spec.start_timeout_s),
                node_ids,
            )
        accelerators: list[tuple[int, ...]] = [() for _ in group.workers]
        if spec.scaling.use_gpu:
            visible = assign_visible_devices([list(w.metadata.gpu_ids) for w in group.workers], node_ids)
            envs = [{"CUDA_VISIBLE_DEVICES": devices} for devices, _ in visible]
            ray.get([w.actor.set_env.remote(env) for w, env in zip(group.workers, envs, strict=True)])
            accelerators = [ids for _, ids in visible]
        if spec.log_level is not None:
            group.execute(apply_log_level, spec.log_level)
        self.backend.on_start(group, backend_config)
        if first_attempt and spec.preflight.runs(spec.scaling.use_gpu):
            self.preflight = self._preflight(group)  # before step 0: PreflightError names a slow worker
        plan = _resume_plan(spec, self.world_size, data_position)
        session_args = [
            _session_args(spec, attempt, checkpoint, shard, plan, worker.ranks, self.world_size, tuple(ids))
            for worker, ids, shard in zip(group.workers, accelerators, shards, strict=True)
        ]
        ray.get(installed)  # the training function must find the driver's DataContext from its first line
        self.backend.on_training_start(group, backend_config)
        group.start_training(
            spec.train_fn, spec.train_loop_config, spec.takes_config, session_args, backend_config.train_func_context
        )
        return plan.note if plan is not None else None

    def _preflight(self, group: RayWorkerGroup) -> PreflightRecord | None:
        """Every worker's compute probe and the group's all-reduce, judged against the median
        worker; None when the backend's framework has no probe."""
        started = time.monotonic()
        figures = group.execute(
            self.backend.process.probe, self.spec.scaling.use_gpu, timeout_s=self.spec.start_timeout_s
        )
        if None in figures:
            return None
        return preflight.judge(figures, self._nodes, self.spec.preflight, time.monotonic() - started)

    def poll(self, timeout_s: float) -> list[Event | PreemptionNotice]:
        if self.group is None:
            return []
        events: list[Event | PreemptionNotice] = [*self.group.poll(timeout_s)]
        if self._spares_due and any(isinstance(event, ReportEvent) for event in events):
            self._fill_spares()
        if self._drain is not None and (info := self._drain.check()) is not None:
            for worker in self.group.workers:
                worker.actor.mark_preempted.remote(info)  # get_preemption_info() answers it from now on
            events.append(PreemptionNotice(info))
        return events

    def _fill_spares(self) -> None:
        """Once the run has trained ``FLOWTRAIN_SPARE_AFTER_S`` and this attempt reports, have the
        spare workers ready (``spares``): the first time, or again after one took a failed rank's place."""
        started = self._first_started_at
        if self.group is None or started is None or time.monotonic() - started < self._spares_after_s:
            return
        try:
            self._spares_due = not self.group.fill_spares(self._spares_per_node)
        except Exception as error:  # noqa: BLE001 - rank 0 may be failing right now: its failure comes through poll
            self._spares_due = False
            logger.debug("spare workers not started: %s: %s", type(error).__name__, error)

    def lost_a_node(self, node_ids: list[str], wait_s: float = NODE_DEATH_WAIT_S) -> bool:
        """Whether one of ``node_ids`` has left the cluster (not just a worker process dying).

        Ray marks a node dead a moment after its processes go, so the answer waits up to
        ``wait_s`` for that mark; the controller asks only after workers died.
        """
        wanted = {node for node in node_ids if node}
        deadline = time.monotonic() + wait_s
        while True:
            alive = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
            if wanted - alive:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def resize_to(self) -> int | None:
        """The larger size an elastic run should restart at, now that more workers fit, or None."""
        if self.sizer is None or self.group is None or not self.group.workers:
            return None
        return self.sizer.resize_to(self.world_size, self._held(), self._started_at)

    def _held(self) -> NodeResources:
        """What this attempt's workers hold on each node."""
        held: NodeResources = {}
        if self.group is not None:
            for worker in self.group.workers:
                node = held.setdefault(worker.metadata.node_id, {})
                for name, amount in self.group.scaling.worker_resources.items():
                    node[name] = node.get(name, 0.0) + amount
        return held

    def release(self, index: int, data: Any) -> None:
        if self.group is not None:
            self.group.release_sync(index, data)

    def answer_checkpoints(self, rank: int, query_id: int, answer: Any) -> None:
        if self.group is not None and self.group.workers:
            self.group.answer_checkpoints(rank, query_id, answer)

    def where(self, rank: int) -> tuple[str, str]:
        return self._nodes.get(rank, ("", ""))

    def probe(self, ranks: list[int]) -> tuple[list[FailedEvent], dict[int, str]]:
        return self.group.probe(ranks) if self.group is not None and self.group.workers else ([], {})

    def finish(self) -> None:
        """Clean end of training: let the backend tear down before the actors go."""
        if self.group is not None and self.group.workers:
            self.backend.on_shutdown(self.group, self.spec.backend_config)
            self._clean = True

    def stop(self, failed: dict[int, str]) -> RestartRecord:
        """End a failed attempt, keeping the workers that can serve the next one: only the ranks of
        ``failed`` (world rank -> failure kind) that cannot train again are replaced at the next
        ``launch``. When the group cannot be re-formed in place, every worker is stopped and the
        record says why."""
        why = self._why_not_in_place(failed)
        if why is None and self.group is not None:
            end_dataset_splits(self._shards)  # a rank waiting in an epoch barrier for a dead one gets out
            replaced = self.group.stop_training(failed, lost_hosts=self._lost_hosts(failed))
            kept = tuple(w.ranks.world_rank for w in self.group.workers)
            if kept:
                self._drain = None
                logger.info("attempt %d: replacing rank(s) %s, keeping %s", self._attempt, sorted(replaced), list(kept))
                return RestartRecord(self._attempt, kept=kept, replaced=replaced)
            why = "no rank could be kept: " + "; ".join(f"rank {r} {w}" for r, w in sorted(replaced.items()))
            self._avoid_next = self.group.avoided
        self.shutdown()
        logger.info("attempt %d: restarting every worker: %s", self._attempt, why)
        return RestartRecord(self._attempt, full_restart=why)

    def _lost_hosts(self, failed: dict[int, str]) -> frozenset[str]:
        """The addresses of the failed ranks' nodes that Ray has declared dead, or that stopped answering."""
        nodes = {self._nodes.get(rank, ("", ""))[0] for rank in failed} - {""}
        dead = {node["NodeID"] for node in ray.nodes() if not node.get("Alive")} & nodes
        dead |= {self._nodes[rank][0] for rank, kind in failed.items() if kind == "unreachable" and rank in self._nodes}
        return frozenset(address for node, address in self._nodes.values() if node in dead)

    def _why_not_in_place(self, failed: dict[int, str]) -> str | None:
        """Why the next attempt cannot keep this one's healthy workers, or None when it can."""
        if self._reforming:
            return "a second failure while the group re-formed"
        if self.group is None or not self.group.workers:
            return "the workers had not started"
        if LAUNCH in failed:
            return "the worker group did not start"
        # The group's own ScalingConfig has the attempt's fixed size; the run's says it is elastic.
        facts = dataclasses.replace(self.group.facts, elastic=self.spec.scaling.elasticity_enabled)
        return refusal(facts, Reuse.WITHIN_RUN)

    def shutdown(self) -> None:
        self._drain = None
        self._reforming = False
        if self.group is not None:
            if self.group.workers:
                self._released = self._held()
            self.workers_parked = self.group.shutdown(keep=self._clean) or self.workers_parked
            self._clean = False
            self.group = None


class LocalWorkers:
    """``num_workers=0``: the training function runs in a thread of this process, as rank 0 of 1."""

    world_size = 1
    #: One worker in this process: nothing to compare it with.
    preflight: PreflightRecord | None = None
    #: No worker process to park.
    workers_parked: str | None = None

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self._events: queue.Queue[Event] = queue.Queue()
        self._session: WorkerSession | None = None
        self._attempt = 0

    def launch(
        self, attempt: int, checkpoint: Checkpoint | None, data_position: RoundPosition | None = None
    ) -> DataResume | None:
        spec = self.spec
        self._attempt = attempt
        self._events = queue.Queue()
        shards = split_datasets(spec.datasets, spec.dataset_config, 1)[0]
        plan = _resume_plan(spec, 1, data_position)
        args = _session_args(spec, attempt, checkpoint, shards, plan, Ranks(0, 0, 0, 1), world_size=1)
        from trainers._internal.session.train_thread import run_training_function  # the worker's own code
        from trainers._internal.session.worker_session import WorkerSession

        self._session = WorkerSession(emit=self._events.put, **args)
        context = spec.backend_config.train_func_context
        threading.Thread(
            target=run_training_function,
            args=(spec.train_fn, spec.train_loop_config, spec.takes_config, self._session, self._events.put, context),
            name="train_loop_per_worker",
            daemon=True,
        ).start()
        return plan.note if plan is not None else None

    def poll(self, timeout_s: float) -> list[Event]:
        return take_events(self._events, timeout_s)

    def release(self, index: int, data: Any) -> None:
        pass  # one rank: its barriers never wait for the controller

    def answer_checkpoints(self, rank: int, query_id: int, answer: Any) -> None:
        if self._session is not None:
            self._session.answer_checkpoints(query_id, answer)

    def where(self, rank: int) -> tuple[str, str]:
        return ("local", socket.gethostname())

    def probe(self, ranks: list[int]) -> tuple[list[FailedEvent], dict[int, str]]:
        return [], {}  # this process is the only worker

    def resize_to(self) -> int | None:
        return None  # one worker in this process: never elastic

    def lost_a_node(self, node_ids: list[str]) -> bool:
        return False  # the only worker runs on this process's own node

    def finish(self) -> None:
        pass

    def stop(self, failed: dict[int, str]) -> RestartRecord:
        self.shutdown()
        return RestartRecord(self._attempt, full_restart="the training function runs in the driver (num_workers=0)")

    def shutdown(self) -> None:
        if self._session is not None:
            self._session.stop_requested.set()
