"""N training workers as Ray actors in one placement group, ranked by node.

An attempt (``run_workers.RayWorkers``) drives a group through ``start`` (place, start and rank
the actors), ``execute`` (the backend's set-up), ``start_training``, then ``poll`` until
``shutdown``. Events arrive through a ``WorkerInbox``: each worker's socket to this process, and
behind it one Ray long poll per worker that also notices a dead worker or node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import time
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorUnschedulableError, RayActorError, RayError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from trainers._internal.events.messages import Event, FailedEvent
from trainers._internal.events.worker_inbox import WorkerInbox
from trainers._internal.workers import warm_workers
from trainers._internal.workers.placement_away import MovedBundles, off_nodes, silent_raylets, wait_for_bundles
from trainers._internal.workers.ranks import Ranks, assign_ranks
from trainers._internal.workers.resources import (
    WORKER_GROUP_PREFIX,
    capturing_placement_group,
    check_feasible,
    enclosing_placement_group,
    nodes_beside,
    stuck_beside_other_groups,
)
from trainers._internal.workers.reuse import GroupFacts, Reuse, refusal
from trainers._internal.workers.spares import SparePool, installed_modules
from trainers._internal.workers.start_failure import describe_nodes, describe_unstarted
from trainers._internal.workers.tpu import host_order, reserve_slices
from trainers._internal.workers.worker import StopAnswer, TrainWorker, WorkerMetadata
from trainers.config import ScalingConfig
from trainers.errors import InsufficientResourcesError, WorkerError
from trainers.tuning import KEPT_WORKER_ANSWER_S, SURVIVOR_ANSWER_S, SURVIVOR_STOP_S, TURN_CHECK_S

logger = logging.getLogger(__name__)


@functools.cache
def _remote_worker_class():
    """TrainWorker as a Ray actor class, made once per process (Ray exports it on first use)."""
    return ray.remote(TrainWorker)


class WorkerStartError(RuntimeError):
    """The workers could not be started in time (placement, actor start or backend setup)."""


@dataclasses.dataclass
class Worker:
    """One started worker: its actor, where it runs and its ranks."""

    actor: Any
    metadata: WorkerMetadata
    ranks: Ranks
    #: The index of the placement-group bundle it runs in (or, for a worker that may be parked,
    #: beside: on that bundle's node). A replacement takes the same bundle.
    bundle: int = 0


def _answers(refs: list[Any], timeout_s: float, errors: Any = RayError) -> dict[Any, Any]:
    """What each of ``refs`` that resolved within ``timeout_s`` returned, or raised (of ``errors``)."""
    answers: dict[Any, Any] = {}
    for ref in ray.wait(refs, num_returns=len(refs), timeout=timeout_s)[0] if refs else []:
        try:
            answers[ref] = ray.get(ref)
        except errors as error:
            answers[ref] = error
    return answers


def _kwargs_for_worker(resources: dict[str, float]) -> dict[str, Any]:
    options: dict[str, Any] = {"num_cpus": resources.get("CPU", 0), "num_gpus": resources.get("GPU", 0)}
    if "memory" in resources:
        options["memory"] = resources["memory"]
    if custom := {k: v for k, v in resources.items() if k not in ("CPU", "GPU", "memory")}:
        options["resources"] = custom
    return options


class RayWorkerGroup:
    """Starts, watches and stops the workers of one attempt."""

    def __init__(
        self,
        *,
        scaling: ScalingConfig,
        start_timeout_s: float,
        runtime_env: dict | None = None,
        reusable: bool = False,
        backend_name: str = "data-parallel",
        unreachable_s: float = 0.0,
        avoid: frozenset[str] = frozenset(),
    ) -> None:
        self.scaling = scaling
        self.start_timeout_s = start_timeout_s
        self.runtime_env = runtime_env
        #: What decides whether these workers are reused (``reuse.refusal``); ``start`` completes it.
        self.facts = GroupFacts(backend_reuses=reusable, backend_name=backend_name)
        #: Set by ``start`` (``reuse.refusal`` between runs): why the workers cannot outlive the group;
        #: None: they start beside it holding no resources, may be parked after a clean end, have spares.
        self._held_in_group: str | None = "not started"
        #: World rank -> bundle of the workers ``stop_training`` let go, for ``refill`` to replace.
        self._vacant: dict[int, int] = {}
        #: Spare workers beside the group (only for workers started beside it).
        self.spares = SparePool(self._new_worker_beside)
        #: Set by ``start`` for keepable workers: the shape their parked processes are filed under.
        self._shape: tuple = ()
        self.workers: list[Worker] = []
        self._pg: PlacementGroup | None = None
        self._owns_pg = False
        self._inbox: WorkerInbox | None = None
        self._placed: dict[int, str] = {}
        #: The TPU slices reserved for the workers (a ``ray.util.tpu.SlicePlacementGroup``), or None.
        self._slices: Any = None
        #: How long a rank's host may stay silent before it is replaced away from it (0: Ray decides).
        self.unreachable_s = unreachable_s
        #: Bundles reserved again away from hosts that stopped answering, and the hosts ``refill`` avoids.
        self._moved = MovedBundles()
        #: Nodes ``refill`` (a new group: none of its bundles) places nothing on: after a stop, those
        #: of the replaced ranks whose raylet took no connection (``avoided``).
        self._avoid: set[str] = set(avoid)
        #: Rank 0's answer to "which installed modules did you import?", while it is awaited.
        self._modules_asked: Any = None

    @property
    def world_size(self) -> int:
        return self.scaling.max_workers  # one attempt's group: a fixed size (ScalingConfig.with_num_workers)

    # -- starting -----------------------------------------------------------------------------

    def start(self, on_placed: Callable[[list[str]], None] | None = None) -> None:
        """Reserve the placement group, start the actors and assign ranks by node. ``on_placed``
        gets the workers' node ids in rank order before any actor starts, so what it starts (Ray
        Data's split coordinator) starts alongside the workers, not after them."""
        deadline = time.monotonic() + self.start_timeout_s
        bundle = self.scaling.worker_resources
        enclosing = enclosing_placement_group(self.scaling)
        trial_group = None
        if enclosing is not None:  # a Tune trial's group: its bundles are already ours, Tune removes it
            self._pg, first_bundle = enclosing
            if self.scaling.label_selector:
                warnings.warn(
                    f"ScalingConfig.label_selector={self.scaling.label_selector!r} is not applied: the workers run in "
                    "this Ray Tune trial's placement group, and Tune's groups take no label selectors. Reserve only "
                    "the trial's own process (tune.with_resources(fn, {'CPU': 1})) so the workers get a group of "
                    "their own with the selector.",
                    stacklevel=2,
                )
        else:
            trial_group = capturing_placement_group()
            beside = nodes_beside(trial_group) if trial_group is not None else None
            if beside is not None:  # fail now if the cluster could never hold us beside the trial
                check_feasible(self.scaling, beside[0], held=beside[1])
            name = f"{WORKER_GROUP_PREFIX}{uuid.uuid4().hex[:12]}"
            if self.scaling.tpu_workers_per_slice:
                self._pg = self._reserve_slices(name, deadline)
            else:
                self._pg = placement_group(
                    [dict(bundle) for _ in range(self.world_size)],
                    strategy=self.scaling.placement_strategy,
                    name=name,
                    bundle_label_selector=self._selectors_avoiding(),
                )
            first_bundle, self._owns_pg = 0, True
        if trial_group is None:
            self._wait_for_group(deadline)
        else:
            self._wait_for_turn(trial_group)
            deadline = time.monotonic() + self.start_timeout_s  # the turn's wait is not start-up time
        # Where each bundle was reserved: if a node dies before its worker starts, the group's
        # table forgets it, and the error must still say which node it was.
        self._placed = dict(placement_group_table(self._pg).get("bundles_to_node_id") or {})
        bundles = list(range(first_bundle, first_bundle + self.world_size))
        nodes = [self._placed[b] for b in bundles]
        if on_placed is not None:  # worker i starts in bundle first_bundle + i: its node is known now
            ranks = [r.world_rank for r in self._ranks(nodes)]
            on_placed([node for _, node in sorted(zip(ranks, nodes, strict=True))])
        self.facts = dataclasses.replace(
            self.facts,
            tpu_slices=self._slices is not None,
            in_tune_trial=not self._owns_pg or trial_group is not None,
            resources=tuple(sorted(bundle)),
        )
        self._held_in_group = refusal(self.facts, Reuse.BETWEEN_RUNS)
        logger.debug("workers may be parked after a clean end: %s", self._held_in_group or "yes")
        if self._beside_group:
            self._shape = warm_workers.shape_key(bundle, self.runtime_env)
        parked = warm_workers.take(self._shape, nodes) if self._beside_group else [None] * len(bundles)
        actors = self._start_actors(bundles, parked)
        self._rank(self._wait_for_actors(actors, bundles, deadline))

    def _rank(self, workers: list[Worker]) -> None:
        """Rank ``workers`` by node (in bundle order): they become ``workers``, with their ranks' environment."""
        workers = sorted(workers, key=lambda w: w.bundle)
        ranks = self._ranks([w.metadata.node_id for w in workers])
        self.workers = sorted(
            (dataclasses.replace(w, ranks=r) for w, r in zip(workers, ranks, strict=True)),
            key=lambda w: w.ranks.world_rank,
        )
        envs = [
            {
                "RANK": str(w.ranks.world_rank),
                "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(w.ranks.local_rank),
                "LOCAL_WORLD_SIZE": str(w.ranks.local_world_size),
                "NODE_RANK": str(w.ranks.node_rank),
                "GROUP_RANK": str(w.ranks.node_rank),
            }
            for w in self.workers
        ]
        ray.get([w.actor.set_env.remote(env) for w, env in zip(self.workers, envs, strict=True)])

    def _start_actors(
        self, bundles: list[int], reused: list[Any | None], ready: list[Any] | None = None, wait_s: float = 0.0
    ) -> list[Any]:
        """One worker per bundle of ``bundles``: ``reused[i]`` (a kept process on that bundle's
        node) where it is given and answers (its ``ready[i]``, a spare's warm-up, resolves within
        ``wait_s``, or its metadata call within ``KEPT_WORKER_ANSWER_S``), else ``_new_worker``."""
        ready = ready or [None] * len(bundles)
        checks = {
            (ready[i] if ready[i] is not None else actor.metadata.remote()): i
            for i, actor in enumerate(reused)
            if actor is not None
        }
        answers = _answers(list(checks), max(KEPT_WORKER_ANSWER_S, wait_s))
        # Not answered: died while kept, or its node left.
        answered = {checks[ref] for ref, answer in answers.items() if not isinstance(answer, RayError)}
        warm_workers.kill_actors(reused[i] for i in set(checks.values()) - answered)
        return [reused[i] if i in answered else self._new_worker(bundle) for i, bundle in enumerate(bundles)]

    @property
    def _beside_group(self) -> bool:
        """Whether the workers start beside the placement group, able to outlive it (``_held_in_group``)."""
        return self._held_in_group is None

    def _new_worker(self, bundle: int) -> Any:
        """A new worker for bundle ``bundle``: beside it (able to outlive it) when it may be parked,
        else in it, holding the bundle's resources."""
        if self._beside_group:
            return self._new_worker_beside(self._placed[bundle])
        assert self._pg is not None  # start() reserved it
        group, index = self._moved.placement(bundle) or (self._pg, bundle)
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
        return self._actor(strategy, None, **_kwargs_for_worker(self.scaling.worker_resources))

    def _new_worker_beside(self, node_id: str) -> Any:
        """A new worker on ``node_id`` that holds no resources (its bundle does)."""
        strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
        return self._actor(strategy, self._threads_beside(), num_cpus=0)

    def _actor(self, strategy: Any, omp_num_threads: int | None, **resources: Any) -> Any:
        options = {"max_concurrency": 4, "scheduling_strategy": strategy, "runtime_env": self.runtime_env}
        return _remote_worker_class().options(**options, **resources).remote(omp_num_threads)

    def _threads_beside(self) -> int | None:
        """``OMP_NUM_THREADS`` for a worker started beside its bundle: Ray would set 1 for a worker
        holding no CPU, a fresh worker gets its bundle's CPUs, unless the user set the variable
        (here or in the runtime environment)."""
        env_vars = (self.runtime_env or {}).get("env_vars") or {}
        if "OMP_NUM_THREADS" in os.environ or "OMP_NUM_THREADS" in env_vars:
            return None
        return max(1, math.floor(self.scaling.worker_resources.get("CPU", 1)))

    def _wait_for_actors(self, actors: list[Any], bundles: list[int], deadline: float) -> list[Worker]:
        """The workers of ``actors`` (unranked) once all have started; a clear ``WorkerStartError``
        naming the workers' nodes when some died while starting or did not answer by ``deadline``."""
        refs = [a.metadata.remote() for a in actors]
        # Unschedulable: a worker pinned to its bundle's node (one that can be kept) whose node left.
        errors = (RayActorError, RayTaskError, ActorUnschedulableError)
        answers = _answers(refs, max(0.1, deadline - time.monotonic()), errors)
        failed = {i: answers[ref] for i, ref in enumerate(refs) if isinstance(answers.get(ref), errors)}
        silent = [i for i, ref in enumerate(refs) if ref not in answers]
        if not silent and not failed:
            return [Worker(actor, answers[refs[i]], Ranks(0, 0, 0, 0), bundles[i]) for i, actor in enumerate(actors)]
        where = describe_unstarted(self._placed, bundles, silent, failed)
        warm_workers.kill_actors(actors)
        waited = f"within {self.start_timeout_s:g} s" if silent else "in time"
        raise WorkerStartError(
            f"{len(silent) + len(failed)} of {len(actors)} worker(s) x {self.scaling.worker_resources} did not start "
            f"{waited}: {where}. Nodes now: {describe_nodes()}. A node that left takes its workers with it; "
            "raise FLOWTRAIN_WORKER_START_TIMEOUT_S if workers only start slowly (large images, many workers per node)."
        )

    def _ranks(self, node_ids: list[str]) -> list[Ranks]:
        """Ranks of workers on ``node_ids``: the driver's node first, or TPU hosts slice by slice."""
        if self._slices is None:
            return assign_ranks(node_ids, first_node=ray.get_runtime_context().get_node_id())
        labels = {node["NodeID"]: node.get("Labels") or {} for node in ray.nodes()}
        return assign_ranks(node_ids, node_order=host_order(node_ids, labels))

    def _reserve_slices(self, name: str, deadline: float) -> Any:
        """The placement group of whole TPU slices for the workers (Ray's ``SlicePlacementGroup``)."""
        scaling = self.scaling
        # Only called with a TPU shape, which ScalingConfig derives from both of these.
        assert scaling.topology is not None and scaling.accelerator_type is not None and scaling.tpu_workers_per_slice
        try:
            self._slices = reserve_slices(
                scaling.topology,
                scaling.accelerator_type,
                num_workers=self.world_size,
                workers_per_slice=scaling.tpu_workers_per_slice,
                resources=scaling.worker_resources,
                strategy=scaling.placement_strategy,
                name=name,
                timeout_s=max(0.0, deadline - time.monotonic()),
            )
        except Exception as error:  # TimeoutError: no free slice head in time; RuntimeError: none of that type
            raise WorkerStartError(
                f"could not reserve the TPU slice(s) for {self.world_size} worker(s) x {scaling.worker_resources} "
                f"(topology {scaling.topology!r}, {scaling.accelerator_type}) within {self.start_timeout_s:g} s: "
                f"{error}. Nodes now: {describe_nodes()}."
            ) from error
        return self._slices.placement_group

    def _selectors_avoiding(self) -> list[dict[str, str]] | None:
        """Each worker's label selector, and off the nodes to avoid (a group started again after
        hosts stopped answering: Ray would place bundles there until it declares them dead)."""
        selectors = self.scaling.label_selector_per_worker(self.world_size)
        if not self._avoid:
            return selectors
        return [{**selector, **off_nodes(self._avoid)} for selector in selectors or [{}] * self.world_size]

    @property
    def avoided(self) -> frozenset[str]:
        """The nodes the last ``stop_training`` found lost (their raylet took no connection)."""
        return frozenset(self._avoid)

    def _wait_for_group(self, deadline: float, bundles: list[int] | None = None) -> None:
        """Wait until the group (``bundles``: those of its bundles) is placed, or fail at ``deadline``."""
        assert self._pg is not None  # start() reserved it
        if bundles is not None:
            placed = wait_for_bundles(self._pg, bundles, deadline)
        else:
            placed = self._pg.wait(timeout_seconds=max(0.0, deadline - time.monotonic()))
        if not placed:
            state = placement_group_table(self._pg).get("state", "?")
            selector = self.scaling.label_selector
            labels = f" on nodes matching label_selector {selector!r}" if selector else ""
            raise WorkerStartError(
                f"could not reserve {self.world_size} x {self.scaling.worker_resources} ({self.scaling.placement_strategy}){labels} "
                f"within {self.start_timeout_s:g} s (placement group {state}): other work holds the resources, "
                f"or a node is missing. Nodes now: {describe_nodes()}."
            )

    def _wait_for_turn(self, trial_group: Any) -> None:
        """Wait, without a time limit, until the cluster holds this trial's workers: concurrent Tune
        trials take turns, however long each trains. Each round checks the request could still
        fit (a node may be gone) and, past the start timeout, that somebody can move: when trials'
        own groups hold what every trainer waits for and none trains, this fails instead of hanging.
        """
        assert self._pg is not None  # start() reserved it
        waited = 0.0
        while not self._pg.wait(timeout_seconds=TURN_CHECK_S):
            waited += TURN_CHECK_S
            nodes, held = nodes_beside(trial_group)
            check_feasible(self.scaling, nodes, held=held)
            why = stuck_beside_other_groups(self.scaling, self._pg) if waited >= self.start_timeout_s else None
            if why is not None:
                raise InsufficientResourcesError(
                    f"Waited {waited:g} s for {self.world_size} worker(s) x {self.scaling.worker_resources} and they can "
                    f"never start: {why}, so every trial waits for the others. Run fewer trials at once, "
                    "tune.TuneConfig(max_concurrent_trials=...), give each trial's own process less "
                    "(tune.with_resources(fn, {'CPU': 0.1})), or reserve the workers with the trial: "
                    "trainers.tune.with_resources(fn, scaling_config)."
                )

    # -- running ------------------------------------------------------------------------------

    def execute(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> list[Any]:
        """Run ``fn(*args)`` on every worker at once; results in world-rank order."""
        return self.wait_all(self.execute_async(fn, *args), timeout_s=timeout_s)

    def execute_async(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """Start ``fn(*args)`` on every worker; ``wait_all`` collects the results."""
        return [w.actor.execute.remote(fn, *args) for w in self.workers]

    def wait_all(self, refs: list[Any], timeout_s: float | None = None) -> list[Any]:
        """The results of ``refs`` in order. Raises the first error as soon as any call fails (a
        worker that died while the others wait for it in a set-up step is not waited out), and
        ``GetTimeoutError`` after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = list(refs)
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                raise ray.exceptions.GetTimeoutError(f"{len(pending)} worker(s) did not answer within {timeout_s:g} s")
            ray.get(ready)  # raises the call's error now
        return ray.get(refs)

    def execute_single(self, rank: int, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the worker of world rank ``rank``."""
        return ray.get(self.workers[rank].actor.execute.remote(fn, *args))

    def start_training(
        self,
        train_fn: Callable[..., Any],
        config: Any,
        takes_config: bool,
        session_args: list[dict],
        context: Callable[[], Any] | None = None,
    ) -> None:
        """Start the training function on every worker (inside ``context`` when given), then listen
        for their events."""
        extra = () if context is None else (context,)
        # Only a group of its own can be reserved again away from a silent host; in a Tune trial's
        # or on TPU slices a rank waits for Ray to declare its node dead.
        unreachable_s = self.unreachable_s if self._owns_pg and self._slices is None else 0.0
        self._inbox = inbox = WorkerInbox(
            [w.actor for w in self.workers], self._died, self.driver_address(), self._unreachable, unreachable_s
        )
        ray.get(
            [
                w.actor.start.remote(train_fn, config, takes_config, args, *extra, channel=inbox.address)
                for w, args in zip(self.workers, session_args, strict=True)
            ]
        )
        inbox.listen()

    def driver_address(self) -> str:
        """Where the workers reach this process: loopback when they all run on its node, else the
        address of the Ray node it is attached to. (Not Ray's own guess of this process's
        address: on a host with no route out, Ray gives a driver the head's.)"""
        try:
            attached = ray.get_runtime_context().get_node_id()
            here = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == attached)
        except Exception:  # noqa: BLE001 - a Ray Client driver is on no node: Ray's guess is all there is
            here = ray.util.get_node_ip_address()
        return "127.0.0.1" if all(w.metadata.node_ip == here for w in self.workers) else here

    def _close_inbox(self) -> None:
        if self._inbox is not None:
            self._inbox.close()
            self._inbox = None

    def poll(self, timeout_s: float) -> list[Event]:
        """Events that arrived within ``timeout_s``; a dead worker shows up as a ``FailedEvent``."""
        return self._inbox.poll(timeout_s) if self._inbox is not None else []

    def probe(self, ranks: list[int], timeout_s: float = 2.0) -> tuple[list[FailedEvent], dict[int, str]]:
        """Ask ``ranks`` what they are doing: dead ones answer at once with an error.

        When one rank fails in a collective, the root cause is often another rank that died, or
        one still busy elsewhere (a hang): one round trip tells which.
        """
        refs = {self.workers[rank].actor.activity_and_unacknowledged.remote(): rank for rank in ranks}
        dead, activity = [], {}
        for ref, answer in _answers(list(refs), timeout_s, (RayActorError, RayTaskError)).items():
            rank = refs[ref]
            if isinstance(answer, RayError):
                dead.append(self._died(rank, answer))
                continue
            activity[rank], kept = answer
            if kept and self._inbox is not None:
                self._inbox.offer(rank, kept)  # the next poll applies what had not arrived yet
        return dead, activity

    def _died(self, rank: int, error: BaseException) -> FailedEvent:
        meta = self.workers[rank].metadata
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return FailedEvent(
            rank,
            WorkerError(f"worker process (pid {meta.pid}) on node {meta.node_ip} died: {cause}"),
            "",
            # Ray marks the death of an actor whose node was drained for preemption: that restart
            # counts against FailureConfig.max_preemption_failures, not max_failures.
            kind="preempted" if getattr(error, "preempted", False) else "died",
        )

    def _unreachable(self, ranks: list[int], silent_s: float, others_heard: bool) -> list[FailedEvent]:
        """The failures of those of ``ranks`` (silent for ``silent_s``) whose node's raylet takes
        no connection either, unless no other node's does: then this process may be the one cut off."""
        timeout_s = min(1.0, silent_s / 2)
        nodes = {rank: self.workers[rank].metadata for rank in ranks}
        cut = silent_raylets({meta.node_id for meta in nodes.values()}, timeout_s)
        lost = [rank for rank, meta in nodes.items() if meta.node_id in cut]
        if lost and not others_heard:
            others = {w.metadata.node_id for w in self.workers} - cut
            if not others or silent_raylets(others, timeout_s) == others:
                return []
        return [
            FailedEvent(
                rank,
                WorkerError(
                    f"rank {rank}'s host {nodes[rank].node_ip} was silent for {silent_s:g} s "
                    "(FLOWTRAIN_UNREACHABLE_S) and its raylet does not answer: its link is cut or the host is gone"
                ),
                "",
                kind="unreachable",
            )
            for rank in lost
        ]

    def _park(self) -> str:
        """Reset the workers and hand those that answer to ``warm_workers``; they leave ``workers``.
        Returns what became of them, in one line, with the reasons of those not parked."""
        refs = [w.actor.stop.remote() for w in self.workers]
        answers = _answers(refs, KEPT_WORKER_ANSWER_S)
        keep: list[tuple[Any, str, str]] = []
        why_not: list[str] = []
        for worker, ref in zip(list(self.workers), refs, strict=True):
            answer = answers.get(ref)  # a RayError: it died as the run ended, nothing to keep
            if isinstance(answer, StopAnswer) and answer.actor_id is not None:
                keep.append((worker.actor, worker.metadata.node_id, answer.actor_id))
                self.workers.remove(worker)
            else:
                why = answer.why_not if isinstance(answer, StopAnswer) else "it did not answer its reset"
                why_not.append(f"rank {worker.ranks.world_rank}: {why}")
        refused = warm_workers.park(self._shape, keep)
        if refused is not None or not keep:
            return "not parked: " + "; ".join(([refused] if refused is not None else []) + why_not)
        return "; ".join([f"parked {len(keep)} of {len(keep) + len(why_not)}", *why_not])

    # -- replacing failed ranks -------------------------------------------------------------------

    def stop_training(self, failed: dict[int, str], lost_hosts: frozenset[str] = frozenset()) -> dict[int, str]:
        """End the attempt but keep the processes that can train again: the ranks of ``failed``
        (world rank -> failure kind) whose process died, hung, was preempted or whose host stopped
        answering are killed (``refill`` places the last away from that host), the others are
        stopped and reset (``TrainWorker.stop``). Returns why, for each rank ``refill`` replaces.
        ``lost_hosts``: addresses of nodes that left the cluster, which the survivors cut off.

        The failed go first: a gloo collective waiting on a dead peer fails as its sockets close,
        so the survivors blocked in one can stop.
        """
        self._close_inbox()
        reasons = {"preempted": "its process was preempted", "unreachable": "its host stopped answering"}
        replaced = {
            rank: reasons.get(kind, f"its process {kind}")
            for rank, kind in failed.items()
            if kind in ("died", "hung", "preempted", "unreachable")
        }
        warm_workers.kill_actors(self.workers[rank].actor for rank in replaced)
        stopping = {
            w.actor.stop.remote(SURVIVOR_STOP_S, failed=True, lost_hosts=lost_hosts): w
            for w in self.workers
            if w.ranks.world_rank not in replaced
        }
        answers = _answers(list(stopping), SURVIVOR_STOP_S + SURVIVOR_ANSWER_S)
        for ref, worker in stopping.items():
            answer = answers.get(ref)
            if answer is None:
                why = f"it did not answer within {SURVIVOR_STOP_S + SURVIVOR_ANSWER_S:g} s"
            elif isinstance(answer, RayError):
                why = f"it died while stopping ({type(answer).__name__})"
            else:
                why = answer.why_not if answer.actor_id is None else ""
            if why:
                replaced[worker.ranks.world_rank] = why
                warm_workers.kill_actors([worker.actor])
        # The nodes of silent ranks, and of replaced ranks whose raylet is gone or cut off (one
        # that died, or did not answer its stop): Ray would place a replacement there until its
        # health checks declare the node dead.
        node = {rank: self.workers[rank].metadata.node_id for rank in replaced}
        self._avoid = {node[rank] for rank in replaced if failed.get(rank) == "unreachable"}
        if unjudged := set(node.values()) - self._avoid:
            self._avoid |= silent_raylets(unjudged, 1.0)
        self._vacant = {rank: self.workers[rank].bundle for rank in replaced}
        self.workers = [w for w in self.workers if w.ranks.world_rank not in replaced]
        return replaced

    def refill(self, timeout_s: float) -> None:
        """Start a worker for each rank ``stop_training`` let go, in the bundle its predecessor had
        (the same node while it lives; after a node loss, where Ray placed the bundle again), and
        rank the group again: with the same nodes, every rank keeps its number."""
        vacant, self._vacant = self._vacant, {}
        fresh: list[Worker] = []
        if vacant:
            deadline = time.monotonic() + timeout_s
            bundles = sorted(vacant.values())
            self._place_vacant(bundles, deadline)
            spares = [self.spares.take(self._placed[b]) if self._beside_group else None for b in bundles]
            actors = self._start_actors(
                bundles,
                [spare[0] if spare else None for spare in spares],
                [spare[1] if spare else None for spare in spares],
                wait_s=max(0.0, deadline - time.monotonic()),
            )
            fresh = self._wait_for_actors(actors, bundles, deadline)
        self._rank(self.workers + fresh)  # the kept workers' environment was reset too

    def _place_vacant(self, bundles: list[int], deadline: float) -> None:
        """Have the vacant ``bundles`` placed: those on a host that stopped answering moved away
        from it (``placement_away``: into a slot an earlier move emptied, or a reservation of
        their own), the others where Ray keeps them (after a node loss, where it places them
        again), and note where each is."""
        away = [b for b in bundles if self._placed.get(b) in self._avoid]
        if kept := [b for b in bundles if b not in away and self._moved.placement(b) is None]:
            self._wait_for_group(deadline, kept)  # a lost node's bundles are placed again first
        if away:
            assert self._pg is not None  # start() reserved it
            selectors = self.scaling.label_selector_per_worker(self.world_size)
            slots = dict(placement_group_table(self._pg).get("bundles_to_node_id") or {})
            missing = self._moved.move(
                away, self._pg, slots, self.scaling.worker_resources, self._avoid, selectors, deadline
            )
            if missing:
                raise WorkerStartError(
                    f"could not reserve {self.scaling.worker_resources} for rank(s) of bundle(s) {missing} away from "
                    f"the host(s) that stopped answering within the start timeout: no other node has room. "
                    f"Nodes now: {describe_nodes()}."
                )
        self._avoid = set()
        self._placed = dict(placement_group_table(self._pg).get("bundles_to_node_id") or {}) | self._moved.nodes()

    def release_sync(self, index: int, data: Any) -> None:
        """Let every worker past barrier ``index`` (no waiting: a dead worker fails the attempt
        through ``poll``)."""
        for worker in self.workers:
            worker.actor.release_sync.remote(index, data)

    def answer_checkpoints(self, rank: int, query_id: int, answer: Any) -> None:
        """Send rank ``rank`` the answer to its ``get_all_reported_checkpoints()`` call (no waiting)."""
        self.workers[rank].actor.answer_checkpoints.remote(query_id, answer)

    def fill_spares(self, per_node: int) -> bool:
        """Have ``per_node`` spare workers on each node the group uses (``spares``); False while
        rank 0 has not yet said which installed modules the spares should import (asked, not
        waited for: its host may be cut off, and the controller must go on hearing the others)."""
        if not self._beside_group or not self.workers:
            return True
        if not self.spares.modules:
            if self._modules_asked is None:
                self._modules_asked = self.workers[0].actor.execute.remote(installed_modules)
            if not ray.wait([self._modules_asked], timeout=0)[0]:
                return False
            asked, self._modules_asked = self._modules_asked, None
            self.spares.modules = ray.get(asked)
        nodes = sorted({w.metadata.node_id for w in self.workers})
        warm_workers.kill_actors(self.spares.fill(nodes, per_node))
        return True

    def shutdown(self, keep: bool = False) -> str | None:
        """Kill every actor and release the placement group. Safe to call twice. ``keep``: the run
        ended cleanly, so workers that can be kept are reset and parked for the next run of the
        same shape (``warm_workers``) instead; then returns whether they were, and why not."""
        self._close_inbox()  # first: the actors' deaths below are no news
        parked = None
        if keep and self.workers:
            parked = self._park() if self._beside_group else f"not parked: {self._held_in_group}"
            logger.debug("the workers after a clean end: %s", parked)
        warm_workers.kill_actors([w.actor for w in self.workers] + self.spares.clear())
        self.workers = []
        self._moved.release()
        if self._slices is not None:
            self._slices.shutdown()  # the workers' group and the slices' head reservations
        elif self._pg is not None and self._owns_pg:
            with contextlib.suppress(Exception):  # already removed, or Ray shutting down: it is gone either way
                remove_placement_group(self._pg)
        self._pg = self._slices = None
        return parked
